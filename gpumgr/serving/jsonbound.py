"""JSON from a caller, bounded in bytes, element count and depth before the document is built.

`json.loads` (in C) bounds nothing but the C stack: 3.9 MiB of `{},` are 1.3 million dicts, ~190 MiB of Python
objects and a second of CPU, from a body well under any byte limit. So every JSON body gpumgr reads from a caller
(the webhook's AdmissionReview, the extender's filter/prioritize/bind arguments) goes through `loads` here, which
first scans the raw bytes, at C speed and without building anything:

  1. each string is replaced by `0` with one regular expression (`"` ... `"` with backslash escapes): what is left are
     the structural characters, numbers and literals;
  2. the *elements* (keys, values, objects and arrays) are counted in what is left: a non-empty array of k items
     has k - 1 commas, an object of k members k - 1 commas and k colons, so `count('{') + count('[') +
     count(',') + count(':') + 1 - count('{}') - count('[]')` is the exact count for well-formed JSON, and an
     upper bound when strings are left in (the first, cheaper test);
  3. the depth is found by removing innermost `{}` / `[]` pairs, one layer per pass over the (already stripped)
     brackets, stopping after `max_depth + 1` passes.

Only a body within both bounds reaches `json.loads`. The cost of the scan is one pass of the regex engine and a
few `bytes.count` over the body: about 10 ms for a 4 MiB body on one core; the memory it takes is at most one
copy of the body. Malformed JSON is left to `json.loads` to describe (the scan never accepts what the parser
would refuse, it only refuses earlier). Why not a streaming parser library (ijson, ...): it would add a
dependency and a Python-level event per element, slower than this scan by two orders of magnitude for the
attack it exists for; the bounds here need counts, not events.

The bound on elements is what bounds memory: a decoded element costs at most ~100 bytes of Python objects
(an empty dict 64, its slot in the parent 8-40, a key string ~50), strings aside, which are bounded by the body.
"""

from __future__ import annotations

import json
import re
from typing import Any

API_OBJECT_DEPTH = 64  # nesting of a Kubernetes API object as JSON: a Pod with managedFields nests ~20 deep

_STRING = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"', re.DOTALL)
_NOT_BRACKET = re.compile(rb"[^\[\]{}]+")
_INNERMOST = re.compile(rb"\{\}|\[\]")
BYTES_PER_ELEMENT = 100  # the most a decoded element costs in Python objects (see the module doc), for budgets


class JsonBoundsError(ValueError):
    """A body that is not JSON, or is JSON beyond the bounds; the message says which and by how much."""


def loads(raw: bytes, *, max_elements: int, max_depth: int, what: str = "the body") -> Any:
    """`raw` decoded, after `check`; raises JsonBoundsError (a ValueError) naming the problem."""
    check(raw, max_elements=max_elements, max_depth=max_depth, what=what)
    try:
        return json.loads(raw)
    except RecursionError:  # cannot happen after check() with a sane max_depth; kept as a last guard
        raise JsonBoundsError(f"{what} is nested deeper than {max_depth} levels") from None
    except (ValueError, UnicodeDecodeError) as e:
        raise JsonBoundsError(f"{what} is not JSON: {e}") from None


def check(raw: bytes, *, max_elements: int, max_depth: int, what: str = "the body") -> None:
    """Refuse `raw` (JsonBoundsError) when it may hold more than `max_elements` keys, values, objects and arrays,
    or nests deeper than `max_depth` objects/arrays. Builds nothing but one stripped copy of the bytes."""
    upper = _elements(raw)  # strings included: an upper bound, enough when it is within the limit
    if upper > max_elements:
        # every string is a key or a value, and a quote not after a backslash is a string's start or end: a lower
        # bound found without the regex (whose cost is per string), so a body of a million "" costs two counts
        strings = (raw.count(b'"') - raw.count(b'\\"')) // 2
        if strings > max_elements:
            raise _too_many(what, strings, max_elements, "at least ")
    if b'"' not in raw:
        bare = raw
    elif upper > max_elements or b"[" in raw or b"{" in raw:
        bare = _STRING.sub(b"0", raw)  # a string becomes one value, not nothing: `[""]` is not `[]`
    else:
        return  # a lone string, number or literal
    if upper > max_elements:
        count = _elements(bare)
        if count > max_elements:
            raise _too_many(what, count, max_elements)
    if nesting_exceeds(bare, max_depth):
        raise JsonBoundsError(f"{what} is nested deeper than {max_depth} levels")


def _too_many(what: str, count: int, limit: int, qualifier: str = "") -> JsonBoundsError:
    return JsonBoundsError(f"{what} holds {qualifier}{count} JSON keys, values, objects and arrays; at most "
                           f"{limit} are accepted")


def nesting_exceeds(bare: bytes, max_depth: int) -> bool:
    """Whether the brackets of `bare` (JSON with its strings removed) nest deeper than `max_depth`."""
    brackets = _NOT_BRACKET.sub(b"", bare)
    for _ in range(max_depth):
        if not brackets:
            return False
        peeled = _INNERMOST.sub(b"", brackets)
        if len(peeled) == len(brackets):  # unbalanced or mismatched: json.loads says where
            return False
        brackets = peeled
    return bool(_INNERMOST.search(brackets))


def _elements(data: bytes) -> int:
    """Keys, values, objects and arrays: exact for JSON without its strings (and no blank inside `{ }`), an
    upper bound with its strings (every piece counted is one or more, or an empty pair counted 1 - 1)."""
    return (data.count(b"{") + data.count(b"[") + data.count(b",") + data.count(b":") + 1
            - data.count(b"{}") - data.count(b"[]"))
