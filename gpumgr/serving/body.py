"""Reading a request body within bounds: size (after decompression), encoding, time, and a shared budget.

Shared by the HTTP servers of gpumgr (the scheduler extender and the admission webhook); every request body is
read here, never with `request.read()`:
  - a `Content-Length` over the limit is refused (413) before a byte of the body is read;
  - `Content-Encoding: gzip` / `deflate` bodies are inflated chunk by chunk with an output cap, and refused
    (413) as soon as the expansion passes the limit — a gzip bomb is never expanded beyond it;
  - the whole body must arrive within `body_timeout` seconds (408, and the connection is closed);
  - the bytes of all bodies being read at once share one budget (`BodyBudget`); when it is spent, a new body is
    refused at once (503) instead of growing memory with the number of callers;
  - a caller that goes away mid-upload ends the request with one log line (`ClientGone`), no traceback.

`Limits` also holds the server's connection settings, and refuses values outside the bounds below: a limit set
too high would quietly switch off the protection it exists for.
"""

from __future__ import annotations

import asyncio
import zlib
from dataclasses import dataclass
from typing import TYPE_CHECKING

from gpumgr.serving.jsonbound import BYTES_PER_ELEMENT

if TYPE_CHECKING:
    from aiohttp import web

DEFAULT_MAX_BODY = 1024 * 1024  # 5,000 node names (~150 KB) plus a large pod, with room to spare
DEFAULT_HEADER_TIMEOUT = 15.0  # seconds for a request's headers (and for an idle kept-alive connection)
DEFAULT_BODY_TIMEOUT = 10.0  # seconds for a request's whole body (and for the caller to take the answer)
DEFAULT_MAX_CONNECTIONS = 128  # open connections at once; more are answered 503 and closed
BUDGET_BODIES = 16  # the bodies in flight at once may add up to at most this many times the body limit
# With the container's memory limit known (`memory_limit_bytes`, from the chart's resources.limits.memory), the
# bodies in flight plus the one body being decoded must fit in this share of it; the rest is the process's own:
# the extender's view of 5,000 nodes peaks at ~310 MiB of the chart's 512 MiB, the webhook idles at ~40 MiB of
# its 128 MiB (docs/extender.md, "Request bodies and memory").
BODY_SHARE = 0.375
# A body may hold one JSON key, value, object or array per this many bytes (gpumgr.serving.jsonbound): NodeNames are ~30
# bytes a name, a whole Node (nodeCacheCapable: false) ~25 bytes an element; decoded, at most ~6x the body's bytes.
JSON_BYTES_PER_ELEMENT = 24

# The bounds of the settings (the flags of `gpumgr extender` and `gpumgr webhook` check them first, by name).
MIN_BODY_BYTES = 1024  # an extender call with a few node names, or a small AdmissionReview
# 5,000 whole Node objects (nodeCacheCapable: false, 5-10 KB each) are ~50 MB; above that a body is no scheduler's.
# The budget (16 bodies) is then at most 1 GiB. The chart's schema has the same maximum for extender.maxBodyBytes.
MAX_BODY_BYTES = 64 * 1024 * 1024
# Seconds. kube-scheduler gives an extender call 30 s by default and the API server a webhook call at most 30 s;
# a header or body timeout above 10 min protects nothing (a slow client holds its connection and buffers that long).
MAX_TIMEOUT = 600.0
# Each open connection holds a file descriptor and aiohttp's buffers. A scheduler keeps a few connections open and
# the API server some dozens; a cap above the process's descriptor limit would never act (accept fails first).
MAX_CONNECTIONS = 10_000


class BodyError(Exception):
    """A body the server will not read: answered with `status` and a JSON `Error`."""

    def __init__(self, status: int, message: str, close: bool = False):
        super().__init__(message)
        self.status = status
        self.close = close  # the connection cannot be reused (part of the body is still unread)


class ClientGone(Exception):
    """The caller closed the connection before the whole body arrived."""


class BodyBudget:
    """Bytes of request bodies in memory at once, across all connections."""

    def __init__(self, total: int):
        self.total = total
        self.used = 0

    def take(self, n: int) -> bool:
        if self.used + n > self.total:
            return False
        self.used += n
        return True

    def give(self, n: int) -> None:
        self.used = max(0, self.used - n)


async def read_body(request: web.Request, limits: Limits, budget: BodyBudget, *,
                    service: str = "gpumgr extender", limit_flag: str = "--max-body-bytes") -> bytes:
    """The request's body, decompressed, at most `limits.max_body_bytes`; raises BodyError or ClientGone.
    `service` and `limit_flag` name the server and the flag that sets the limit in the messages."""
    limit = limits.max_body_bytes
    length = request.content_length
    if length is not None and length > limit:
        raise BodyError(413, f"the body is larger than the limit of {limit} bytes (Content-Length {length})"
                        f"{'; the limit is ' + limit_flag if limit_flag else ''}", close=True)
    inflater = _inflater(request.headers.get("Content-Encoding", ""))
    reserve = limit if inflater is not None or length is None else length
    if not budget.take(reserve):
        raise BodyError(503, f"the {service} is reading too many request bodies at once; try again",
                        close=True)
    try:
        return await _read(request, limit, limits.body_timeout, inflater)
    finally:
        budget.give(reserve)


async def _read(request: web.Request, limit: int, timeout: float, inflater: zlib._Decompress | None) -> bytes:
    out = bytearray()
    raw = 0
    try:
        async with asyncio.timeout(timeout):
            async for chunk in request.content.iter_any():
                raw += len(chunk)
                if raw > limit:
                    raise BodyError(413, f"the body is larger than the limit of {limit} bytes", close=True)
                if inflater is None:
                    out += chunk
                    continue
                out += _inflate(inflater, chunk, limit - len(out), limit)
    except TimeoutError:
        raise BodyError(408, f"the body did not arrive within {timeout:g} s (received {raw} bytes)",
                        close=True) from None
    except (ConnectionError, OSError) as e:
        raise ClientGone(f"the caller went away after {raw} bytes of the body ({type(e).__name__})") from None
    except BodyError:
        raise
    except Exception as e:  # noqa: BLE001 - aiohttp's payload errors (truncated chunked body, ...)
        if request.transport is None or request.transport.is_closing():
            raise ClientGone(f"the caller went away after {raw} bytes of the body ({type(e).__name__})") from None
        raise BodyError(400, f"the body could not be read: {e}", close=True) from None
    if inflater is not None and not inflater.eof:
        raise BodyError(400, "the compressed body is truncated")
    if inflater is not None and inflater.unused_data:
        raise BodyError(400, "the compressed body has data after its end")
    return bytes(out)


def _inflate(inflater: zlib._Decompress, chunk: bytes, room: int, limit: int) -> bytes:
    """Inflate `chunk`, refusing as soon as the output would pass `room` bytes (never expanding past it)."""
    try:
        data = inflater.decompress(chunk, room + 1)
    except zlib.error as e:
        raise BodyError(400, f"the compressed body is not valid: {e}", close=True) from None
    if len(data) > room or inflater.unconsumed_tail:
        raise BodyError(413, f"the body expands beyond the limit of {limit} bytes when decompressed", close=True)
    return data


def _inflater(encoding: str) -> zlib._Decompress | None:
    enc = encoding.strip().lower()
    if enc in ("", "identity"):
        return None
    if enc in ("gzip", "x-gzip"):
        return zlib.decompressobj(16 + zlib.MAX_WBITS)
    if enc == "deflate":
        return zlib.decompressobj(32 + zlib.MAX_WBITS)  # zlib or gzip header, detected
    raise BodyError(415, f"Content-Encoding {encoding!r} is not supported (use gzip, deflate or none)",
                    close=True)


@dataclass(frozen=True)
class Limits:
    max_body_bytes: int = DEFAULT_MAX_BODY  # per request, after decompression
    header_timeout: float = DEFAULT_HEADER_TIMEOUT  # also the idle timeout of a kept-alive connection
    body_timeout: float = DEFAULT_BODY_TIMEOUT
    max_connections: int = DEFAULT_MAX_CONNECTIONS
    memory_limit_bytes: int = 0  # the container's memory limit (--memory-limit-bytes); 0: not known
    json_bytes_per_element: int = JSON_BYTES_PER_ELEMENT

    def __post_init__(self) -> None:
        if not MIN_BODY_BYTES <= self.max_body_bytes <= MAX_BODY_BYTES:
            raise ValueError(f"max_body_bytes {self.max_body_bytes}: from {MIN_BODY_BYTES} to {MAX_BODY_BYTES}")
        if not all(0 < t <= MAX_TIMEOUT for t in (self.header_timeout, self.body_timeout)):  # nan and inf too
            raise ValueError(f"timeouts must be positive and finite, at most {MAX_TIMEOUT:g} s")
        if not 1 <= self.max_connections <= MAX_CONNECTIONS:
            raise ValueError(f"max_connections {self.max_connections}: from 1 to {MAX_CONNECTIONS}")
        if not 1 <= self.json_bytes_per_element <= 1024:
            raise ValueError(f"json_bytes_per_element {self.json_bytes_per_element}: from 1 to 1024")
        if self.memory_limit_bytes < 0:
            raise ValueError(f"memory_limit_bytes {self.memory_limit_bytes} must not be negative")
        if self.memory_limit_bytes and self.budget_bytes < self.max_body_bytes:
            raise BodyBudgetError(
                f"a body of {self.max_body_bytes} bytes cannot be read within the memory limit of "
                f"{self.memory_limit_bytes} bytes: a body being decoded takes up to "
                f"{self.decode_peak_bytes / self.max_body_bytes:.1f} times its size, and bodies must fit in "
                f"{BODY_SHARE:.1%} of the limit; lower the body limit to at most {self.largest_body()} bytes or "
                "raise the memory limit")

    @property
    def max_json_elements(self) -> int:
        """JSON keys, values, objects and arrays one body may hold (gpumgr.serving.jsonbound)."""
        return max(1024, self.max_body_bytes // self.json_bytes_per_element)

    @property
    def decode_peak_bytes(self) -> int:
        """The most one body takes while it is decoded: its bytes twice (read buffer and the copy handed on)
        plus its Python objects (gpumgr.serving.jsonbound.BYTES_PER_ELEMENT each)."""
        return 2 * self.max_body_bytes + self.max_json_elements * BYTES_PER_ELEMENT

    @property
    def budget_bytes(self) -> int:
        """Bytes of bodies in flight at once: BUDGET_BODIES bodies, and with a memory limit no more than its
        BODY_SHARE less the peak of the one body being decoded (decoding runs one body at a time)."""
        cap = BUDGET_BODIES * self.max_body_bytes
        if not self.memory_limit_bytes:
            return cap
        return max(0, min(cap, int(self.memory_limit_bytes * BODY_SHARE) - self.decode_peak_bytes))

    def largest_body(self) -> int:
        """The largest body limit the memory limit admits (one body in flight while another is decoded)."""
        per_byte = 3 + BYTES_PER_ELEMENT / self.json_bytes_per_element
        return int(self.memory_limit_bytes * BODY_SHARE / per_byte)


class BodyBudgetError(ValueError):
    """The body limit and the memory limit do not fit together; the message says what to change."""
