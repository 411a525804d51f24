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

A violation raises :class:`~m2mwire.errors.LimitExceeded` naming the limit and, for texts up to
``_WALK_BELOW`` bytes, the JSON path of the offending value (``$.messages[3].content``; keys that
are not identifiers are written ``$["a b"]``).

The limits are enforced **before** the parser materialises anything (issue 11.9: a 16 MiB array of
5.6 M empty objects used to be parsed, +447 MB and 2.9 s, and only then refused). Byte counts settle
the usual case at once (nesting <= opening brackets, elements <= commas + 1, a string <= the text);
texts up to ``_WALK_BELOW`` bytes are parsed and walked (cheap at that size); otherwise :func:`_scan`
measures the exact depth and every array's length from the bytes (numpy, in slices: a few bytes of
memory per byte of text) and refuses the text unparsed. Only a large text whose strings add up to
more than ``max_string_bytes`` is walked after parsing, for its string lengths (its strings are then
most of it, so the walk is short). A small text nested deeper than the parser can recurse (~1,000
levels) is refused as too deep: its RecursionError is caught. :func:`check_json_text` is that whole
check without the parse: the session's sender runs it on what it is about to send, so both ends
enforce one set of rules.

:func:`json_cost` estimates what a parsed value holds in memory, so that queued messages can be
accounted by their decoded cost.
"""

from __future__ import annotations

import re
from typing import Any, NamedTuple, TypeAlias

import msgspec

from m2mwire.codecs.limits import DEFAULT_LIMITS, Limits
from m2mwire.codecs.utf8 import utf8_len
from m2mwire.errors import DecodeError, EncodeError, LimitExceeded

__all__ = ["JsonValue", "check_json_limits", "dumps_compact", "json_path", "loads_limited"]

# What a JSON document parses to (msgspec and the json module alike). A received message's
# ``value`` has this type, so a type checker makes the user narrow it (``isinstance(v, dict)``)
# before indexing: a peer may send any JSON, and ``Any`` would hide that until run time.
JsonValue: TypeAlias = "dict[str, JsonValue] | list[JsonValue] | str | int | float | bool | None"

_json_decode = msgspec.json.decode
_json_encode = msgspec.json.encode

# Texts up to this size are parsed, then walked (which names the JSON path of a violation): their
# parse costs at most ~24x this (1.5 MiB), less than the byte scan's fixed numpy overhead in time.
_WALK_BELOW = 64 * 1024
# The scan works on slices of this many bytes, so its temporaries stay small whatever the text.
_SCAN_CHUNK = 1 << 20

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
    size = utf8_len(s)
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


def json_cost(data: bytes) -> int:
    """Estimated bytes that the parsed value of the JSON text ``data`` holds in memory (upper bound).

    From byte counts alone (bytes inside strings count too, which only over-estimates): CPython holds
    up to 184 bytes per small dict, 64 per list (56 + a pointer in its parent), 40 per comma (a
    pointer and a number), and per string 57 on top of its characters (up to 4 bytes each) plus 40
    for the object slot that a key string implies. For every shape measured the estimate is 1.2-5x
    the real cost: 3x for ``[{},{},...]`` (24 bytes held per text byte, the worst ratio), 1.4x for
    objects with one key each, 1.3x for the sample chat corpus (mostly non-ASCII).
    """
    return _cost(data, data.count(b"{"), data.count(b"["), data.count(b","))


def _cost(data: bytes, braces: int, brackets: int, commas: int) -> int:
    # A str stores every character in 1, 2 or 4 bytes, the widest one deciding: one emoji in ASCII
    # text quadruples it. ASCII JSON text is held at most once over, any other up to 4 times.
    return (
        len(data) * (1 if data.isascii() else 4)
        + 184 * braces
        + 64 * brackets
        + 40 * commas
        + 97 * (data.count(b'"') >> 1)
    )


class ParsedJSON(NamedTuple):
    """A parsed JSON text and its decoded cost (:func:`json_cost`)."""

    value: Any
    cost: int


# bytes.translate tables (C speed): structural byte -> 1 else 0; bracket -> +1/-1 as int8; opener or
# comma -> 1 (the tokens of an array "row", see _scan).
_STRUCTURAL = bytes(1 if b in b"[]{}," else 0 for b in range(256))
_NOT_STRUCTURAL = bytes(b for b in range(256) if b not in b"[]{},")
_DELTA = bytes(1 if b in b"[{" else 255 if b in b"]}" else 0 for b in range(256))
_ROW = bytes(1 if b in b"[{," else 0 for b in range(256))


def _scan(data: bytes, limits: Limits, what: str) -> int:
    """Exact nesting depth and array lengths of a JSON text, measured without parsing it.

    Returns the number of bytes inside strings (an upper bound of any one string's UTF-8 size); raises
    :class:`LimitExceeded` for a depth or an array over the limits and :class:`DecodeError` for a
    bracket that closes more than was opened. Exact for valid JSON; for invalid JSON any verdict
    will do, as the parser refuses such text anyway.

    Strings: escape pairs are blanked with two ``bytes.replace`` calls, ``\\`` first (left to right,
    so a run of backslashes pairs up exactly as a JSON reader pairs it; a lone one left escapes the
    next byte), after which every quote is real and a running XOR of quote bits marks the bytes inside
    strings. The structural bytes outside strings (``[]{},``) give the depth as a running sum. An
    array's elements are the commas at its own level, +1: on each level holding enough commas, that
    level's openers and commas read like ``[,,,{,[,,`` and a regex looks for ``[`` followed by
    ``max_array_elements`` commas. Work is in 1 MiB slices; memory is a few bytes per structural byte.
    """
    import numpy as np  # imported here: only large or bracket-heavy texts are scanned

    text = data.replace(b"\\\\", b"__").replace(b'\\"', b"__") if b"\\" in data else data
    tokens = bytearray()  # grown in place: no list of slices joined at the end (half the peak)
    carry = 0
    inside_total = 0
    for start in range(0, len(text), _SCAN_CHUNK):
        piece = text[start : start + _SCAN_CHUNK]
        if not carry and b'"' not in piece:
            tokens += piece.translate(None, _NOT_STRUCTURAL)
            continue
        inside = np.bitwise_xor.accumulate(np.frombuffer(piece, dtype=np.uint8) == 0x22)
        if carry:  # a string that spans slices
            np.logical_not(inside, out=inside)
        carry = int(inside[-1])
        inside_total += int(np.count_nonzero(inside))
        keep = np.frombuffer(piece.translate(_STRUCTURAL), dtype=np.bool_) & ~inside
        tokens += np.frombuffer(piece, dtype=np.uint8)[keep].data
    small = limits.max_json_depth < 126
    level = np.empty(len(tokens), dtype=np.int8 if small else np.int32)
    depth = top = 0
    for start in range(0, len(tokens), _SCAN_CHUNK):
        step = np.frombuffer(tokens[start : start + _SCAN_CHUNK].translate(_DELTA), dtype=np.int8)
        d = np.cumsum(step, dtype=np.int32)  # int32: numpy's int8 -> int64 accumulation is 30x slower
        d += depth
        depth = int(d[-1])
        top = max(top, int(d.max()))
        if int(d.min()) < 0:
            raise DecodeError(f"{what} is not valid JSON: a bracket closes more than was opened")
        if top > limits.max_json_depth:
            raise LimitExceeded(
                f"{what} nests at least {top} levels deep, over max_json_depth={limits.max_json_depth}",
                limit=limits.max_json_depth,
                actual=top,
            )
        # An opener's level is the depth after it, a comma's the depth it is at, a closer's the depth
        # before it: each container's opener, commas and closer share one level.
        d -= step >> 1  # -1 for a closer (arithmetic shift), 0 otherwise
        level[start : start + _SCAN_CHUNK] = d
    n = limits.max_array_elements
    t = np.frombuffer(tokens, dtype=np.uint8)
    per_level = np.zeros(top + 2, dtype=np.int64)  # commas per level, counted in slices (bincount
    for start in range(0, len(t), _SCAN_CHUNK):  # widens its input to 8 bytes per element)
        at = level[start : start + _SCAN_CHUNK][t[start : start + _SCAN_CHUNK] == 0x2C]
        per_level += np.bincount(at.view(np.uint8) if small else at, minlength=top + 2)[: top + 2]
    crowded = np.flatnonzero(per_level >= n)
    long_array = re.compile(b"\\[,{%d}" % n)
    for lvl in crowded:
        row = bytearray()  # this level's openers and commas, in order, gathered in slices
        for start in range(0, len(t), _SCAN_CHUNK):
            mask = np.frombuffer(tokens[start : start + _SCAN_CHUNK].translate(_ROW), dtype=np.bool_)
            mask &= level[start : start + _SCAN_CHUNK] == lvl
            row += t[start : start + _SCAN_CHUNK][mask].data
        if long_array.search(row):
            raise LimitExceeded(
                f"{what} has an array of more than {n} elements (at depth {int(lvl)}), "
                f"over max_array_elements={n}",
                limit=n,
                actual=n + 1,
            )
    return inside_total


def _size_of(text: str | bytes, limits: Limits, what: str) -> bytes:
    """The UTF-8 bytes of ``text``, refused when over ``max_message_bytes`` (a long str before encoding)."""
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
    return data


def _parse(data: bytes, limits: Limits, what: str) -> Any:
    try:
        return _json_decode(data)
    except msgspec.DecodeError as exc:  # includes ValidationError ("Number out of range")
        raise DecodeError(f"{what} is not valid JSON: {exc}") from None
    except UnicodeDecodeError as exc:
        raise DecodeError(f"{what} is not valid UTF-8 (byte {exc.start})") from None
    except RecursionError:
        raise LimitExceeded(
            f"{what} is nested too deeply to parse (max_json_depth={limits.max_json_depth})",
            limit=limits.max_json_depth,
        ) from None


def _check_bytes(data: bytes, limits: Limits, what: str) -> tuple[bool, int, int, int]:
    """Depth and array limits of a JSON text, before parsing. Returns whether the parsed value still
    needs the structure walk (for its string lengths, a small text, or tiny limits), and the counts
    of ``{``, ``[`` and ``,`` (for :func:`_cost`)."""
    braces = data.count(b"{")
    brackets = data.count(b"[")
    commas = data.count(b",")
    if limits.max_json_depth < 1 or limits.max_array_elements < 1:
        walk = True  # limits that refuse even [] or a scalar: left to the walk
    elif braces + brackets <= limits.max_json_depth and commas < limits.max_array_elements:
        # Byte counts prove the common case: nesting <= openers, any array <= commas + 1 elements,
        # any string <= the text (escapes only shrink a string).
        walk = len(data) > limits.max_string_bytes
    elif len(data) <= _WALK_BELOW:
        walk = True  # small: parsing it costs little, and the walk names the JSON path
    else:
        walk = _scan(data, limits, what) > limits.max_string_bytes
    return walk, braces, brackets, commas


def check_json_text(text: str | bytes, *, limits: Limits = DEFAULT_LIMITS, what: str = "JSON") -> int:
    """Check a JSON text against every limit (size, depth, arrays, strings) without keeping a parse.

    The one check both ends of a session apply: the receiver through :func:`parse_json`, the sender
    on what it is about to send. Returns the decoded cost (:func:`json_cost`). The text must be valid
    JSON (what :func:`dumps_compact` writes); its string lengths are measured by parsing only when
    its strings add up to more than ``max_string_bytes``.
    """
    data = _size_of(text, limits, what)
    walk, braces, brackets, commas = _check_bytes(data, limits, what)
    if walk:
        check_json_limits(_parse(data, limits, what), limits=limits, what=what)
    return _cost(data, braces, brackets, commas)


def _load(text: str | bytes, limits: Limits, what: str) -> tuple[Any, bytes, int, int, int]:
    """Check, parse and (when needed) walk: the value, its text as bytes and the byte counts."""
    data = _size_of(text, limits, what)
    walk, braces, brackets, commas = _check_bytes(data, limits, what)
    obj = _parse(data, limits, what)
    if walk:
        check_json_limits(obj, limits=limits, what=what)
    return obj, data, braces, brackets, commas


def parse_json(text: str | bytes, *, limits: Limits = DEFAULT_LIMITS, what: str = "JSON") -> ParsedJSON:
    """:func:`loads_limited`, also returning the decoded cost of the value (:func:`json_cost`)."""
    obj, data, braces, brackets, commas = _load(text, limits, what)
    return ParsedJSON(obj, _cost(data, braces, brackets, commas))


def loads_limited(text: str | bytes, *, limits: Limits = DEFAULT_LIMITS, what: str = "JSON") -> Any:
    """Parse untrusted JSON text under ``limits`` (see the module docstring for how each is measured).

    Raises :class:`DecodeError` for malformed JSON (with the parser's byte position), invalid UTF-8, lone
    surrogates, or numbers outside the float range; :class:`LimitExceeded` for a limit. Never returns a
    partial result; never lets RecursionError escape; refuses depth and array violations before parsing.
    """
    return _load(text, limits, what)[0]


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
    except RecursionError:  # msgspec recurses per level and gives up near the interpreter's limit
        raise EncodeError(
            "cannot encode as JSON: the value is circular (contains itself) or nested too deeply"
        ) from None
