"""Tests for the T1 codec, seed dialect: seed examples, collisions, escapes, defaults, round trip, errors.

The round-trip property (docs/T1.md): decode_t1(encode_t1(x)) is *strictly* (key order, int vs float)
equal to R(x), where R(x) = x unless x is a request object (the root object, holding "messages", not
holding "choices"); for a request object R drops the members whose value is exactly a seed default and
then appends every default that is now absent, in the seed's table order.
"""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from m2mwire.codecs.jsonutil import dumps_compact, loads_limited
from m2mwire.codecs.limits import Limits
from m2mwire.codecs.t1 import (
    compress_obj_t1,
    decode_t1,
    detect_t1_dialect,
    encode_t1,
    expand_obj_t1,
)
from m2mwire.errors import DecodeError, EncodeError, LimitExceeded
from tests.codecs.test_jsonutil import SETTINGS, canon, json_values

# The seed's default table (section 5.3.5), restated independently of the implementation.
SEED_DEFAULTS: list[tuple[str, Any]] = [
    ("temperature", 1.0),
    ("top_p", 1.0),
    ("n", 1),
    ("stream", False),
    ("frequency_penalty", 0),
    ("presence_penalty", 0),
    ("logit_bias", {}),
    ("stop", None),
]


def restore(x: Any) -> Any:
    """R(x) from the module docstring."""
    if not (type(x) is dict and "messages" in x and "choices" not in x):
        return x

    def is_default(k: str, v: Any) -> bool:
        return any(k == dk and type(v) is type(dv) and v == dv for dk, dv in SEED_DEFAULTS)

    out = {k: v for k, v in x.items() if not is_default(k, v)}
    for dk, dv in SEED_DEFAULTS:
        out.setdefault(dk, copy.deepcopy(dv))
    return out


def roundtrip(x: Any) -> tuple[str, Any]:
    """Encode x (as JSON text), check the seed-dialect invariants, return (wire, decoded value)."""
    wire = encode_t1(dumps_compact(x))
    assert wire.startswith("#T1|")
    assert all(ord(ch) >= 0x20 for ch in wire), "no raw control characters on the wire"
    assert wire == "#T1|" + dumps_compact(json.loads(wire[4:])), "compact JSON only"
    assert detect_t1_dialect(wire) == "seed", "our wires never look like the reference dialect"
    decoded = loads_limited(decode_t1(wire))
    assert canon(decoded) == canon(restore(x))
    return wire, decoded


def wire_obj(x: Any) -> Any:
    return json.loads(encode_t1(dumps_compact(x))[4:])


# ======================================================================================================
# The seed's own examples, byte for byte.
# ======================================================================================================

SEED_EXAMPLES = [
    # section 5.3.7
    (
        '{"model":"gpt-4o","messages":[{"role":"user","content":"Hello"}],"temperature":1.0,"stream":false}',
        '#T1|{"M":"4o","m":[{"r":"u","c":"Hello"}]}',
    ),
    # section 3.3.1
    (
        '{"model":"gpt-4o","messages":[{"role":"user","content":"Hi"}]}',
        '#T1|{"M":"4o","m":[{"r":"u","c":"Hi"}]}',
    ),
    # section 3.9.1 (minimal message)
    ('{"model":"gpt-4o","messages":[]}', '#T1|{"M":"4o","m":[]}'),
    # section 3.9.2
    (
        '{"model":"gpt-4o","messages":[{"role":"system","content":"You are helpful."},'
        '{"role":"user","content":"Hello!"}],"temperature":0.7,"max_tokens":100}',
        '#T1|{"M":"4o","m":[{"r":"s","c":"You are helpful."},{"r":"u","c":"Hello!"}],"T":0.7,"x":100}',
    ),
]

SEED_393_ORIGINAL = (
    '{"id":"chatcmpl-123","choices":[{"index":0,"message":{"role":"assistant","content":"Hello!"},'
    '"finish_reason":"stop"}],"usage":{"prompt_tokens":10,"completion_tokens":5,"total_tokens":15}}'
)
SEED_393_WIRE = (
    '#T1|{"id":"chatcmpl-123","C":[{"i":0,"m":{"r":"a","c":"Hello!"},"fr":"stop"}],'
    '"U":{"pt":10,"ct":5,"tt":15}}'
)


@pytest.mark.parametrize(("original", "wire"), SEED_EXAMPLES)
def test_seed_examples_byte_for_byte(original: str, wire: str) -> None:
    assert encode_t1(original) == wire
    assert canon(loads_limited(decode_t1(wire))) == canon(restore(json.loads(original)))
    roundtrip(json.loads(original))


def test_seed_537_decoded_text() -> None:
    assert decode_t1('#T1|{"M":"4o","m":[{"r":"u","c":"Hello"}]}') == (
        '{"model":"gpt-4o","messages":[{"role":"user","content":"Hello"}],"temperature":1.0,"top_p":1.0,'
        '"n":1,"stream":false,"frequency_penalty":0,"presence_penalty":0,"logit_bias":{},"stop":null}'
    )


def test_seed_393_response_follows_the_finish_reason_table() -> None:
    # Section 3.9.3 keeps "fr":"stop"; section 5.3.3 abbreviates stop -> s. We follow the table ...
    assert encode_t1(SEED_393_ORIGINAL) == SEED_393_WIRE.replace('"fr":"stop"', '"fr":"s"')
    # ... and still read the section 3.9.3 wire exactly (an unabbreviated value is taken literally).
    assert decode_t1(SEED_393_WIRE) == SEED_393_ORIGINAL
    # Responses get no defaults.
    assert decode_t1(encode_t1(SEED_393_ORIGINAL)) == SEED_393_ORIGINAL


def test_every_seed_table_entry_round_trips_and_abbreviates() -> None:
    from m2mwire.codecs import t1_tables as tt

    for table in (tt.SEED_REQUEST_KEYS, tt.SEED_RESPONSE_KEYS, tt.SEED_TOOL_KEYS):
        for original, abbr in table.items():
            samples: dict[str, Any] = {"messages": [], "choices": [], "tool_calls": [], "message": {}}
            value: Any = samples.get(original, "v")
            if original in ("n", "tool_choice"):
                value = 2 if original == "n" else "auto"
            x: Any = {"wrap": {original: value}}
            assert wire_obj(x) == {"wrap": {abbr: value}}, original
            roundtrip(x)
    for key, table in (
        ("role", tt.SEED_ROLES),
        ("finish_reason", tt.SEED_FINISH_REASONS),
        ("model", tt.SEED_MODELS),
    ):
        for original, abbr in table.items():
            x = {key: original}
            w = wire_obj(x)
            assert list(w.values()) == [abbr], original
            roundtrip(x)


# ======================================================================================================
# Collisions: m (messages/message), tc (tool_choice/tool_calls), n (n/name).
# ======================================================================================================

VALUE_SAMPLES: dict[str, Any] = {
    "array": [1],
    "object": {"zz": 1},
    "string": "s1",
    "int": 3,
    "float": 2.5,
    "bool": True,
    "null": None,
}

# abbreviation -> kind -> (meaning in the root object, meaning in a nested object). The spec of
# docs/T1.md "Collisions", restated independently of the implementation.
COLLISION_TABLE: dict[str, dict[str, tuple[str, str]]] = {
    "m": {
        "array": ("messages", "messages"),
        "object": ("message", "message"),
        "string": ("message", "message"),
        "int": ("message", "message"),
        "float": ("message", "message"),
        "bool": ("message", "message"),
        "null": ("message", "message"),
    },
    "tc": {
        "array": ("tool_calls", "tool_calls"),
        "object": ("tool_choice", "tool_choice"),
        "string": ("tool_choice", "tool_choice"),
        "int": ("tool_choice", "tool_calls"),
        "float": ("tool_choice", "tool_calls"),
        "bool": ("tool_choice", "tool_calls"),
        "null": ("tool_choice", "tool_calls"),
    },
    "n": {
        "array": ("n", "name"),
        "object": ("n", "name"),
        "string": ("name", "name"),
        "int": ("n", "n"),
        "float": ("n", "n"),
        "bool": ("n", "name"),
        "null": ("n", "name"),
    },
}
COLLIDING = {"m": ("messages", "message"), "tc": ("tool_choice", "tool_calls"), "n": ("n", "name")}


def _place(obj: dict[str, Any], root: bool) -> Any:
    return obj if root else {"wrap": [obj]}


def _take(value: Any, root: bool) -> dict[str, Any]:
    return value if root else value["wrap"][0]  # type: ignore[no-any-return]


@pytest.mark.parametrize("root", [True, False], ids=["root", "nested"])
@pytest.mark.parametrize("kind", list(VALUE_SAMPLES))
@pytest.mark.parametrize("abbr", list(COLLISION_TABLE))
def test_collision_decoding(abbr: str, kind: str, root: bool) -> None:
    """Wire -> original: how the decoder reads each colliding abbreviation."""
    value = VALUE_SAMPLES[kind]
    decoded = loads_limited(decode_t1("#T1|" + dumps_compact(_place({abbr: value}, root))))
    expected_key = COLLISION_TABLE[abbr][kind][0 if root else 1]
    got = _take(decoded, root)
    assert next(iter(got)) == expected_key
    assert canon(got[expected_key]) == canon(value)


@pytest.mark.parametrize("root", [True, False], ids=["root", "nested"])
@pytest.mark.parametrize("kind", list(VALUE_SAMPLES))
@pytest.mark.parametrize("original", ["messages", "message", "tool_choice", "tool_calls", "n", "name"])
def test_collision_encoding(original: str, kind: str, root: bool) -> None:
    """Original -> wire: abbreviated exactly when the decoder reads it back, else escaped/bare; always
    round-trips."""
    value = VALUE_SAMPLES[kind]
    x = _place({original: value}, root)
    wire_key = next(iter(_take(wire_obj(x), root)))
    abbr = next(a for a, originals in COLLIDING.items() if original in originals)
    if COLLISION_TABLE[abbr][kind][0 if root else 1] == original:
        assert wire_key == abbr
    elif original in ("tool_choice", "tool_calls"):
        assert wire_key == original  # not an abbreviation nor a reference marker: bare is unambiguous
    else:
        assert wire_key == "~" + original
    roundtrip(x)


@pytest.mark.parametrize("root", [True, False], ids=["root", "nested"])
@pytest.mark.parametrize(
    "members",
    [
        [("messages", []), ("message", {"c": 1})],
        [("message", {"c": 1}), ("messages", [])],
        [("tool_choice", "auto"), ("tool_calls", [])],
        [("tool_calls", []), ("tool_choice", {"type": "function"})],
        [("n", 2), ("name", "bob")],
        [("name", "bob"), ("n", 2)],
        [("messages", []), ("message", "m"), ("m", 1), ("~m", 2), ("~~m", 3)],
    ],
)
def test_both_colliding_keys_in_one_object(members: list[tuple[str, Any]], root: bool) -> None:
    x = _place(dict(members), root)
    w = _take(wire_obj(x), root)
    assert len(w) == len(members), "no two members share a wire key"
    roundtrip(x)


def test_collision_examples_read_naturally() -> None:
    request = {
        "model": "gpt-4o",
        "messages": [
            {"role": "user", "content": "hi", "name": "bob"},
            {"role": "assistant", "content": None, "tool_calls": [{"id": "1", "type": "function",
             "function": {"name": "f", "arguments": "{}"}}]},
        ],
        "tool_choice": "auto",
        "n": 2,
    }  # fmt: skip
    assert wire_obj(request) == {
        "M": "4o",
        "m": [
            {"r": "u", "c": "hi", "n": "bob"},
            {"r": "a", "c": None, "tc": [{"id": "1", "t": "function", "fn": {"n": "f", "a": "{}"}}]},
        ],
        "tc": "auto",
        "n": 2,
    }
    roundtrip(request)
    response = {"choices": [{"index": 0, "message": {"role": "assistant", "content": "x"}}]}
    assert wire_obj(response) == {"C": [{"i": 0, "m": {"r": "a", "c": "x"}}]}
    roundtrip(response)


# ======================================================================================================
# Escapes.
# ======================================================================================================


@pytest.mark.parametrize(
    ("key", "wire_key"),
    [
        ("c", "~c"),
        ("m", "~m"),
        ("M", "~M"),
        ("tc", "~tc"),
        ("fr", "~fr"),
        ("~", "~~"),
        ("~c", "~~c"),
        ("~~", "~~~"),
        ("tx", "~tx"),  # reference-only abbreviations ...
        ("E", "~E"),
        ("role", "r"),
        ("index", "i"),
        ("metadata", "metadata"),
        ("", ""),
        ("a~", "a~"),
        ("cc", "cc"),
    ],
)
def test_user_keys_equal_to_abbreviations_are_escaped(key: str, wire_key: str) -> None:
    x = {"metadata": {key: "v"}}
    assert wire_obj(x) == {"metadata": {wire_key: "v"}}
    roundtrip(x)


@pytest.mark.parametrize(
    ("key", "value", "wire_value"),
    [
        ("role", "system", "s"),
        ("role", "s", "~s"),
        ("role", "u", "~u"),
        ("role", "S", "S"),  # the reference's abbreviation is not ours: no escape needed
        ("role", "developer", "developer"),
        ("role", "~", "~~"),
        ("role", "~s", "~~s"),
        ("finish_reason", "stop", "s"),
        ("finish_reason", "tc", "~tc"),
        ("finish_reason", "error", "error"),
        ("model", "gpt-4o", "4o"),
        ("model", "4o", "~4o"),
        ("model", "o1", "o1"),  # identity entry
        ("model", "g4o", "~g4o"),  # a reference abbreviation would mark the reference dialect
        ("model", "mim-l", "~mim-l"),
        ("model", "claude-3", "claude-3"),
        ("content", "s", "s"),  # only role/finish_reason/model values are abbreviated
        ("content", "~s", "~s"),
    ],
)
def test_values_escape(key: str, value: str, wire_value: str) -> None:
    x = {"w": {key: value}}
    (w,) = wire_obj(x)["w"].values()
    assert w == wire_value
    roundtrip(x)


def test_values_in_arrays_under_value_keys() -> None:
    x = {"model": ["gpt-4o", "4o", ["o3-mini", 1, None]], "role": [{"role": "tool"}]}
    assert wire_obj(x) == {"M": ["4o", "~4o", ["o3m", 1, None]], "r": [{"r": "t"}]}
    roundtrip(x)


def test_non_string_values_under_value_keys_untouched() -> None:
    for v in (None, 1, 1.5, True, {"role": "user"}):
        roundtrip({"role": v, "model": v, "finish_reason": v})


# ======================================================================================================
# Defaults.
# ======================================================================================================


def test_defaults_omitted_only_when_exact_and_restored_in_table_order() -> None:
    x: dict[str, Any] = {
        "stop": None,
        "messages": [],
        "temperature": 1.0,
        "top_p": 1,  # int 1 is not the default 1.0: kept
        "n": 1.0,  # float 1.0 is not the integer default 1: kept
        "stream": False,
        "frequency_penalty": 0.0,  # not the integer default 0: kept
        "presence_penalty": 0,
        "logit_bias": {},
    }
    wire, decoded = roundtrip(x)
    assert wire == '#T1|{"m":[],"p":1,"n":1.0,"f":0.0}'
    assert list(decoded) == ["messages", "top_p", "n", "frequency_penalty", "temperature", "stream",
                             "presence_penalty", "logit_bias", "stop"]  # fmt: skip


def test_bool_is_not_the_integer_default() -> None:
    wire, _ = roundtrip({"messages": [], "n": True, "presence_penalty": False})
    assert wire == '#T1|{"m":[],"n":true,"P":false}'


def test_non_default_values_preserved_exactly() -> None:
    x = {
        "messages": [],
        "temperature": 0.0,
        "top_p": 0.999,
        "n": 2,
        "stream": True,
        "frequency_penalty": -0.5,
        "presence_penalty": 2,
        "logit_bias": {"50256": -100},
        "stop": ["\n"],
    }
    wire, decoded = roundtrip(x)
    assert canon(decoded) == canon(x)
    assert wire == (
        '#T1|{"m":[],"T":0.0,"p":0.999,"n":2,"s":true,"f":-0.5,"P":2,"lb":{"50256":-100},"S":["\\n"]}'
    )


@pytest.mark.parametrize(
    "x",
    [
        {"choices": [], "messages": [], "temperature": 1.0},  # a response-like object
        {"model": "gpt-4o", "temperature": 1.0},  # no messages
        {"req": {"messages": [], "temperature": 1.0}},  # not the root
        [{"messages": [], "temperature": 1.0}],  # not the root
        {"messages": [], "metadata": {"temperature": 1.0, "stream": False}},  # nested members
    ],
)
def test_defaults_only_on_the_root_request_object(x: Any) -> None:
    wire, decoded = roundtrip(x)
    assert "1.0" in wire or "false" in wire
    if type(x) is dict and "messages" in x and "choices" not in x:
        assert "temperature" in decoded  # restored at the root only
        assert decoded["metadata"] == x["metadata"]
    else:
        assert canon(decoded) == canon(x)


def test_restored_defaults_decode_from_foreign_seed_wire() -> None:
    decoded = loads_limited(decode_t1('#T1|{"m":[{"r":"u","c":"x"}],"T":0.2}'))
    assert decoded == {
        "messages": [{"role": "user", "content": "x"}],
        "temperature": 0.2,
        "top_p": 1.0,
        "n": 1,
        "stream": False,
        "frequency_penalty": 0,
        "presence_penalty": 0,
        "logit_bias": {},
        "stop": None,
    }


# ======================================================================================================
# Everything else is kept.
# ======================================================================================================


def test_nulls_order_numbers_unicode_kept() -> None:
    x = {
        "zeta": None,
        "alpha": [None, {"content": None}],
        "big": 123456789012345678901234567890,
        "neg": -(10**40),
        "f": 1e-07,
        "g": 1.5e300,
        "z": -0.0,
        "one": 1.0,
        "uni": "héllo 👋 \u2028 中文 \x00\x1f",
        "中": {"é": "ü"},
    }
    wire, decoded = roundtrip(x)
    assert canon(decoded) == canon(x)
    assert "👋" in wire and "中文" in wire  # raw UTF-8, not \u escapes


def test_exponent_notation_is_kept_semantically() -> None:
    assert loads_limited(decode_t1(encode_t1('{"a":1E2,"b":-2.5e-3,"c":0e0}'))) == {"a": 100.0, "b": -0.0025,
                                                                                      "c": 0.0}  # fmt: skip


@pytest.mark.parametrize("x", [1, -2.5, "s", None, True, [], {}, [1, "m", {"c": 1}], "~"])
def test_non_object_roots(x: Any) -> None:
    roundtrip(x)


def test_pretty_input_becomes_compact() -> None:
    assert encode_t1('{\n  "model": "gpt-4o",\n  "messages": []\n}') == '#T1|{"M":"4o","m":[]}'


def test_object_level_functions_do_not_mutate() -> None:
    x = {"messages": [{"role": "user"}], "temperature": 1.0, "metadata": {"c": 1}}
    before = copy.deepcopy(x)
    w = compress_obj_t1(x)
    assert x == before
    w_before = copy.deepcopy(w)
    assert canon(expand_obj_t1(w)) == canon(restore(x))
    assert w == w_before


def test_expand_forced_seed_treats_markers_as_plain_keys() -> None:
    w = {"messages": [{"c": "x"}], "M": "g4o"}
    assert expand_obj_t1(w, dialect="seed") == {"messages": [{"content": "x"}], "model": "g4o",
                                                **dict(SEED_DEFAULTS)}  # fmt: skip
    assert expand_obj_t1(w)["model"] == "gpt-4o"  # auto: the reference dialect


# ======================================================================================================
# Property tests.
# ======================================================================================================

SEED_ORIGINAL_KEYS = [
    "messages", "content", "role", "model", "temperature", "max_tokens", "top_p", "stream", "stop",
    "frequency_penalty", "presence_penalty", "logit_bias", "user", "n", "seed", "tools", "tool_choice",
    "function_call", "functions", "response_format", "choices", "index", "message", "finish_reason",
    "usage", "prompt_tokens", "completion_tokens", "total_tokens", "delta", "logprobs", "tool_calls",
    "function", "name", "arguments", "type",
]  # fmt: skip
ABBREVIATIONS = [
    "m", "c", "r", "M", "T", "x", "p", "s", "S", "f", "P", "lb", "u", "n", "se", "ts", "tc", "fc", "fs",
    "rf", "C", "i", "fr", "U", "pt", "ct", "tt", "d", "lp", "fn", "a", "t",
    "tx", "tlp", "D", "sf", "E", "error", "system_fingerprint", "top_logprobs",
]  # fmt: skip
TRICKY = ["~", "~~", "~m", "~c", "~~n", "", "id", "object", "metadata", "m~"]
VALUE_WORDS = [
    "system", "user", "assistant", "function", "tool", "developer", "s", "u", "a", "f", "t", "S", "A",
    "F", "T", "stop", "length", "tool_calls", "content_filter", "function_call", "l", "tc", "cf", "fc",
    "gpt-4o", "gpt-4o-mini", "o1", "o3", "4o", "4om", "ml318", "mim-l", "mistralai/mixtral-8x7b",
    "g4o", "l318", "dc", "qc32", "~", "~s", "~4o", "",
]  # fmt: skip

keys_st = st.one_of(st.sampled_from(SEED_ORIGINAL_KEYS + ABBREVIATIONS + TRICKY), st.text(max_size=5))
strings_st = st.one_of(st.sampled_from(VALUE_WORDS), st.text(max_size=8))
any_json = json_values(keys_st, strings_st)

DEFAULT_LIKE_VALUES = [1.0, 1, 0, 0.0, -0.0, False, True, {}, None, [], "x", 2]
root_objects = st.builds(
    lambda head, params, tail: {**head, **params, **tail},
    st.dictionaries(keys_st, any_json, max_size=3),
    st.dictionaries(
        st.sampled_from([k for k, _ in SEED_DEFAULTS] + ["messages", "choices"]),
        st.one_of(st.sampled_from(DEFAULT_LIKE_VALUES), any_json),
        max_size=8,
    ),
    st.dictionaries(keys_st, any_json, max_size=3),
)


@SETTINGS
@given(st.one_of(any_json, root_objects))
def test_round_trip_arbitrary_json(x: Any) -> None:
    roundtrip(x)


# --- chat-shaped data ---------------------------------------------------------------------------------

roles = st.sampled_from(["system", "user", "assistant", "tool", "function", "developer", "s", "u"])
models = st.sampled_from(
    [
        "gpt-4o",
        "gpt-4o-mini",
        "o3-mini",
        "meta-llama/llama-3.1-8b",
        "mistralai/mistral-small",
        "claude-3-5-sonnet",
        "4o",
        "g4o",
        "llama-3.1-8b",
    ]
)
short_text = st.text(max_size=20)
tool_call = st.fixed_dictionaries(
    {
        "id": short_text,
        "type": st.just("function"),
        "function": st.fixed_dictionaries({"name": short_text, "arguments": short_text}),
    }
)
message = st.fixed_dictionaries(
    {"role": roles, "content": st.one_of(st.none(), short_text, st.lists(
        st.fixed_dictionaries({"type": st.just("text"), "text": short_text}), max_size=2))},
    optional={
        "name": st.one_of(short_text, st.none()),
        "tool_calls": st.one_of(st.lists(tool_call, max_size=2), st.none()),
        "tool_call_id": short_text,
    },
)  # fmt: skip
schema = st.recursive(
    st.fixed_dictionaries({"type": st.sampled_from(["string", "integer", "number"])}),
    lambda c: st.fixed_dictionaries(
        {"type": st.just("object"), "properties": st.dictionaries(keys_st, c, max_size=3)}
    ),
    max_leaves=4,
)
tool = st.fixed_dictionaries(
    {
        "type": st.just("function"),
        "function": st.fixed_dictionaries(
            {"name": short_text, "parameters": schema}, optional={"description": short_text}
        ),
    }
)
chat_request = st.fixed_dictionaries(
    {"model": models, "messages": st.lists(message, max_size=4)},
    optional={
        "temperature": st.sampled_from([1.0, 1, 0.7, 0.0, 2]),
        "top_p": st.sampled_from([1.0, 1, 0.9]),
        "n": st.sampled_from([1, 1.0, 2]),
        "stream": st.booleans(),
        "stop": st.one_of(st.none(), short_text, st.lists(short_text, max_size=2)),
        "max_tokens": st.integers(0, 10**6),
        "frequency_penalty": st.sampled_from([0, 0.0, 0.5]),
        "presence_penalty": st.sampled_from([0, 0.0, -1]),
        "logit_bias": st.one_of(st.just({}), st.dictionaries(st.text(max_size=5), st.integers(-100, 100))),
        "user": short_text,
        "seed": st.integers(),
        "tools": st.lists(tool, max_size=2),
        "tool_choice": st.one_of(st.sampled_from(["auto", "none", "required"]), st.none(),
                                 st.fixed_dictionaries({"type": st.just("function"), "function":
                                                        st.fixed_dictionaries({"name": short_text})})),
        "response_format": st.fixed_dictionaries({"type": st.sampled_from(["text", "json_object"])}),
        "metadata": any_json,
    },
)  # fmt: skip
finish_reasons = st.sampled_from(["stop", "length", "tool_calls", "content_filter", "function_call", "s"])
chat_response = st.fixed_dictionaries(
    {
        "id": short_text,
        "object": st.sampled_from(["chat.completion", "chat.completion.chunk"]),
        "created": st.integers(0, 2**40),
        "model": models,
        "choices": st.lists(
            st.fixed_dictionaries(
                {"index": st.integers(0, 5), "finish_reason": st.one_of(st.none(), finish_reasons)},
                optional={"message": message, "delta": message, "logprobs": st.none()},
            ),
            max_size=3,
        ),
    },
    optional={
        "usage": st.fixed_dictionaries({"prompt_tokens": st.integers(0, 10**6), "completion_tokens":
                                        st.integers(0, 10**6), "total_tokens": st.integers(0, 10**6)}),
        "system_fingerprint": st.one_of(st.none(), short_text),
    },
)  # fmt: skip


@SETTINGS
@given(st.one_of(chat_request, chat_response))
def test_round_trip_chat_payloads(x: dict[str, Any]) -> None:
    wire, _ = roundtrip(x)
    if all(type(v) is not dict for v in x.values()) and "~" not in dumps_compact(x):
        assert len(wire) < len(dumps_compact(x)) + 4


# ======================================================================================================
# Errors and limits.
# ======================================================================================================


@pytest.mark.parametrize("content", ["", "not json", "{", '{"a":1} trailing', "NaN", '"\ud800"'])
def test_non_json_content_is_encode_error(content: str) -> None:
    with pytest.raises(EncodeError):
        encode_t1(content)


def test_bad_arguments() -> None:
    with pytest.raises(EncodeError):
        encode_t1(b"{}")  # type: ignore[arg-type]
    with pytest.raises(EncodeError):
        encode_t1("{}", dialect="nope")  # type: ignore[arg-type]
    with pytest.raises(DecodeError):
        decode_t1(b"#T1|{}")  # type: ignore[arg-type]
    with pytest.raises(DecodeError):
        expand_obj_t1({}, dialect="nope")  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "wire", ["", "{}", "#T1{}", "#t1|{}", "#TK|C|sk0=", " #T1|{}", "#T1", "#T2|{}", "T1|{}"]
)
def test_wrong_prefix_is_decode_error(wire: str) -> None:
    with pytest.raises(DecodeError, match="prefix"):
        decode_t1(wire)


@pytest.mark.parametrize(
    "wire", ["#T1|", "#T1|{", '#T1|{"M":}', "#T1|{'a':1}", "#T1|{}{}", '#T1|{"c":"\x01"}', "#T1|\x01"]
)
def test_malformed_payload_is_decode_error(wire: str) -> None:
    with pytest.raises(DecodeError, match="T1 payload"):
        decode_t1(wire)


def test_pretty_printed_payload_is_accepted() -> None:
    # The reference decoder breaks on TAB/LF/CR (it expands them as patterns); JSON whitespace is fine here.
    assert decode_t1('#T1|{\n\t"c": "x"\n}') == '{"content":"x"}'


def test_limits_on_encode_and_decode() -> None:
    deep = "[" * 33 + "]" * 33
    with pytest.raises(LimitExceeded, match="max_json_depth"):
        encode_t1(deep)
    with pytest.raises(LimitExceeded, match="max_json_depth"):
        decode_t1("#T1|" + deep)
    with pytest.raises(LimitExceeded):
        decode_t1("#T1|" + "[" * 100_000)
    many = "[" + ",".join(["1"] * 10_001) + "]"
    with pytest.raises(LimitExceeded, match="max_array_elements"):
        encode_t1(many)
    with pytest.raises(LimitExceeded, match=r"\$\.messages\[0\]"):
        decode_t1('#T1|{"messages":[' + many + "]}")
    with pytest.raises(LimitExceeded, match=r"\$\.metadata\.c"):
        decode_t1('#T1|{"metadata":{"c":"' + "x" * 11 + '"}}', limits=Limits(max_string_bytes=10))
    with pytest.raises(LimitExceeded, match="bytes"):
        decode_t1('#T1|{"c":"' + "x" * 20 + '"}', limits=Limits(max_message_bytes=20))
    with pytest.raises(LimitExceeded, match="bytes"):
        encode_t1('{"c":"' + "x" * 20 + '"}', limits=Limits(max_message_bytes=20))


def test_wire_size_counts_the_prefix() -> None:
    wire = '#T1|{"c":"xxxxxxxx"}'  # 20 bytes
    assert decode_t1(wire, limits=Limits(max_message_bytes=20)) == '{"content":"xxxxxxxx"}'
    with pytest.raises(LimitExceeded):
        decode_t1(wire, limits=Limits(max_message_bytes=19))


def test_decoded_output_limit() -> None:
    wire = "#T1|[" + ",".join(['{"fc":1}'] * 100) + "]"
    with pytest.raises(LimitExceeded, match="decoded"):
        decode_t1(wire, limits=Limits(max_output_bytes=len(wire)))
    assert len(decode_t1(wire)) > 2 * len(wire)


@st.composite
def mutated_wires(draw: st.DrawFn) -> str:
    x = draw(st.one_of(chat_request, any_json))
    wire = encode_t1(dumps_compact(x))
    for _ in range(draw(st.integers(1, 3))):
        op = draw(st.sampled_from(["truncate", "replace", "insert", "delete"]))
        i = draw(st.integers(0, len(wire)))
        ch = draw(st.one_of(st.sampled_from(list('{}[]",:~\\ 0e-.#|')), st.characters()))
        if op == "truncate":
            wire = wire[:i]
        elif op == "replace":
            wire = wire[:i] + ch + wire[i + 1 :]
        elif op == "insert":
            wire = wire[:i] + ch + wire[i:]
        else:
            wire = wire[:i] + wire[i + 1 :]
    return wire


@SETTINGS
@given(st.one_of(mutated_wires(), st.text(max_size=30).map(lambda s: "#T1|" + s)))
def test_mutated_wires_only_raise_decode_errors(wire: str) -> None:
    try:
        out = decode_t1(wire)
    except (DecodeError, LimitExceeded):
        return
    assert isinstance(out, str)
    loads_limited(out)
