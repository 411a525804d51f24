"""Tests for m2mwire.codecs.jsonutil: limits (with JSON paths), hostile nesting, compact output."""

from __future__ import annotations

import tracemalloc
from typing import Any
from unittest.mock import patch

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from m2mwire.codecs import jsonutil
from m2mwire.codecs.jsonutil import (
    _scan,
    check_json_limits,
    check_json_text,
    dumps_compact,
    json_cost,
    json_path,
    loads_limited,
    parse_json,
)
from m2mwire.codecs.limits import DEFAULT_LIMITS, Limits
from m2mwire.errors import DecodeError, EncodeError, LimitExceeded

# --- shared helpers (also imported by the T1 tests) -------------------------------------------------------


def canon(x: Any) -> Any:
    """A form of a JSON value whose == is strict: key order, int vs float vs bool, -0.0 all matter."""
    t = type(x)
    if t is dict:
        return ("obj", tuple((k, canon(v)) for k, v in x.items()))
    if t is list:
        return ("arr", tuple(canon(v) for v in x))
    if t is float:
        return ("float", x.hex())
    if t is int:
        return ("int", x)
    if t is bool:
        return ("bool", x)
    return (t.__name__, x)


def json_values(keys: st.SearchStrategy[str] | None = None, strings: st.SearchStrategy[str] | None = None,
                max_leaves: int = 25) -> st.SearchStrategy[Any]:  # fmt: skip
    """Arbitrary JSON values (no NaN/inf; ints of any size)."""
    keys = keys if keys is not None else st.text(max_size=8)
    strings = strings if strings is not None else st.text(max_size=12)
    scalars = st.one_of(
        st.none(),
        st.booleans(),
        st.integers(),
        st.floats(allow_nan=False, allow_infinity=False),
        strings,
    )
    return st.recursive(
        scalars,
        lambda children: st.one_of(
            st.lists(children, max_size=5), st.dictionaries(keys, children, max_size=6)
        ),
        max_leaves=max_leaves,
    )


SETTINGS = settings(max_examples=200, deadline=None)


# --- dumps_compact --------------------------------------------------------------------------------------


def test_dumps_compact_is_compact_and_keeps_number_types() -> None:
    obj = {"b": [1, 1.0, -0.0, 10**30, 1e-7, True, None], "a": {"x": "y"}}
    assert (
        dumps_compact(obj)
        == '{"b":[1,1.0,-0.0,1000000000000000000000000000000,1e-7,true,null],"a":{"x":"y"}}'
    )


def test_dumps_compact_sort_keys() -> None:
    assert dumps_compact({"b": 1, "a": {"d": 1, "c": 2}, "B": 0}, sort_keys=True) == (
        '{"B":0,"a":{"c":2,"d":1},"b":1}'
    )


def test_dumps_compact_raw_unicode_escaped_controls() -> None:
    s = "é😀\u2028" + "".join(chr(c) for c in range(0x20)) + '"\\'
    out = dumps_compact(s)
    assert "é😀\u2028" in out
    assert all(ord(ch) >= 0x20 for ch in out), "no raw control characters"
    assert loads_limited(out) == s


def test_dumps_compact_rejects_unencodable() -> None:
    with pytest.raises(EncodeError):
        dumps_compact({"a": object()})
    with pytest.raises(EncodeError):
        dumps_compact({None: 1})


@SETTINGS
@given(json_values())
def test_dumps_loads_round_trip_strict(x: Any) -> None:
    text = dumps_compact(x)
    assert all(ord(ch) >= 0x20 for ch in text)
    assert canon(loads_limited(text)) == canon(x)
    assert canon(loads_limited(text.encode())) == canon(x)


# --- loads_limited: errors ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "text", ["", "{", '{"a":1,}', "[1,2", "01", '"\\x"', "NaN", "tru", '{"a":1} x', '"a\x01"', "\ufeff{}"]
)
def test_malformed_json_is_decode_error(text: str) -> None:
    with pytest.raises(DecodeError, match="not valid JSON"):
        loads_limited(text)


def test_malformed_json_reports_position() -> None:
    with pytest.raises(DecodeError, match=r"byte 7"):
        loads_limited('{"a":1,}')


@pytest.mark.parametrize("data", [b'"\xff"', b'"\xed\xa0\x80"', b'{"a":"\xc3"}', b"\xfe{}"])
def test_invalid_utf8_bytes_is_decode_error(data: bytes) -> None:
    with pytest.raises(DecodeError):
        loads_limited(data)


def test_lone_surrogate_str_is_decode_error() -> None:
    with pytest.raises(DecodeError, match="UTF-8"):
        loads_limited('"\ud800"')


def test_number_out_of_float_range_is_decode_error() -> None:
    with pytest.raises(DecodeError):
        loads_limited("1e400")


def test_non_text_input_is_decode_error() -> None:
    with pytest.raises(DecodeError):
        loads_limited(123)  # type: ignore[arg-type]


def test_parses_ints_of_any_size_and_whitespace() -> None:
    assert loads_limited(' { "a" : [ 123456789012345678901234567890 , -0.0 ] }\n') == {
        "a": [123456789012345678901234567890, -0.0]
    }


# --- loads_limited: size ----------------------------------------------------------------------------------


def test_message_size_limit_counts_utf8_bytes() -> None:
    lim = Limits(max_message_bytes=8)
    assert loads_limited('"123456"', limits=lim) == "123456"  # 8 bytes: at the limit
    with pytest.raises(LimitExceeded, match="max_message_bytes") as exc:
        loads_limited('"12345é"', limits=lim)  # 7 characters, 9 bytes
    assert exc.value.limit == 8 and exc.value.actual == 9
    with pytest.raises(LimitExceeded):
        loads_limited(b'"1234567"', limits=lim)


def test_oversized_str_refused_before_encoding() -> None:
    with pytest.raises(LimitExceeded):
        loads_limited("[" + "1," * 100 + "1]", limits=Limits(max_message_bytes=100))


# --- loads_limited: depth ------------------------------------------------------------------------------


def test_depth_counting() -> None:
    lim = Limits(max_json_depth=1)
    for ok in ["1", '"s"', "[]", "{}", '{"a":1}', '[1,"x",null]']:
        loads_limited(ok, limits=lim)
    for bad in ["[[]]", '{"a":{}}', '[{"a":1}]']:
        with pytest.raises(LimitExceeded, match="max_json_depth=1"):
            loads_limited(bad, limits=lim)
    with pytest.raises(LimitExceeded):
        loads_limited("1", limits=Limits(max_json_depth=0))


def test_depth_32_accepted_33_refused_with_path() -> None:
    assert loads_limited("[" * 32 + "]" * 32) is not None
    with pytest.raises(LimitExceeded) as exc:
        loads_limited("[" * 33 + "]" * 33)
    assert "max_json_depth=32" in str(exc.value)
    assert "$" + "[0]" * 32 in str(exc.value)
    assert exc.value.limit == 32


def test_depth_path_through_objects() -> None:
    text = '{"messages":[{},{"content":' + "[" * 31 + "]" * 31 + "}]}"
    with pytest.raises(LimitExceeded) as exc:
        loads_limited(text)
    assert "$.messages[1].content" + "[0]" * 28 in str(exc.value)


@pytest.mark.parametrize(
    "text",
    [
        "[" * 100_000,
        "[" * 100_000 + "]" * 100_000,
        '{"a":' * 100_000 + "1" + "}" * 100_000,
        "[" * 300 + "]" * 300,
    ],
)
def test_hostile_nesting_never_recursion_error(text: str) -> None:
    with pytest.raises(LimitExceeded, match="max_json_depth"):
        loads_limited(text)


def test_brackets_inside_strings_do_not_count() -> None:
    text = '["' + "[" * 100_000 + '", "\\"[[[", ' + ",".join(["[]"] * 300) + "]"
    assert len(loads_limited(text)) == 302


def test_many_shallow_containers_pass_the_prescan() -> None:
    text = "[" + ",".join(['{"a":[1]}'] * 5000) + "]"
    assert len(loads_limited(text)) == 5000


def test_moderately_deep_text_allowed_by_raised_limit() -> None:
    # 200 levels: below the pre-scan threshold, parsed and checked with a raised limit.
    value = loads_limited("[" * 200 + "]" * 200, limits=Limits(max_json_depth=200))
    for _ in range(199):
        (value,) = value
    assert value == []
    with pytest.raises(LimitExceeded):
        loads_limited("[" * 200 + "]" * 200, limits=Limits(max_json_depth=199))


# --- loads_limited: strings and arrays ------------------------------------------------------------------


def test_string_limit_counts_utf8_and_names_path() -> None:
    lim = Limits(max_string_bytes=8)
    assert loads_limited('{"k":"éééé"}', limits=lim) == {"k": "éééé"}  # 8 bytes
    with pytest.raises(LimitExceeded) as exc:
        loads_limited('{"messages":[{},{},{},{"content":"ééééx"}]}', limits=lim)
    assert "a string at $.messages[3].content" in str(exc.value) and "max_string_bytes=8" in str(exc.value)
    assert exc.value.actual == 9


def test_string_limit_applies_to_keys() -> None:
    with pytest.raises(LimitExceeded, match=r"object key at \$\.a\.abcdef"):
        loads_limited('{"a":{"abcdef":1}}', limits=Limits(max_string_bytes=5))


def test_string_limit_top_level_and_in_arrays() -> None:
    lim = Limits(max_string_bytes=2)
    with pytest.raises(LimitExceeded, match=r"at \$ "):
        loads_limited('"abc"', limits=lim)
    with pytest.raises(LimitExceeded, match=r"at \$\[1\]"):
        loads_limited('["a","abc"]', limits=lim)


def test_default_string_limit_is_10_mib() -> None:
    big = "x" * (10 * 1024 * 1024)
    assert len(loads_limited(f'"{big}"')) == len(big)
    with pytest.raises(LimitExceeded, match="max_string_bytes"):
        loads_limited(f'"{big}x"')


def test_array_limit() -> None:
    assert len(loads_limited("[" + ",".join(["0"] * 10_000) + "]")) == 10_000
    with pytest.raises(LimitExceeded) as exc:
        loads_limited('{"a b":[' + ",".join(["0"] * 10_001) + "]}")
    assert '$["a b"]' in str(exc.value) and "max_array_elements=10000" in str(exc.value)
    assert exc.value.actual == 10_001


def test_check_json_limits_on_objects() -> None:
    check_json_limits({"a": [1, 2, 3]}, limits=Limits(max_array_elements=3))
    with pytest.raises(LimitExceeded, match=r"\$\.a"):
        check_json_limits({"a": [1, 2, 3, 4]}, limits=Limits(max_array_elements=3))


def test_json_path_rendering() -> None:
    assert json_path([]) == "$"
    assert json_path(["messages", 3, "content"]) == "$.messages[3].content"
    assert json_path(["a b", "é", "_x1", 0]) == '$["a b"]["é"]._x1[0]'


def test_default_limits_are_the_seed_values() -> None:
    assert DEFAULT_LIMITS.max_message_bytes == 16 * 1024 * 1024
    assert DEFAULT_LIMITS.max_json_depth == 32
    assert DEFAULT_LIMITS.max_string_bytes == 10 * 1024 * 1024
    assert DEFAULT_LIMITS.max_array_elements == 10_000


def test_canon_is_strict() -> None:
    assert canon({"a": 1, "b": 2}) != canon({"b": 2, "a": 1})
    assert canon(1) != canon(1.0) != canon(True)
    assert canon(0.0) != canon(-0.0)


@SETTINGS
@given(json_values(), st.integers(0, 6), st.integers(0, 12), st.integers(0, 6))
def test_fast_path_never_changes_the_verdict(x: Any, depth: int, string_bytes: int, elements: int) -> None:
    """loads_limited may skip the structure walk when byte counts prove the limits hold; the verdict
    must be the same as a full walk's."""
    lim = Limits(max_json_depth=depth, max_string_bytes=string_bytes, max_array_elements=elements)
    try:
        check_json_limits(x, limits=lim)
        expected = True
    except LimitExceeded:
        expected = False
    try:
        loads_limited(dumps_compact(x), limits=lim)
        got = True
    except LimitExceeded:
        got = False
    assert got == expected


# --- limits enforced before parsing (issue 11.9) -------------------------------------------------------

TRICKY = st.text(alphabet='[]{},:"\\ab\u00e9', max_size=10)


@SETTINGS
@given(json_values(keys=TRICKY, strings=TRICKY, max_leaves=40), st.integers(1, 6), st.integers(1, 6))
def test_scan_measures_exactly_what_the_walk_measures(x: Any, depth: int, elements: int) -> None:
    """The byte scan that refuses texts before parsing must agree with a walk of the parsed value,
    whatever brackets, commas, quotes and backslashes the strings hold."""
    lim = Limits(max_json_depth=depth, max_array_elements=elements)
    try:
        check_json_limits(x, limits=lim)
        expected = True
    except LimitExceeded:
        expected = False
    for chunk in (7, 1 << 20):  # 7-byte slices: strings and containers span slices
        with patch.object(jsonutil, "_SCAN_CHUNK", chunk):
            try:
                _scan(dumps_compact(x).encode(), lim, "JSON")
                got = True
            except LimitExceeded:
                got = False
        assert got == expected, chunk


def test_an_over_long_array_is_refused_before_it_is_parsed() -> None:
    # 1.4 M empty objects in one array (4 MiB): parsing it first held ~24 bytes per byte of text;
    # the scan holds the text, its structural bytes and their levels (~5 bytes per byte).
    text = "[" + "{}," * (4 * 1024 * 1024 // 3) + "{}]"
    tracemalloc.start()
    try:
        with pytest.raises(LimitExceeded, match="more than 10000 elements") as exc:
            loads_limited(text)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert exc.value.limit == 10_000
    assert peak < 8 * len(text), f"peak {peak} for {len(text)} bytes of text"


def test_deep_nesting_in_a_large_text_is_refused_before_parsing() -> None:
    text = "[" + "1," * 100_000 + "[" * 40 + "]" * 40 + "]"
    with pytest.raises(LimitExceeded, match=r"nests at least \d+ levels deep, over max_json_depth=32") as exc:
        loads_limited(text)
    assert exc.value.limit == 32


def test_check_json_text_is_the_receivers_check_without_the_value() -> None:
    ok = dumps_compact({"a": [1, 2, 3]})
    assert check_json_text(ok) == parse_json(ok).cost == json_cost(ok.encode())
    for bad in ("[" * 33 + "]" * 33, "[" + ",".join("0" * 10_001) + "]"):
        with pytest.raises(LimitExceeded):
            check_json_text(bad)
        with pytest.raises(LimitExceeded):
            loads_limited(bad)


def test_strings_longer_than_the_limit_in_total_are_still_checked_one_by_one() -> None:
    lim = Limits(max_string_bytes=10)
    assert loads_limited('["0123456789","0123456789"]', limits=lim) == ["0123456789"] * 2
    with pytest.raises(LimitExceeded, match=r"at \$\[1\]"):
        loads_limited('["0123456789","0123456789x"]', limits=lim)
