"""Limited JSON parsing and compact JSON output, shared by T1 and the session layer.

``loads_limited`` applies the seed's size limits (section 3.5) to untrusted JSON:

* **size** - the UTF-8 byte length of the text, checked before anything is parsed;
* **depth** - every JSON value has a depth: the top-level value has depth 1, and the members/elements of
  a container at depth *d* have depth *d + 1*. Only containers are measured: the document's depth is the
  deepest container's depth, or 1 for a top-level scalar. So ``1``, ``[]``, ``{"a": 1}`` and
  ``[1, "x"]`` have depth 1, ``[[1]]`` has depth 2, and with ``max_json_depth=32`` 32 nested arrays pass
  and 33 are refused;
* **strings** - the UTF-8 byte length of every string, object keys included;
* **arrays** - the element count of every array.

A violation raises :class:`~m2mwire.errors.LimitExceeded` naming the limit and the JSON path of the
offending value (``$.messages[3].content``; keys that are not identifiers are written ``$["a b"]``).
Documents nested more than ``_PRESCAN_DEPTH`` levels are refused by a pre-scan before the parser
runs (the message then gives the depth found, not a path), so hostile input such as 100,000 ``[`` never
reaches a recursive parser.
"""

from __future__ import annotations

import re
from itertools import accumulate
from typing import Any

import msgspec

from m2mwire.codecs.limits import DEFAULT_LIMITS, Limits
from m2mwire.errors import DecodeError, EncodeError, LimitExceeded

__all__ = ["check_json_limits", "dumps_compact", "json_path", "loads_limited"]

_json_decode = msgspec.json.decode
_json_encode = msgspec.json.encode

# Up to this many opening brackets the nesting cannot exceed this depth, so no pre-scan is needed;
# msgspec parses 256 levels comfortably (it raises RecursionError cleanly far beyond that, which we
# also catch). Deeper texts are measured by the pre-scan and refused before parsing.
_PRESCAN_DEPTH = 256

# A JSON string (unrolled loop: fast in `re`); removed before counting brackets.
_STRING_RE = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"', re.DOTALL)
_NOT_BRACKETS = bytes(b for b in range(256) if b not in b"[]{}")
# Bracket byte -> +1 / -1, so depth is a running sum (all in C: translate, map, accumulate, max).
_BRACKET_DELTA = tuple(1 if b in b"[{" else -1 if b in b"]}" else 0 for b in range(256))

_IDENT_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


class _Violation(Exception):
    """Internal: a limit was hit; ``path`` collects segments innermost first while unwinding."""

    def __init__(self, kind: str, limit: int, actual: int, *, key: bool = False) -> None:
        super().__init__(kind)
        self.kind = kind
        self.limit = limit
        self.actual = actual
        self.key = key
        self.path: list[str | int] = []


def json_path(segments: list[str | int]) -> str:
    """Render path segments (outermost first) as ``$.a[3]["b c"]``."""
    parts = ["$"]
    for seg in segments:
        if isinstance(seg, int):
            parts.append(f"[{seg}]")
        elif _IDENT_RE.fullmatch(seg):
            parts.append(f".{seg}")
        else:
            parts.append(f"[{_json_encode(seg).decode()}]")
    return "".join(parts)


def _utf8_len_over(s: str, limit: int) -> int:
    """UTF-8 length of ``s`` if it exceeds ``limit``, else 0. Encodes only when the length is in doubt."""
    n = len(s)
    if n * 4 <= limit:  # a code point is at most 4 UTF-8 bytes
        return 0
    size = n if s.isascii() else len(s.encode("utf-8", "surrogatepass"))
    return size if size > limit else 0


def _check(value: Any, depth: int, limits: Limits) -> None:
    """Recursive structure check of a container at ``depth``; recursion is bounded by max_json_depth."""
    if depth > limits.max_json_depth:
        raise _Violation("max_json_depth", limits.max_json_depth, depth)
    max_str = limits.max_string_bytes
    short = max_str >> 2  # a string of at most this many code points cannot exceed max_str bytes
    if type(value) is dict:
        seg: str | int = ""
        try:
            for k, v in value.items():
                if len(k) > short and (size := _utf8_len_over(k, max_str)):
                    seg = k
                    raise _Violation("max_string_bytes", max_str, size, key=True)
                tv = type(v)
                if tv is str:
                    if len(v) > short and (size := _utf8_len_over(v, max_str)):
                        seg = k
                        raise _Violation("max_string_bytes", max_str, size)
                elif tv is dict or tv is list:
                    seg = k
                    _check(v, depth + 1, limits)
        except _Violation as exc:
            exc.path.append(seg)
            raise
    else:  # list
        if len(value) > limits.max_array_elements:
            raise _Violation("max_array_elements", limits.max_array_elements, len(value))
        i = 0
        try:
            for i, v in enumerate(value):  # noqa: B007 - i is read in the handler
                tv = type(v)
                if tv is str:
                    if len(v) > short and (size := _utf8_len_over(v, max_str)):
                        raise _Violation("max_string_bytes", max_str, size)
                elif tv is dict or tv is list:
                    _check(v, depth + 1, limits)
        except _Violation as exc:
            exc.path.append(i)
            raise


def _limit_error(exc: _Violation, what: str) -> LimitExceeded:
    path = json_path(exc.path[::-1])
    if exc.kind == "max_json_depth":
        msg = f"{what} nests deeper than max_json_depth={exc.limit} at {path}"
    elif exc.kind == "max_array_elements":
        msg = f"{what} has an array of {exc.actual} elements at {path}, over max_array_elements={exc.limit}"
    else:
        where = f"an object key at {path}" if exc.key else f"a string at {path}"
        msg = f"{what} has {where} of {exc.actual} UTF-8 bytes, over max_string_bytes={exc.limit}"
    return LimitExceeded(msg, limit=exc.limit, actual=exc.actual)


def check_json_limits(obj: Any, *, limits: Limits = DEFAULT_LIMITS, what: str = "JSON") -> None:
    """Check an already-parsed JSON value against depth, string and array limits (not the total size).

    Raises :class:`LimitExceeded` naming the limit and the JSON path. ``obj`` must be JSON-model data
    (dict with str keys, list, str, int, float, bool, None).
    """
    try:
        if type(obj) is dict or type(obj) is list:
            _check(obj, 1, limits)
        elif limits.max_json_depth < 1:
            raise _Violation("max_json_depth", limits.max_json_depth, 1)
        elif type(obj) is str and (size := _utf8_len_over(obj, limits.max_string_bytes)):
            raise _Violation("max_string_bytes", limits.max_string_bytes, size)
    except _Violation as exc:
        raise _limit_error(exc, what) from None
    except RecursionError:  # only reachable with a max_json_depth near the interpreter's own limit
        raise LimitExceeded(
            f"{what} is nested too deeply to check (max_json_depth={limits.max_json_depth})",
            limit=limits.max_json_depth,
        ) from None


def _prescan_depth(data: bytes) -> int:
    """Exact nesting depth of a (valid) JSON text, computed without recursion. Strings are removed first
    so brackets inside them do not count; on malformed text the result is only an estimate, which is
    fine because the parser rejects such text anyway."""
    brackets = _STRING_RE.sub(b"", data).translate(None, _NOT_BRACKETS)
    if not brackets:
        return 0
    return max(accumulate(map(_BRACKET_DELTA.__getitem__, brackets)))


def loads_limited(text: str | bytes, *, limits: Limits = DEFAULT_LIMITS, what: str = "JSON") -> Any:
    """Parse untrusted JSON text under ``limits`` (see the module docstring for how each is measured).

    Raises :class:`DecodeError` for malformed JSON (with the parser's byte position), invalid UTF-8, lone
    surrogates, or numbers outside the float range; :class:`LimitExceeded` for a limit, with the JSON path.
    Never returns a partial result; never lets RecursionError escape.
    """
    if isinstance(text, str):
        # Characters <= UTF-8 bytes, so an over-long str is refused before it is encoded.
        if len(text) > limits.max_message_bytes:
            raise LimitExceeded(
                f"{what} is at least {len(text)} bytes, over max_message_bytes={limits.max_message_bytes}",
                limit=limits.max_message_bytes,
                actual=len(text),
            )
        try:
            data = text.encode("utf-8")
        except UnicodeEncodeError as exc:
            raise DecodeError(
                f"{what} is not valid UTF-8 (lone surrogate at character {exc.start})"
            ) from None
    elif isinstance(text, bytes | bytearray):
        data = bytes(text)
    else:
        raise DecodeError(f"{what} must be str or bytes, not {type(text).__name__}")
    if len(data) > limits.max_message_bytes:
        raise LimitExceeded(
            f"{what} is {len(data)} bytes, over max_message_bytes={limits.max_message_bytes}",
            limit=limits.max_message_bytes,
            actual=len(data),
        )
    openers = data.count(b"[") + data.count(b"{")
    if openers > _PRESCAN_DEPTH:
        depth = _prescan_depth(data)
        if depth > limits.max_json_depth and depth > _PRESCAN_DEPTH:
            raise LimitExceeded(
                f"{what} nests {depth} levels deep, over max_json_depth={limits.max_json_depth}",
                limit=limits.max_json_depth,
                actual=depth,
            )
    try:
        obj = _json_decode(data)
    except msgspec.DecodeError as exc:  # includes ValidationError ("Number out of range")
        raise DecodeError(f"{what} is not valid JSON: {exc}") from None
    except UnicodeDecodeError as exc:
        raise DecodeError(f"{what} is not valid UTF-8 (byte {exc.start})") from None
    except RecursionError:
        raise LimitExceeded(
            f"{what} is nested too deeply to parse (max_json_depth={limits.max_json_depth})",
            limit=limits.max_json_depth,
        ) from None
    # Skip the structure walk when byte counts already prove every limit holds (the usual case for chat
    # messages): nesting <= number of opening brackets, array length <= commas + 1, any string <= size.
    if not (
        openers <= limits.max_json_depth
        and len(data) <= limits.max_string_bytes
        and data.count(b",") < limits.max_array_elements
        and limits.max_json_depth >= 1
    ):
        check_json_limits(obj, limits=limits, what=what)
    return obj


def dumps_compact(obj: Any, *, sort_keys: bool = False) -> str:
    """Compact JSON: no whitespace, non-ASCII emitted raw, control characters always escaped.

    Integers stay integers (any size), floats keep a fraction or exponent (``1.0`` stays ``1.0``,
    shortest round-tripping form, e.g. ``1e-7``). ``sort_keys`` sorts object keys by code point (= UTF-8
    byte order). ``obj`` should be JSON-model data; note that msgspec writes NaN/Infinity as ``null``.
    Unencodable objects raise :class:`EncodeError`.
    """
    try:
        return _json_encode(obj, order="sorted" if sort_keys else None).decode("utf-8")
    except (TypeError, ValueError, OverflowError) as exc:
        raise EncodeError(f"cannot encode as JSON: {exc}") from None
