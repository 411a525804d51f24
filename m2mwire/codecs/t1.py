"""Token T1 (``#T1|``): semantic abbreviation of chat-API JSON (seed section 5.3).

Wire: ``#T1|`` + compact JSON. Two dialects (tables in :mod:`m2mwire.codecs.t1_tables`, full rules and
proofs in ``docs/T1.md``):

* **seed** (what :func:`encode_t1` sends by default) - the seed's tables, made lossless:

  - keys are abbreviated at every depth; the seed's three colliding abbreviations (``m``, ``tc``, ``n``)
    are resolved by the value's JSON type and, for nulls/booleans, by whether the object is the root;
  - ``role`` / ``finish_reason`` / ``model`` string values (also inside arrays under those keys) are
    abbreviated through their tables;
  - a key or value that the decoder would otherwise read as an abbreviation (a user key ``"c"``, a role
    that is literally ``"s"``, anything starting with ``~``) is written with the escape prefix ``~``;
  - defaults are omitted only on the *request object* - the root object when it has ``messages`` and no
    ``choices`` - and only when the value has exactly the restored JSON value and type;
  - nulls, key order, unknown keys, numbers and Unicode are kept.

  ``decode_t1(encode_t1(x))`` equals *R(x)*: *x* itself, except that a request object has its
  default-valued parameters moved to the end and every absent default appended (seed table order).

* **reference** - what the existing Rust implementation (0.2-0.3) emits: its own tables, sorted keys,
  nulls dropped, default-looking values dropped at any depth. Wires containing one of its marker keys
  (``messages``, ``role``, ``message``, ``index``, ``usage``, ... - see ``_REFERENCE_MARKER_KEYS``) or a
  model abbreviation of its own are decoded exactly as the reference decoder would (sorted keys, six
  defaults restored on every object with ``messages``/``model``, responses included). Our seed encoder
  never emits such markers unescaped, so its wires are never mistaken for reference ones.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any, Final, Literal

import msgspec

from m2mwire.codecs.jsonutil import dumps_compact, loads_limited
from m2mwire.codecs.limits import DEFAULT_LIMITS, Limits
from m2mwire.codecs.t1_tables import (
    ESCAPE,
    REFERENCE_DEFAULT_KEYS,
    REFERENCE_KEYS,
    REFERENCE_MODELS,
    REFERENCE_RESTORED_DEFAULTS,
    REFERENCE_ROLES,
    SEED_DEFAULTS,
    SEED_FINISH_REASONS,
    SEED_MODELS,
    SEED_REQUEST_KEYS,
    SEED_RESPONSE_KEYS,
    SEED_ROLES,
    SEED_TOOL_KEYS,
)
from m2mwire.codecs.utf8 import utf8_len
from m2mwire.errors import DecodeError, EncodeError, LimitExceeded

__all__ = [
    "T1_PREFIX",
    "Dialect",
    "compress_obj_t1",
    "decode_t1",
    "detect_t1_dialect",
    "encode_t1",
    "expand_obj_t1",
]

T1_PREFIX: Final = "#T1|"

Dialect = Literal["seed", "reference"]

_NoneType = type(None)

# ======================================================================================================
# Seed dialect: lookup tables, built once at import.
# ======================================================================================================

_SEED_ENC_KEYS: Final[dict[str, str]] = {**SEED_REQUEST_KEYS, **SEED_RESPONSE_KEYS, **SEED_TOOL_KEYS}
if len(_SEED_ENC_KEYS) != len(SEED_REQUEST_KEYS) + len(SEED_RESPONSE_KEYS) + len(SEED_TOOL_KEYS):
    raise AssertionError("an original key appears in two seed key tables")

_originals_of: dict[str, list[str]] = {}
for _orig, _abbr in _SEED_ENC_KEYS.items():
    _originals_of.setdefault(_abbr, []).append(_orig)

#: Abbreviation -> original, for abbreviations that mean exactly one key.
_SEED_DEC_KEYS: Final[dict[str, str]] = {a: os[0] for a, os in _originals_of.items() if len(os) == 1}

# The seed's collisions (abbreviation -> originals). Each is resolved by the value's JSON type, and for
# types that say nothing (null, booleans, ...) by position: is the object the root value?
# kind: "array" | "object" | "string" | "number" | "other"
_COLLISION_RULES: Final[dict[str, dict[str, str | tuple[str, str]]]] = {
    # messages is always an array of messages; message is an object (a choice's) or, in error objects,
    # a string. Position does not help, so everything but an array is "message".
    "m": {"array": "messages", "object": "message", "string": "message", "number": "message",
          "other": "message"},
    # tool_calls is an array; tool_choice a string ("auto") or an object. A null is tool_choice at the
    # root (a request parameter) and tool_calls elsewhere (an assistant message's "tool_calls": null).
    "tc": {"array": "tool_calls", "object": "tool_choice", "string": "tool_choice",
           "number": ("tool_choice", "tool_calls"), "other": ("tool_choice", "tool_calls")},
    # n is a number, name a string; anything else is n at the root (request parameter), name elsewhere.
    "n": {"array": ("n", "name"), "object": ("n", "name"), "string": "name", "number": "n",
          "other": ("n", "name")},
}  # fmt: skip
if set(_COLLISION_RULES) != {a for a, os in _originals_of.items() if len(os) > 1}:
    raise AssertionError("every colliding seed abbreviation needs exactly one resolution rule")

_KIND_OF_TYPE: Final[dict[type, str]] = {
    list: "array",
    dict: "object",
    str: "string",
    int: "number",
    float: "number",
    bool: "other",
    _NoneType: "other",
}
_OTHER: Final = object  # lookup key for any type not in _KIND_OF_TYPE


def _build_collision_table() -> dict[str, dict[tuple[type, bool], str]]:
    table: dict[str, dict[tuple[type, bool], str]] = {}
    for abbr, rule in _COLLISION_RULES.items():
        entry: dict[tuple[type, bool], str] = {}
        for typ, kind in [*_KIND_OF_TYPE.items(), (_OTHER, "other")]:
            target = rule[kind]
            for root in (True, False):
                entry[typ, root] = target if isinstance(target, str) else target[0 if root else 1]
        if set(entry.values()) != set(_originals_of[abbr]):
            raise AssertionError(f"collision rule for {abbr!r} must reach every original")
        table[abbr] = entry
    return table


#: Abbreviation -> {(type(value), is_root_object): original}; the decoder's answer, which the encoder
#: also consults, so that "what the encoder writes" and "what the decoder reads" cannot drift apart.
_COLLISIONS: Final = _build_collision_table()


def _resolve_collision(abbr: str, value: Any, root: bool) -> str:
    table = _COLLISIONS[abbr]
    key = table.get((type(value), root))
    return key if key is not None else table[_OTHER, root]


# Keys the reference encoder leaves bare but the seed tables abbreviate, plus the reference's own
# abbreviations that the seed lacks. A bare one on a wire means "reference dialect"; the seed encoder
# therefore always abbreviates or escapes them.
_REFERENCE_MARKER_KEYS: Final = frozenset(
    {
        "messages", "role", "message", "index", "usage", "user", "seed", "tools", "functions", "function",
        "name", "type",  # seed abbreviates these, the reference does not
        "tx", "tlp", "D", "sf", "E",  # reference-only abbreviations
    }
)  # fmt: skip
_derived_markers = {o for o, a in _SEED_ENC_KEYS.items() if a != o and o not in REFERENCE_KEYS} | (
    set(REFERENCE_KEYS.values()) - set(_originals_of) - set(_SEED_ENC_KEYS)
)
if _derived_markers != _REFERENCE_MARKER_KEYS:
    raise AssertionError(f"reference marker keys out of sync with the tables: {_derived_markers}")

#: A key not in the seed table is written bare unless the decoder would read it as something else.
_KEYS_NEEDING_ESCAPE: Final = frozenset(_originals_of) | _REFERENCE_MARKER_KEYS

_REFERENCE_MODEL_ABBREVIATIONS: Final = frozenset(REFERENCE_MODELS.values())
_NO_MARKERS: Final[frozenset[str]] = frozenset()

_ValueTable = tuple[dict[str, str], frozenset[str]]

# Value tables by original key: encoder (forward table, values that must be escaped) and decoder
# (reverse table, values that mark the reference dialect).
_SEED_VALUE_ENC: Final[dict[str, _ValueTable]] = {
    "role": (SEED_ROLES, frozenset(SEED_ROLES.values())),
    "finish_reason": (SEED_FINISH_REASONS, frozenset(SEED_FINISH_REASONS.values())),
    "model": (SEED_MODELS, frozenset(SEED_MODELS.values()) | _REFERENCE_MODEL_ABBREVIATIONS),
}
_SEED_VALUE_DEC: Final[dict[str, _ValueTable]] = {
    "role": ({a: o for o, a in SEED_ROLES.items()}, _NO_MARKERS),
    "finish_reason": ({a: o for o, a in SEED_FINISH_REASONS.items()}, _NO_MARKERS),
    "model": ({a: o for o, a in SEED_MODELS.items()}, _REFERENCE_MODEL_ABBREVIATIONS),
}
for _fwd, _ in _SEED_VALUE_ENC.values():
    if len(set(_fwd.values())) != len(_fwd):
        raise AssertionError("a seed value table maps two values to one abbreviation")

#: Request-object defaults: key -> (exact type, value). ``type(v) is t and v == d`` keeps 1 != 1.0 != True.
_SEED_DEFAULT_TEST: Final[dict[str, tuple[type, object]]] = {k: (type(d), d) for k, d in SEED_DEFAULTS}

# Encoder fast paths, one dict lookup per member in the usual case:
#: original -> wire key, for unambiguous table keys and for non-table keys that always need the escape.
_ENC_FIXED: Final[dict[str, str]] = {
    k: ESCAPE + k for k in _KEYS_NEEDING_ESCAPE if k not in _SEED_ENC_KEYS
} | {o: a for o, a in _SEED_ENC_KEYS.items() if a not in _COLLISIONS}
#: colliding original -> (its abbreviation, what to write when the abbreviation cannot be used).
_ENC_COLLIDING: Final[dict[str, tuple[str, str]]] = {
    o: (a, ESCAPE + o if o in _KEYS_NEEDING_ESCAPE else o)
    for o, a in _SEED_ENC_KEYS.items()
    if a in _COLLISIONS
}


_json_encode = msgspec.json.Encoder().encode  # sizes only: the same bytes as dumps_compact


class _ReferenceDialect(Exception):
    """Internal: a seed-mode walk met a reference-dialect marker; start over in reference mode."""


# ======================================================================================================
# Seed dialect: encoder.
# ======================================================================================================


def _seed_enc_str(value: str, table: _ValueTable) -> str:
    fwd, escape = table
    abbr = fwd.get(value)
    if abbr is not None:
        return abbr
    if value[:1] == ESCAPE or value in escape:
        return ESCAPE + value
    return value


def _seed_enc_list(items: list[Any], vt: _ValueTable | None) -> list[Any]:
    if vt is None:
        return [
            _seed_enc_obj(x, False) if type(x) is dict else _seed_enc_list(x, None) if type(x) is list else x
            for x in items
        ]
    return [
        _seed_enc_str(x, vt)
        if type(x) is str
        else _seed_enc_obj(x, False)
        if type(x) is dict
        else _seed_enc_list(x, vt)
        if type(x) is list
        else x
        for x in items
    ]


def _seed_enc_obj(obj: dict[str, Any], root: bool) -> dict[str, Any]:
    if root and "messages" in obj and "choices" not in obj:  # the request object: drop exact defaults
        obj = {
            k: v
            for k, v in obj.items()
            if (test := _SEED_DEFAULT_TEST.get(k)) is None or type(v) is not test[0] or v != test[1]
        }
    out: dict[str, Any] = {}
    used: set[str] | None = None  # colliding abbreviations already written in this object
    for k, v in obj.items():
        w = _ENC_FIXED.get(k)
        if w is None:
            coll = _ENC_COLLIDING.get(k)
            if coll is None:
                w = ESCAPE + k if k[:1] == ESCAPE else k
            else:
                # Abbreviate only if the decoder resolves it back to k, and only once per object
                # (e.g. "n": 2 and "name": "x" side by side: the second one is not abbreviated).
                w = coll[0]
                if _resolve_collision(w, v, root) != k or (used is not None and w in used):
                    w = coll[1]
                elif used is None:
                    used = {w}
                else:
                    used.add(w)
        t = type(v)
        if t is str:
            vt = _SEED_VALUE_ENC.get(k)
            if vt is not None:
                v = _seed_enc_str(v, vt)
        elif t is dict:
            v = _seed_enc_obj(v, False)
        elif t is list:
            v = _seed_enc_list(v, _SEED_VALUE_ENC.get(k))
        out[w] = v
    return out


# ======================================================================================================
# Seed dialect: decoder.
# ======================================================================================================


class _Budget:
    """How many bytes the expansion may still add before the decoded text is over its limit.

    Output size = compact size of the parsed wire + the growth of every rename and default added
    (each computed exactly, in UTF-8 bytes, where it happens) - every member that a later one with
    the same decoded key replaces (its expanded size, credited when it is replaced). Every object
    settles its growth when done, so an expansion past the limit stops within one object's worth of
    work instead of building the whole result first (issue 11.10).

    ``left`` starts from the wire's own size (an upper bound of its compact size) plus ``slack``,
    the number of ``~`` in the wire (each escape removed later is one byte less). When it runs out,
    what is still uncertain is settled once each: the exact compact size (one msgspec encode), then
    ``shrink``, the size of every member a repeated key drops anywhere in the wire (a later credit
    that has not come yet; counted without expanding). Only then is the limit refused, so a text
    whose expansion fits is not refused (unless it spells a key twice and the member dropped grows
    past the limit by itself: no conforming encoder repeats a key, but a reference wire read as seed
    can, which _expand_auto handles), and an over-limit one is built to at most the limit plus the
    wire's size.
    """

    __slots__ = ("charged", "left", "limit", "shrink", "source")

    def __init__(
        self,
        limit: int,
        source: Any,
        wire_bytes: int,
        slack: int = 0,
        shrink: Callable[[Any], int] | None = None,
    ) -> None:
        self.limit = limit
        self.left = limit - wire_bytes + slack
        self.charged = wire_bytes  # what the parsed wire was charged, until measured exactly
        self.source: Any = source  # the parsed wire
        self.shrink = shrink  # None once credited (or when there is nothing to measure)

    def exhausted(self) -> None:
        source = self.source
        if source is not None and self.charged >= 0:
            self.left += self.charged - len(_json_encode(source))
            self.charged = -1  # measured
            if self.left >= 0:
                return
        if source is not None and self.shrink is not None:
            self.left += self.shrink(source)
            self.shrink = None
            if self.left >= 0:
                return
        raise LimitExceeded(
            f"decoded T1 message is over max_output_bytes={self.limit} (refused while expanding)",
            limit=self.limit,
        )


#: For expansions without a limit (expand_obj_t1): never runs out.
def _unlimited() -> _Budget:
    return _Budget(sys.maxsize, None, 0)


def _member_bytes(key: str, value: Any) -> int:
    """Compact size of ``"key":value,`` (a replaced member never stands alone, so it has a comma)."""
    return len(_json_encode(key)) + len(_json_encode(value)) + 2


# Bytes a default adds to an object: ``"key":value`` (plus a comma, added where it is used).
_SEED_DEFAULT_BYTES: Final[dict[str, int]] = {
    k: len(_json_encode(k)) + 1 + len(_json_encode(d)) for k, d in SEED_DEFAULTS
}


def _seed_dec_str(value: str, table: _ValueTable, detect: bool) -> str:
    if value[:1] == ESCAPE:
        return value[1:]
    rev, markers = table
    orig = rev.get(value)
    if orig is not None:
        return orig
    if detect and value in markers:
        raise _ReferenceDialect
    return value


def _seed_dec_list(items: list[Any], vt: _ValueTable | None, detect: bool, budget: _Budget) -> list[Any]:
    if vt is None:
        return [
            _seed_dec_obj(x, False, detect, budget)
            if type(x) is dict
            else _seed_dec_list(x, None, detect, budget)
            if type(x) is list
            else x
            for x in items
        ]
    out: list[Any] = []
    grow = 0
    for x in items:
        t = type(x)
        if t is str:
            y = _seed_dec_str(x, vt, detect)
            if y is not x:  # table values are ASCII and "~" is one byte: lengths are byte counts
                grow += len(y) - len(x)
            x = y
        elif t is dict:
            x = _seed_dec_obj(x, False, detect, budget)
        elif t is list:
            x = _seed_dec_list(x, vt, detect, budget)
        out.append(x)
    if grow:
        budget.left -= grow
        if budget.left < 0:
            budget.exhausted()
    return out


def _seed_key(w: str, v: Any, root: bool, detect: bool) -> str:
    """The key a wire key that is not in the seed table decodes to (``w`` holds ``v``)."""
    if w[:1] == ESCAPE:
        return w[1:]
    if w in _COLLISIONS:
        return _resolve_collision(w, v, root)
    if detect and w in _REFERENCE_MARKER_KEYS:
        raise _ReferenceDialect
    return w


def _seed_dec_obj(obj: dict[str, Any], root: bool, detect: bool, budget: _Budget) -> dict[str, Any]:
    out: dict[str, Any] = {}
    grow = 0
    for w, v in obj.items():
        k = _SEED_DEC_KEYS.get(w)
        if k is None:
            k = _seed_key(w, v, root, detect)
        if k is not w:  # table keys are ASCII and "~" is one byte: lengths are byte counts
            grow += len(k) - len(w)
        t = type(v)
        if t is str:
            vt = _SEED_VALUE_DEC.get(k)
            if vt is not None:
                y = _seed_dec_str(v, vt, detect)
                if y is not v:
                    grow += len(y) - len(v)
                v = y
        elif t is dict:
            v = _seed_dec_obj(v, False, detect, budget)
        elif t is list:
            v = _seed_dec_list(v, _SEED_VALUE_DEC.get(k), detect, budget)
        if k in out:  # a key spelled twice ("~n" next to a colliding "n"): the later one wins
            grow -= _member_bytes(k, out[k])
        out[k] = v
    if root and "messages" in out and "choices" not in out:
        for key, default in SEED_DEFAULTS:
            if key not in out:
                grow += _SEED_DEFAULT_BYTES[key] + 1  # out has "messages": a comma always precedes
                out[key] = {} if type(default) is dict else default  # a fresh {} per message
    if grow:
        budget.left -= grow
        if budget.left < 0:
            budget.exhausted()
    return out


def _seed_shrink(value: Any, root: bool) -> int:
    """Bytes of every member that a later one with the same decoded key (seed reading) replaces."""
    if type(value) is list:
        return sum(_seed_shrink(x, False) for x in value)
    if type(value) is not dict:
        return 0
    keys: dict[str, Any] = {}
    total = 0
    for w, v in value.items():
        k = _SEED_DEC_KEYS.get(w) or _seed_key(w, v, root, False)
        if k in keys:
            total += _member_bytes(*keys[k])
        keys[k] = (w, v)
        total += _seed_shrink(v, False)
    return total


def _ref_shrink(value: Any) -> int:
    """Bytes of every member that a later one with the same decoded key (reference reading) replaces."""
    if type(value) is list:
        return sum(_ref_shrink(x) for x in value)
    if type(value) is not dict:
        return 0
    keys: dict[str, Any] = {}
    total = 0
    for w in sorted(value):
        k = _REF_DEC_KEYS.get(w, w)
        if k in keys:
            total += _member_bytes(*keys[k])
        keys[k] = (w, value[w])
        total += _ref_shrink(value[w])
    return total


def _seed_expand(obj: Any, detect: bool, budget: _Budget) -> Any:
    t = type(obj)
    if t is dict:
        return _seed_dec_obj(obj, True, detect, budget)
    if t is list:
        return _seed_dec_list(obj, None, detect, budget)
    return obj


# ======================================================================================================
# Reference dialect (m2m-reference.md section 1.3): reproduces the Rust codec, lossy by design.
# ======================================================================================================

_REF_DEC_KEYS: Final[dict[str, str]] = {a: o for o, a in REFERENCE_KEYS.items()}
_REF_ROLES_DEC: Final[dict[str, str]] = {a: o for o, a in REFERENCE_ROLES.items()}
_REF_MODELS_DEC: Final[dict[str, str]] = {a: o for o, a in REFERENCE_MODELS.items()}
# The reference picks value tables by the key as written in its input ("role" or "r", "model" or "M"),
# and arrays pass their key's table on to their elements.
_REF_VALUE_ENC: Final[dict[str, dict[str, str]]] = {
    "role": REFERENCE_ROLES,
    "r": REFERENCE_ROLES,
    "model": REFERENCE_MODELS,
    "M": REFERENCE_MODELS,
}
_REF_VALUE_DEC: Final[dict[str, dict[str, str]]] = {
    "role": _REF_ROLES_DEC,
    "r": _REF_ROLES_DEC,
    "model": _REF_MODELS_DEC,
    "M": _REF_MODELS_DEC,
}


def _reference_is_default(key: str, value: Any) -> bool:
    test = REFERENCE_DEFAULT_KEYS.get(key)
    if test is None:
        return False
    t = type(value)
    if test == "approx_one":  # |x - 1.0| < 0.001 for any number; an int is near 1 only if it is 1
        return (t is float and abs(value - 1.0) < 0.001) or (t is int and value == 1)
    if test == "int_one":
        return t is int and value == 1
    if test == "zero":
        return (t is int or t is float) and value == 0
    if test == "false":
        return value is False
    if test == "empty_object":
        return t is dict and not value
    return value is None  # "null"


def _ref_enc(value: Any, vt: dict[str, str] | None) -> Any:
    t = type(value)
    if t is dict:
        out: dict[str, Any] = {}
        # Sorted like the reference's BTreeMap; when two keys end up equal (a user key "c" next to
        # "content"), the later one overwrites, as a map insert does there.
        for k in sorted(value):
            v = value[k]
            if v is None or _reference_is_default(k, v):
                continue
            out[REFERENCE_KEYS.get(k, k)] = _ref_enc(v, _REF_VALUE_ENC.get(k))
        return out
    if t is list:
        return [_ref_enc(item, vt) for item in value]
    if t is str and vt is not None:
        return vt.get(value, value)
    return value


# Bytes a restored default adds (the object holds messages or model already, so a comma precedes it).
_REF_DEFAULT_BYTES: Final[dict[str, int]] = {
    k: len(_json_encode(k)) + 2 + len(_json_encode(d)) for k, d in REFERENCE_RESTORED_DEFAULTS
}
_REF_RESTORE_AT: Final = frozenset({"messages", "model"})


def _ref_dec(value: Any, vt: dict[str, str] | None, budget: _Budget, restored: bool) -> Any:
    """Expand one reference-dialect value. The six defaults go into the first objects holding
    messages/model on each path from the root (the reference's restore pass, done on the way down:
    ``restored`` says an enclosing object already got them), so growth is counted as it happens."""
    t = type(value)
    if t is dict:
        out: dict[str, Any] = {}
        grow = 0
        here = not restored and any(_REF_DEC_KEYS.get(w, w) in _REF_RESTORE_AT for w in value)
        inner = restored or here
        for w in sorted(value):
            k = _REF_DEC_KEYS.get(w, w)
            if k is not w:  # table keys are ASCII: lengths are byte counts
                grow += len(k) - len(w)
            v = _ref_dec(value[w], _REF_VALUE_DEC.get(k), budget, inner)
            if k in out:  # a user key "c" next to "content": the later one overwrites, as there
                grow -= _member_bytes(k, out[k])
            out[k] = v
        if here:
            for key, default in REFERENCE_RESTORED_DEFAULTS:
                if key not in out:
                    grow += _REF_DEFAULT_BYTES[key]
                    out[key] = default
        if grow:
            budget.left -= grow
            if budget.left < 0:
                budget.exhausted()
        return out
    if t is list:
        return [_ref_dec(item, vt, budget, restored) for item in value]
    if t is str and vt is not None:
        y = vt.get(value, value)
        if y is not value:
            budget.left -= len(y) - len(value)
            if budget.left < 0:
                budget.exhausted()
        return y
    return value


def _reference_expand(obj: Any, budget: _Budget) -> Any:
    return _ref_dec(obj, None, budget, False)


# ======================================================================================================
# Public API.
# ======================================================================================================


def compress_obj_t1(obj: Any, *, dialect: Dialect = "seed") -> Any:
    """Abbreviate a parsed JSON value (object level; no limits, no serialization).

    ``obj`` must be JSON-model data (dict with str keys, list, str, int, float, bool, None); it is not
    modified. For ``dialect="reference"`` the result must be serialized with sorted keys to match the
    reference byte for byte (:func:`encode_t1` does that).
    """
    if dialect == "seed":
        t = type(obj)
        if t is dict:
            return _seed_enc_obj(obj, True)
        if t is list:
            return _seed_enc_list(obj, None)
        return obj
    if dialect == "reference":
        return _ref_enc(obj, None)
    raise EncodeError(f"unknown T1 dialect {dialect!r} (expected 'seed' or 'reference')")


def expand_obj_t1(obj: Any, *, dialect: Literal["auto", "seed", "reference"] = "auto") -> Any:
    """Expand a parsed T1 payload (object level). ``"auto"`` detects the dialect as :func:`decode_t1`
    does; ``"seed"`` forces the seed reading (reference marker keys are then plain keys)."""
    if dialect == "auto":
        return _expand_auto(obj, lambda _: _unlimited())[0]
    if dialect == "seed":
        return _seed_expand(obj, False, _unlimited())
    if dialect == "reference":
        return _reference_expand(obj, _unlimited())
    raise DecodeError(f"unknown T1 dialect {dialect!r} (expected 'auto', 'seed' or 'reference')")


def _expand_auto(obj: Any, budget: Callable[[Dialect], _Budget]) -> tuple[Any, Dialect]:
    """Expand in the seed dialect, or start over in the reference's (with a fresh ``budget()``)."""
    try:
        return _seed_expand(obj, True, budget("seed")), "seed"
    except _ReferenceDialect:
        pass
    except LimitExceeded:
        # Read as seed, the wire overflows; but a reference wire read as seed can overflow before
        # its first marker is met. Only then is the reference reading the right one.
        if not _has_reference_marker(obj, None, True):
            raise
    return _reference_expand(obj, budget("reference")), "reference"


def _shrink_of(dialect: Dialect) -> Callable[[Any], int]:
    if dialect == "seed":
        return lambda obj: _seed_shrink(obj, True)
    return _ref_shrink


def _has_reference_marker(value: Any, vt: _ValueTable | None, root: bool) -> bool:
    """Whether the seed reading of ``value`` meets a reference-dialect marker (where the _seed_dec_*
    functions raise _ReferenceDialect), found without building anything."""
    t = type(value)
    if t is dict:
        for w, v in value.items():
            k = _SEED_DEC_KEYS.get(w)
            if k is None:
                if w[:1] == ESCAPE:
                    k = w[1:]
                elif w in _COLLISIONS:
                    k = _resolve_collision(w, v, root)
                elif w in _REFERENCE_MARKER_KEYS:
                    return True
                else:
                    k = w
            if _has_reference_marker(v, _SEED_VALUE_DEC.get(k), False):
                return True
        return False
    if t is list:
        return any(_has_reference_marker(x, vt, False) for x in value)
    if t is str and vt is not None:
        return value[:1] != ESCAPE and value not in vt[0] and value in vt[1]
    return False


def _check_text_size(text: str, limit: int, what: str, name: str) -> None:
    n = len(text)
    if n * 4 <= limit:  # cannot be over: at most 4 UTF-8 bytes per code point
        return
    size = utf8_len(text)
    if size > limit:
        raise LimitExceeded(f"{what} is {size} bytes, over {name}={limit}", limit=limit, actual=size)


def encode_t1(content: str, *, dialect: Dialect = "seed", limits: Limits = DEFAULT_LIMITS) -> str:
    """Encode JSON text as a full ``#T1|<compact JSON>`` wire string.

    ``dialect="seed"`` (default) is lossless: :func:`decode_t1` gives back the same JSON value, with key
    order, nulls, unknown keys and number types kept, except that on a request object (the root object,
    with ``messages`` and without ``choices``) default-valued parameters come back at the end and absent
    defaults are added.

    ``dialect="reference"`` reproduces the existing Rust implementation byte for byte and is **lossy** in
    the same ways: every null is dropped, default-looking values (``temperature`` ~1, ``n`` 1, ``stream``
    false, zero penalties, ``{}`` logit_bias - also under the single-letter keys) are dropped at any depth,
    keys are sorted, and user keys equal to an abbreviation are read back as the abbreviated key.

    Raises :class:`EncodeError` for content that is not JSON, :class:`LimitExceeded` when the content
    (or the resulting wire) breaks ``limits``.
    """
    if dialect not in ("seed", "reference"):
        raise EncodeError(f"unknown T1 dialect {dialect!r} (expected 'seed' or 'reference')")
    if not isinstance(content, str):
        raise EncodeError(f"T1 encodes JSON text (str), not {type(content).__name__}")
    try:
        obj = loads_limited(content, limits=limits, what="T1 input")
    except DecodeError as exc:
        raise EncodeError(f"T1 needs JSON content: {exc}") from None
    try:
        wire = T1_PREFIX + dumps_compact(
            compress_obj_t1(obj, dialect=dialect), sort_keys=dialect == "reference"
        )
    except RecursionError:  # only with limits whose max_json_depth is near the interpreter's own limit
        raise LimitExceeded("T1 input is nested too deeply", limit=limits.max_json_depth) from None
    _check_text_size(wire, limits.max_message_bytes, "T1 wire", "max_message_bytes")
    return wire


def _parse_wire(wire: str, limits: Limits) -> Any:
    if not isinstance(wire, str):
        raise DecodeError(f"a T1 wire is a str, not {type(wire).__name__}")
    if not wire.startswith(T1_PREFIX):
        raise DecodeError(f"not a T1 message: expected the prefix '#T1|', got {wire[:8]!r}")
    _check_text_size(wire, limits.max_message_bytes, "T1 message", "max_message_bytes")
    return loads_limited(wire[len(T1_PREFIX) :], limits=limits, what="T1 payload")


def decode_t1(wire: str, *, limits: Limits = DEFAULT_LIMITS) -> str:
    """Decode a full ``#T1|`` wire string to compact JSON text.

    Seed-dialect wires (ours, and any following the seed's tables) decode with key order kept and the
    seed's defaults restored on request objects. Wires in the reference implementation's dialect decode
    exactly as its decoder does (sorted keys, its six defaults restored, also on responses).

    Raises :class:`DecodeError` (wrong prefix, malformed JSON, invalid UTF-8) or :class:`LimitExceeded`;
    never returns a partial result.
    """
    obj = _parse_wire(wire, limits)
    size = utf8_len(wire)
    limit = limits.max_output_bytes
    try:
        tildes = wire.count(ESCAPE)
        expanded, dialect = _expand_auto(
            obj, lambda d: _Budget(limit, obj, size - len(T1_PREFIX), tildes, _shrink_of(d))
        )
    except RecursionError:
        raise LimitExceeded("T1 payload is nested too deeply", limit=limits.max_json_depth) from None
    out = dumps_compact(expanded, sort_keys=dialect == "reference")
    _check_text_size(out, limits.max_output_bytes, "decoded T1 message", "max_output_bytes")
    return out


def detect_t1_dialect(wire: str, *, limits: Limits = DEFAULT_LIMITS) -> Dialect:
    """Which dialect :func:`decode_t1` reads ``wire`` as (same errors as :func:`decode_t1`)."""
    obj = _parse_wire(wire, limits)
    try:
        return _expand_auto(obj, lambda _: _unlimited())[1]
    except RecursionError:
        raise LimitExceeded("T1 payload is nested too deeply", limit=limits.max_json_depth) from None
