"""The API server's semantic checks of a ResourceSlice device's consumable capacity (`resource.k8s.io/v1`
`capacity.<name>.requestPolicy`), answered with 422 Invalid as the real server does:

- `value` is a quantity;
- `validRange`: `min` is required; `min <= value`; with `max`: `min <= max <= value`; with `step`: `step > 0`,
  `min + step <= value`, and (with `max`) `(max - min) % step == 0`; `default` is required, lies in
  `[min, max]` and, with `step`, `(default - min) % step == 0`;
- `validValues`: at most 10, ascending, each `<= value`, and `default` is one of them;
- not both `validRange` and `validValues`; a `requestPolicy` only on a device with `allowMultipleAllocations`.
"""

from __future__ import annotations

from fractions import Fraction
from typing import Any

from gpumgr.requests.quantity import QuantityError, parse
from gpumgr.sim.kubeapi.errors import invalid

MAX_VALID_VALUES = 10


def check_device_capacity(plural: str, name: str, path: str, capacity: Any, shared: bool) -> None:
    """`path`: the device's field path (`spec.devices[0]`) for the message; `shared`: the device's
    `allowMultipleAllocations` (a requestPolicy needs it)."""
    if capacity is None:
        return
    if not isinstance(capacity, dict):
        raise invalid(plural, name, f"{path}.capacity: Invalid value: must be an object")
    for cname, cap in capacity.items():
        where = f"{path}.capacity[{cname}]"
        if not isinstance(cap, dict):
            raise invalid(plural, name, f"{where}: Invalid value: must be an object")
        value = _quantity(plural, name, f"{where}.value", cap.get("value"))
        policy = cap.get("requestPolicy")
        if policy is not None and not shared:
            raise invalid(plural, name, f"{where}.requestPolicy: Forbidden: only for a device with "
                          "allowMultipleAllocations: true")
        if policy is not None:
            _check_policy(plural, name, f"{where}.requestPolicy", policy, value)


def _check_policy(plural: str, name: str, where: str, policy: Any, value: Fraction) -> None:
    def fail(field: str, text: str) -> None:
        raise invalid(plural, name, f"{where}.{field}: Invalid value: {text}")

    if not isinstance(policy, dict):
        fail("", "must be an object")
    rng, values = policy.get("validRange"), policy.get("validValues")
    if rng is not None and values is not None:
        fail("validRange", "must not be set together with validValues")
    default = policy.get("default")
    if rng is not None:
        if not isinstance(rng, dict) or rng.get("min") is None:
            fail("validRange.min", "Required value")
        low = _quantity(plural, name, f"{where}.validRange.min", rng["min"])
        high = _quantity(plural, name, f"{where}.validRange.max", rng["max"]) if rng.get("max") is not None else None
        step = _quantity(plural, name, f"{where}.validRange.step", rng["step"]) if rng.get("step") is not None \
            else None
        if low > value:
            fail("validRange.min", f"{rng['min']}: must be less than or equal to the capacity value")
        if high is not None and (high < low or high > value):
            fail("validRange.max", f"{rng['max']}: must be between min and the capacity value")
        if step is not None:
            if step <= 0:
                fail("validRange.step", f"{rng['step']}: must be positive")
            if low + step > value:
                fail("validRange.step", f"{rng['step']}: min + step must be less than or equal to the capacity "
                     "value")
            if high is not None and (high - low) % step:
                fail("validRange.max", f"{rng['max']}: max - min must be a multiple of step {rng['step']}")
        if default is None:
            fail("default", "Required value: when validRange is set")
        dflt = _quantity(plural, name, f"{where}.default", default)
        if dflt < low or (high is not None and dflt > high):
            fail("default", f"{default}: must be within validRange")
        if step is not None and (dflt - low) % step:
            fail("default", f"{default}: default - min must be a multiple of step {rng['step']}")
    if values is not None:
        if not isinstance(values, list) or not values or len(values) > MAX_VALID_VALUES:
            fail("validValues", f"must be a list of 1 to {MAX_VALID_VALUES} quantities")
        parsed = [_quantity(plural, name, f"{where}.validValues[{i}]", v) for i, v in enumerate(values)]
        if any(b <= a for a, b in zip(parsed, parsed[1:], strict=False)):
            fail("validValues", "must be sorted in ascending order without duplicates")
        if parsed[-1] > value:
            fail("validValues", f"{values[-1]}: must be less than or equal to the capacity value")
        if default is None or _quantity(plural, name, f"{where}.default", default) not in parsed:
            fail("default", f"{default}: must be one of validValues")


def _quantity(plural: str, name: str, field: str, text: Any) -> Fraction:
    if text is None:
        raise invalid(plural, name, f"{field}: Required value")
    try:
        return parse(text)
    except QuantityError as e:
        raise invalid(plural, name, f"{field}: Invalid value: {e}") from None
