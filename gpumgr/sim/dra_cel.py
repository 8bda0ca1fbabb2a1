"""CEL device selectors as kube-scheduler evaluates them, with a real CEL implementation (cel-python).

The `device` variable: `driver` (string), `attributes` and `capacity` (maps of domain -> map of name -> value),
`allowMultipleAllocations` (bool). Unqualified names live in the driver's domain; a qualified name
(`resource.kubernetes.io/pcieRoot`) in its own. Attribute values are int, bool or string (versions as strings);
capacities are integers (bytes, cores). The Kubernetes `quantity()` function and its `compareTo`,
`isGreaterThan`, `isLessThan`, `asInteger` methods are provided over those integers.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Mapping
from typing import Any

import celpy
from celpy import celtypes

from gpumgr.requests.quantity import QuantityError, parse_int

MAX_EXPRESSION = 10 * 1024  # bytes: the API's limit on one selector expression (CELSelectorExpressionMaxLength)
MAX_PROGRAMS = 256  # compiled selectors kept
_SHOWN = 200  # characters of an expression quoted in an error


class CelError(ValueError):
    """A selector that does not compile or does not evaluate to a bool."""


def _quantity(text: Any) -> celtypes.IntType:
    try:
        return celtypes.IntType(parse_int(str(text)))
    except QuantityError as e:
        raise ValueError(str(e)) from None


def _compare(a: Any, b: Any) -> celtypes.IntType:
    return celtypes.IntType((int(a) > int(b)) - (int(a) < int(b)))


_FUNCTIONS: Mapping[str, Any] = {
    "quantity": _quantity,
    "compareTo": _compare,
    "isGreaterThan": lambda a, b: celtypes.BoolType(int(a) > int(b)),
    "isLessThan": lambda a, b: celtypes.BoolType(int(a) < int(b)),
    "asInteger": lambda a: celtypes.IntType(int(a)),
}


class SelectorCache:
    """Compiled selectors by text (compiling is the slow part), the `max_programs` most recently used: a stream of
    distinct expressions costs compile time, never unbounded memory."""

    def __init__(self, max_programs: int = MAX_PROGRAMS) -> None:
        if max_programs < 1:
            raise ValueError(f"max_programs {max_programs}: must be at least 1")
        self._env = celpy.Environment()
        self._max = max_programs
        self._programs: OrderedDict[str, Any] = OrderedDict()

    def __len__(self) -> int:
        return len(self._programs)

    def program(self, expression: str) -> Any:
        if not isinstance(expression, str):
            raise CelError(f"CEL expression must be a string, not {type(expression).__name__}")
        size = len(expression.encode("utf-8", "surrogatepass"))
        if size > MAX_EXPRESSION:
            raise CelError(f"CEL expression of {size} bytes is longer than the limit of {MAX_EXPRESSION} bytes")
        prog = self._programs.get(expression)
        if prog is not None:
            self._programs.move_to_end(expression)
            return prog
        try:
            prog = self._env.program(self._env.compile(expression), functions=dict(_FUNCTIONS))
        except celpy.CELParseError as e:
            raise CelError(f"CEL expression {expression[:_SHOWN]!r} does not compile: {e}") from None
        self._programs[expression] = prog
        while len(self._programs) > self._max:
            self._programs.popitem(last=False)
        return prog

    def matches(self, expression: str, device: Mapping[str, Any]) -> bool:
        prog = self.program(expression)
        try:
            result = prog.evaluate({"device": device})
        except Exception as e:  # noqa: BLE001 - celpy raises several types
            raise CelError(f"CEL expression {expression[:_SHOWN]!r} failed: {e}") from None
        if isinstance(result, celpy.CELEvalError):
            why = result.args[0] if result.args else result
            raise CelError(f"CEL expression {expression[:_SHOWN]!r} failed: {why}")
        if not isinstance(result, celtypes.BoolType | bool):
            raise CelError(f"CEL expression {expression[:_SHOWN]!r} gave {type(result).__name__}, not a bool")
        return bool(result)


def device_activation(driver: str, device: Mapping[str, Any]) -> celtypes.MapType:
    """The `device` variable for one ResourceSlice device (API JSON)."""
    attrs: dict[str, dict[str, Any]] = {}
    for name, value in (device.get("attributes") or {}).items():
        domain, short = _split(driver, name)
        attrs.setdefault(domain, {})[short] = _attr(value)
    caps: dict[str, dict[str, Any]] = {}
    for name, cap in (device.get("capacity") or {}).items():
        domain, short = _split(driver, name)
        caps.setdefault(domain, {})[short] = celtypes.IntType(parse_int((cap or {}).get("value", 0)))
    return celtypes.MapType({
        celtypes.StringType("driver"): celtypes.StringType(driver),
        celtypes.StringType("attributes"): _map({d: _map(v) for d, v in attrs.items()}),
        celtypes.StringType("capacity"): _map({d: _map(v) for d, v in caps.items()}),
        celtypes.StringType("allowMultipleAllocations"): celtypes.BoolType(
            bool(device.get("allowMultipleAllocations"))),
    })


def _split(driver: str, name: str) -> tuple[str, str]:
    if "/" in name:
        domain, _, short = name.partition("/")
        return domain, short
    return driver, name


def _attr(value: Mapping[str, Any]) -> Any:
    if "int" in value:
        return celtypes.IntType(int(value["int"]))
    if "bool" in value:
        return celtypes.BoolType(bool(value["bool"]))
    if "version" in value:
        return celtypes.StringType(str(value["version"]))
    return celtypes.StringType(str(value.get("string", "")))


def _map(d: Mapping[str, Any]) -> celtypes.MapType:
    return celtypes.MapType({celtypes.StringType(k): v for k, v in d.items()})
