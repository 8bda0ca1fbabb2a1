"""Label and field selectors as the API server parses them (`labelSelector=`, `fieldSelector=`)."""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from gpumgr.sim.kubeapi.errors import bad_request

_NAME = r"[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?"
_NAME_RE = re.compile(rf"^{_NAME}$")
_PREFIX_RE = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_SET_RE = re.compile(r"^(?P<key>[^\s=!<>(),]+)\s+(?P<op>in|notin)\s*\((?P<values>[^()]*)\)$")
_CMP_RE = re.compile(r"^(?P<key>[^\s=!<>(),]+)\s*(?P<op>==|=|!=|<|>)\s*(?P<value>[^\s=!<>(),]*)$")
_EXISTS_RE = re.compile(r"^(?P<neg>!?)\s*(?P<key>[^\s=!<>(),]+)$")

FieldGetter = Callable[[dict[str, Any]], str]


def parse_label_selector(text: str | None) -> LabelSelector:
    """Parse a label selector; an empty or missing one matches everything. Bad syntax is a 400."""
    requirements: list[LabelRequirement] = []
    for term in _split_top_level(text or ""):
        requirements.append(_parse_label_term(term))
    return LabelSelector(tuple(requirements))


def parse_field_selector(text: str | None, getters: Mapping[str, FieldGetter]) -> FieldSelector:
    """Parse a field selector against the fields a resource supports (`getters`); others are a 400."""
    terms: list[FieldRequirement] = []
    for raw in _split_escaped(text or "", ","):
        if not raw.strip():
            continue
        field, op, value = _split_field_term(raw)
        if field not in getters:
            raise bad_request(f'field label not supported: {field}')
        terms.append(FieldRequirement(field, op, value, getters[field]))
    return FieldSelector(tuple(terms))


def _split_top_level(text: str) -> Iterable[str]:
    depth = 0
    start = 0
    for i, ch in enumerate(text):
        if ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
            if depth < 0:
                raise bad_request(f"unable to parse requirement: unbalanced ')' in label selector {text!r}")
        elif ch == "," and depth == 0:
            yield text[start:i].strip()
            start = i + 1
    if depth != 0:
        raise bad_request(f"unable to parse requirement: unbalanced '(' in label selector {text!r}")
    last = text[start:].strip()
    if last or start:
        yield last


def _parse_label_term(term: str) -> LabelRequirement:
    if not term:
        raise bad_request("unable to parse requirement: empty term in label selector")
    m = _SET_RE.match(term)
    if m:
        values = tuple(v.strip() for v in m["values"].split(","))
        if values == ("",):
            raise bad_request(f"unable to parse requirement: {term!r}: for 'in', 'notin' operators, "
                              "values set can't be empty")
        for v in values:
            _check_value(v, term)
        return LabelRequirement(_check_key(m["key"], term), m["op"], values)
    m = _CMP_RE.match(term)
    if m:
        op = {"==": "=", "=": "="}.get(m["op"], m["op"])
        value = m["value"]
        if op in ("<", ">") and not re.fullmatch(r"-?\d+", value):
            raise bad_request(f"unable to parse requirement: {term!r}: for 'Gt', 'Lt' operators, "
                              "the value must be an integer")
        _check_value(value, term)
        return LabelRequirement(_check_key(m["key"], term), op, (value,))
    m = _EXISTS_RE.match(term)
    if m:
        return LabelRequirement(_check_key(m["key"], term), "!" if m["neg"] else "exists", ())
    raise bad_request(f"unable to parse requirement: {term!r} is not a valid label selector term")


def _check_key(key: str, term: str) -> str:
    prefix, _, name = key.rpartition("/")
    ok = bool(_NAME_RE.match(name)) and len(name) <= 63
    if prefix or "/" in key:
        ok = ok and bool(_PREFIX_RE.match(prefix)) and len(prefix) <= 253
    if not ok:
        raise bad_request(f"unable to parse requirement: {term!r}: invalid label key {key!r}")
    return key


def _check_value(value: str, term: str) -> None:
    if value and (len(value) > 63 or not _NAME_RE.match(value)):
        raise bad_request(f"unable to parse requirement: {term!r}: invalid label value {value!r}")


def _split_escaped(text: str, sep: str) -> list[str]:
    parts: list[str] = []
    cur: list[str] = []
    i = 0
    while i < len(text):
        ch = text[i]
        if ch == "\\" and i + 1 < len(text):
            cur.append(text[i:i + 2])
            i += 2
            continue
        if ch == sep:
            parts.append("".join(cur))
            cur = []
        else:
            cur.append(ch)
        i += 1
    parts.append("".join(cur))
    return parts


def _split_field_term(raw: str) -> tuple[str, str, str]:
    i = 0
    while i < len(raw):
        ch = raw[i]
        if ch == "\\":
            i += 2
            continue
        for op in ("!=", "==", "="):
            if raw.startswith(op, i):
                field = raw[:i].strip()
                if not field:
                    break
                return field, "!=" if op == "!=" else "=", _unescape(raw[i + len(op):])
        i += 1
    raise bad_request(f"invalid selector: {raw!r}; can't understand field selector term "
                      "(expected field=value, field==value or field!=value)")


def _unescape(value: str) -> str:
    out: list[str] = []
    i = 0
    while i < len(value):
        ch = value[i]
        if ch == "\\":
            if i + 1 >= len(value) or value[i + 1] not in "\\,=":
                raise bad_request(f"invalid field selector value {value!r}: bad escape sequence")
            out.append(value[i + 1])
            i += 2
            continue
        if ch in ",=":
            raise bad_request(f"invalid field selector value {value!r}: unescaped {ch!r}")
        out.append(ch)
        i += 1
    return "".join(out)


def _labels(obj: dict[str, Any]) -> dict[str, str]:
    labels = (obj.get("metadata") or {}).get("labels") or {}
    return labels if isinstance(labels, dict) else {}


@dataclass(frozen=True)
class LabelRequirement:
    key: str
    op: str  # "=", "!=", "in", "notin", "exists", "!", "<", ">"
    values: tuple[str, ...]

    def matches(self, labels: dict[str, str]) -> bool:
        present = self.key in labels
        value = labels.get(self.key)
        if self.op == "exists":
            return present
        if self.op == "!":
            return not present
        if self.op in ("=", "in"):
            return present and value in self.values
        if self.op in ("!=", "notin"):
            return not present or value not in self.values
        if not present:
            return False
        try:
            have, want = int(str(value)), int(self.values[0])
        except ValueError:
            return False
        return have > want if self.op == ">" else have < want


@dataclass(frozen=True)
class LabelSelector:
    requirements: tuple[LabelRequirement, ...]

    def matches(self, obj: dict[str, Any]) -> bool:
        labels = _labels(obj)
        return all(r.matches(labels) for r in self.requirements)


@dataclass(frozen=True)
class FieldRequirement:
    field: str
    op: str  # "=" or "!="
    value: str
    getter: FieldGetter

    def matches(self, obj: dict[str, Any]) -> bool:
        equal = self.getter(obj) == self.value
        return equal if self.op == "=" else not equal


@dataclass(frozen=True)
class FieldSelector:
    requirements: tuple[FieldRequirement, ...]

    def matches(self, obj: dict[str, Any]) -> bool:
        return all(r.matches(obj) for r in self.requirements)


@dataclass(frozen=True)
class ObjectFilter:
    """Everything a list or watch narrows by: namespace (None = all), labels and fields."""

    namespace: str | None
    labels: LabelSelector
    fields: FieldSelector

    def matches(self, obj: dict[str, Any]) -> bool:
        if self.namespace is not None and (obj.get("metadata") or {}).get("namespace") != self.namespace:
            return False
        return self.labels.matches(obj) and self.fields.matches(obj)

