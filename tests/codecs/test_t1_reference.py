"""T1 against the existing (Rust) implementation: its vectors, its dialect, and where it conflicts with ours.

Vectors: tests/data/m2m-reference-vectors.json (key ``token_t1`` and friends; copied from the steering
repository's shared/reference), restated here so each test reads as a table.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given

from m2mwire.codecs.jsonutil import dumps_compact, loads_limited
from m2mwire.codecs.t1 import decode_t1, detect_t1_dialect, encode_t1, expand_obj_t1
from tests.codecs.test_jsonutil import SETTINGS, canon
from tests.codecs.test_t1 import any_json

# (input or None, wire, decompressed) - reference vectors `token_t1`, in file order.
TOKEN_T1: list[tuple[str | None, str, str]] = [
    (
        '{"model":"gpt-4o","messages":[{"role":"system","content":"You are helpful."},{"role":"user",'
        '"content":"Hello!"}],"temperature":1.0,"max_tokens":100,"stream":false}',
        '#T1|{"M":"g4o","messages":[{"c":"You are helpful.","role":"S"},{"c":"Hello!","role":"user"}],'
        '"x":100}',
        '{"frequency_penalty":0,"max_tokens":100,"messages":[{"content":"You are helpful.","role":"system"},'
        '{"content":"Hello!","role":"user"}],"model":"gpt-4o","n":1,"presence_penalty":0,"stream":false,'
        '"temperature":1.0,"top_p":1.0}',
    ),
    (
        '{"model":"gpt-4o","messages":[{"role":"system","content":"You are a helpful assistant."},'
        '{"role":"user","content":"What is the capital of France?"}],"temperature":0.7,"max_tokens":100}',
        '#T1|{"M":"g4o","T":0.7,"messages":[{"c":"You are a helpful assistant.","role":"S"},'
        '{"c":"What is the capital of France?","role":"user"}],"x":100}',
        '{"frequency_penalty":0,"max_tokens":100,"messages":[{"content":"You are a helpful assistant.",'
        '"role":"system"},{"content":"What is the capital of France?","role":"user"}],"model":"gpt-4o",'
        '"n":1,"presence_penalty":0,"stream":false,"temperature":0.7,"top_p":1.0}',
    ),
    (
        '{"id":"chatcmpl-abc123","object":"chat.completion","created":1705520400,"model":"gpt-4o",'
        '"choices":[{"index":0,"message":{"role":"assistant","content":"The capital of France is Paris."},'
        '"finish_reason":"stop"}],"usage":{"prompt_tokens":25,"completion_tokens":8,"total_tokens":33}}',
        '#T1|{"C":[{"fr":"stop","index":0,"message":{"c":"The capital of France is Paris.","role":"A"}}],'
        '"M":"g4o","created":1705520400,"id":"chatcmpl-abc123","object":"chat.completion",'
        '"usage":{"ct":8,"pt":25,"tt":33}}',
        '{"choices":[{"finish_reason":"stop","index":0,"message":{"content":"The capital of France is '
        'Paris.","role":"assistant"}}],"created":1705520400,"frequency_penalty":0,"id":"chatcmpl-abc123",'
        '"model":"gpt-4o","n":1,"object":"chat.completion","presence_penalty":0,"stream":false,'
        '"temperature":1.0,"top_p":1.0,"usage":{"completion_tokens":8,"prompt_tokens":25,"total_tokens":33}}',
    ),
    (
        '{"model":"gpt-4o-mini","messages":[{"role":"assistant","content":null,"tool_calls":[{"id":"call_1",'
        '"type":"function","function":{"name":"f","arguments":"{}"}}]},{"role":"tool","content":"42",'
        '"tool_call_id":"call_1"}],"tools":[{"type":"function","function":{"name":"f","parameters":'
        '{"type":"object","properties":{"n":{"type":"integer"}}}}}],"tool_choice":"auto","top_p":1,"n":1,'
        '"frequency_penalty":0.0,"presence_penalty":0,"logit_bias":{},"stop":null,"user":"u1","seed":7}',
        '#T1|{"M":"g4om","messages":[{"role":"A","tc":[{"function":{"a":"{}","name":"f"},"id":"call_1",'
        '"type":"function"}]},{"c":"42","role":"T","tool_call_id":"call_1"}],"seed":7,"tools":[{"function":'
        '{"name":"f","parameters":{"properties":{"n":{"type":"integer"}},"type":"object"}},"type":"function"}],'
        '"tx":"auto","user":"u1"}',
        '{"frequency_penalty":0,"messages":[{"role":"assistant","tool_calls":[{"function":{"arguments":"{}",'
        '"name":"f"},"id":"call_1","type":"function"}]},{"content":"42","role":"tool","tool_call_id":'
        '"call_1"}],"model":"gpt-4o-mini","n":1,"presence_penalty":0,"seed":7,"stream":false,"temperature":'
        '1.0,"tool_choice":"auto","tools":[{"function":{"name":"f","parameters":{"properties":{"n":{"type":'
        '"integer"}},"type":"object"}},"type":"function"}],"top_p":1.0,"user":"u1"}',
    ),
    (
        '{"model":"unknown-model","messages":[{"role":"developer","content":"x"}],"stream":true,"n":2}',
        '#T1|{"M":"unknown-model","messages":[{"c":"x","role":"developer"}],"n":2,"s":true}',
        '{"frequency_penalty":0,"messages":[{"content":"x","role":"developer"}],"model":"unknown-model",'
        '"n":2,"presence_penalty":0,"stream":true,"temperature":1.0,"top_p":1.0}',
    ),
    (
        None,
        '#T1|{"M":"g4o","messages":[{"c":"Hi","role":"user"}]}',
        '{"frequency_penalty":0,"messages":[{"content":"Hi","role":"user"}],"model":"gpt-4o","n":1,'
        '"presence_penalty":0,"stream":false,"temperature":1.0,"top_p":1.0}',
    ),
    (
        None,
        '#T1|{"M":"g4o","messages":[{"c":"Hi","role":"S"}],"T":0.5}',
        '{"frequency_penalty":0,"messages":[{"content":"Hi","role":"system"}],"model":"gpt-4o","n":1,'
        '"presence_penalty":0,"stream":false,"temperature":0.5,"top_p":1.0}',
    ),
    (
        '{"model":"x","messages":[],"metadata":{"n":1,"p":1.0,"s":false,"c":"keep","role":"A","temperature":1}}',
        '#T1|{"M":"x","messages":[],"metadata":{"c":"keep","role":"A"}}',
        '{"frequency_penalty":0,"messages":[],"metadata":{"content":"keep","role":"assistant"},"model":"x",'
        '"n":1,"presence_penalty":0,"stream":false,"temperature":1.0,"top_p":1.0}',
    ),
]

# The vector whose decode_only_wire is written in the *seed* dialect: the reference does not understand it.
SEED_STYLE_WIRE = '#T1|{"M":"4o","m":[{"r":"u","c":"Hi"}]}'
SEED_STYLE_REFERENCE_OUTPUT = (
    '{"frequency_penalty":0,"m":[{"content":"Hi","r":"u"}],"model":"4o","n":1,"presence_penalty":0,'
    '"stream":false,"temperature":1.0,"top_p":1.0}'
)


@pytest.mark.parametrize(("original", "wire", "decompressed"), [v for v in TOKEN_T1 if v[0] is not None])
def test_reference_encoder_reproduces_wire_byte_for_byte(original: str, wire: str, decompressed: str) -> None:
    assert encode_t1(original, dialect="reference") == wire


@pytest.mark.parametrize(("original", "wire", "decompressed"), TOKEN_T1)
def test_reference_wires_decode_like_the_reference(
    original: str | None, wire: str, decompressed: str
) -> None:
    assert detect_t1_dialect(wire) == "reference"
    # Same JSON value - and in fact the same bytes, since reference-dialect output is key-sorted too.
    assert canon(json.loads(decode_t1(wire))) == canon(json.loads(decompressed))
    assert decode_t1(wire) == decompressed


def test_restated_vectors_match_the_reference_file(m2m_vectors: dict[str, Any]) -> None:
    vectors = m2m_vectors["token_t1"]
    restated = [(v.get("input"), v.get("wire") or v["decode_only_wire"], v["decompressed"]) for v in vectors]
    ours = [*TOKEN_T1[:5], (None, SEED_STYLE_WIRE, SEED_STYLE_REFERENCE_OUTPUT), *TOKEN_T1[5:]]
    assert restated == ours


def test_seed_style_vector_is_read_with_the_seed_meaning() -> None:
    # Deliberate deviation: the reference leaves m/r/u/4o unexpanded; the seed defines them.
    assert detect_t1_dialect(SEED_STYLE_WIRE) == "seed"
    decoded = json.loads(decode_t1(SEED_STYLE_WIRE))
    assert decoded["model"] == "gpt-4o"
    assert decoded["messages"] == [{"role": "user", "content": "Hi"}]
    assert decode_t1(SEED_STYLE_WIRE) != SEED_STYLE_REFERENCE_OUTPUT


def test_patterns_on_vector_decodes() -> None:
    # token_t1_patterns_on: with patterns enabled the reference produced the same plain wire.
    assert json.loads(decode_t1('#T1|{"M":"g4o","messages":[{"c":"Hello","role":"user"}]}'))["messages"] == [
        {"content": "Hello", "role": "user"}
    ]


def test_pretty_hazard_vector_is_decoded_not_broken() -> None:
    # token_t1_pretty_hazard: the reference fails with "key must be a string"; for us it is JSON whitespace.
    assert decode_t1('#T1|{\n\t"c": "x"\n}') == '{"content":"x"}'


# --- the reference dialect's behaviour, beyond the vectors ---------------------------------------------


def test_reference_encoder_is_lossy_like_the_reference() -> None:
    original = {
        "model": "gpt-4",
        "messages": [{"role": "tool", "content": None, "name": "n1"}],
        "meta": {"top_p": 1.0004, "T": 0.9995, "f": 0.0, "P": -0.0, "lb": {}, "stream": False, "n": 1.0,
                 "keep": None, "r": "system", "M": "deepseek-r1"},
        "c": "user-key",
        "content": "real",
    }  # fmt: skip
    wire = encode_t1(json.dumps(original), dialect="reference")
    assert wire == (
        '#T1|{"M":"g4","c":"real","messages":[{"name":"n1","role":"T"}],"meta":{"M":"dr1","n":1.0,"r":"S"}}'
    )


def test_reference_arrays_inherit_value_tables() -> None:
    wire = encode_t1('{"model":["gpt-4o",["gpt-4"]],"role":["system","user"]}', dialect="reference")
    assert wire == '#T1|{"M":["g4o",["g4"]],"role":["S","user"]}'
    assert json.loads(decode_t1(wire))["model"] == ["gpt-4o", ["gpt-4"]]


def test_reference_mode_decodes_literal_seed_abbreviations_as_plain_keys() -> None:
    # In a reference wire, "m", "r", "u", "t" ... are whatever the sender's user keys were.
    wire = '#T1|{"M":"g4o","messages":[],"meta":{"m":1,"r":"s","t":2,"~c":3,"c":4}}'
    decoded = json.loads(decode_t1(wire))
    assert decoded["meta"] == {"content": 4, "m": 1, "r": "s", "t": 2, "~c": 3}


def test_reference_restoration_rules() -> None:
    # Six defaults (not logit_bias/stop), on the first object with messages/model on each path.
    decoded = json.loads(decode_t1('#T1|[{"index":0,"w":{"M":"a","y":{"M":"b"}}},{"messages":[]}]'))
    assert decoded[0]["w"]["top_p"] == 1.0 and "top_p" not in decoded[0]["w"]["y"]
    assert "top_p" not in decoded[0]
    assert set(decoded[1]) == {"messages", "temperature", "top_p", "n", "stream", "frequency_penalty",
                               "presence_penalty"}  # fmt: skip


@pytest.mark.parametrize(
    "marker", ["messages", "role", "message", "index", "usage", "user", "seed", "tools", "functions",
               "function", "name", "type", "tx", "tlp", "D", "sf", "E"]
)  # fmt: skip
def test_every_marker_key_selects_the_reference_dialect(marker: str) -> None:
    assert detect_t1_dialect(f'#T1|{{"a":[{{"{marker}":0}}]}}') == "reference"
    assert detect_t1_dialect(f'#T1|{{"a":[{{"~{marker}":0}}]}}') == "seed"


@pytest.mark.parametrize("model", ["g4o", "g4om", "l3370", "mll", "dc", "qc32"])
def test_reference_model_abbreviation_selects_the_reference_dialect(model: str) -> None:
    assert detect_t1_dialect(f'#T1|{{"M":"{model}"}}') == "reference"
    assert detect_t1_dialect(f'#T1|{{"M":"~{model}"}}') == "seed"
    assert detect_t1_dialect(f'#T1|{{"c":"{model}"}}') == "seed"


def test_wire_without_markers_is_read_as_seed() -> None:
    # A reference wire with no marker decodes the seed way; identical unless it holds literal seed
    # abbreviations or an object with "model" (the reference would add its six defaults there).
    assert detect_t1_dialect('#T1|{"M":"text-embedding-3-small","input":"x"}') == "seed"
    assert decode_t1('#T1|{"M":"text-embedding-3-small","input":"x"}') == (
        '{"model":"text-embedding-3-small","input":"x"}'
    )


@SETTINGS
@given(any_json)
def test_reference_encoder_output_is_sorted_compact_null_free_and_decodable(x: Any) -> None:
    wire = encode_t1(dumps_compact(x), dialect="reference")
    assert all(ord(ch) >= 0x20 for ch in wire)
    payload = loads_limited(wire[4:])
    assert wire[4:] == dumps_compact(payload, sort_keys=True)
    assert not _has_null_member(payload), "the reference drops every null member"
    assert canon(loads_limited(decode_t1(wire))) == canon(loads_limited(decode_t1(wire)))  # deterministic
    expand_obj_t1(payload, dialect="reference")


def _has_null_member(v: Any) -> bool:
    if type(v) is list:
        return any(_has_null_member(e) for e in v)
    if type(v) is dict:
        return any(e is None or _has_null_member(e) for e in v.values())
    return False
