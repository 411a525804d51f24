"""LEB128 varint streams and strict base64."""

from __future__ import annotations

import base64
import binascii
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from m2mwire.codecs.varint import (
    b64decode,
    b64encode,
    pack_varints,
    unpack_varints,
    unpack_varints_numpy,
    utf8,
)
from m2mwire.errors import DecodeError, EncodeError

SETTINGS = settings(max_examples=150, deadline=None)
UINT32 = st.integers(min_value=0, max_value=2**32 - 1)


@pytest.mark.parametrize(
    ("value", "encoded"),
    [
        (0, "00"),
        (1, "01"),
        (127, "7f"),
        (128, "8001"),
        (300, "ac02"),
        (9906, "b24d"),
        (16383, "ff7f"),
        (16384, "808001"),
        (100257, "a18f06"),
        (2**32 - 1, "ffffffff0f"),
    ],
)
def test_unit_vectors(value: int, encoded: str) -> None:
    assert pack_varints([value]).hex() == encoded
    assert unpack_varints(bytes.fromhex(encoded)) == [value]
    assert unpack_varints_numpy(bytes.fromhex(encoded)) == [value]


def test_concatenated_stream() -> None:
    assert pack_varints([9906, 11, 1917, 0]).hex() == "b24d0bfd0e00"
    assert unpack_varints(bytes.fromhex("b24d0bfd0e00")) == [9906, 11, 1917, 0]
    assert pack_varints([]) == b"" and unpack_varints(b"") == [] and unpack_varints_numpy(b"") == []


@pytest.mark.parametrize("bad", [-1, 2**32, 2**40])
def test_pack_rejects_out_of_range(bad: int) -> None:
    with pytest.raises(ValueError, match="unsigned 32-bit"):
        pack_varints([1, bad])


@pytest.mark.parametrize("decoder", [unpack_varints, unpack_varints_numpy])
@pytest.mark.parametrize(
    ("data", "message"),
    [
        ("80", r"truncated varint: .* starting at byte offset 0"),
        ("0180", r"truncated varint: .* starting at byte offset 1"),
        ("01ffffff", r"truncated varint: .* starting at byte offset 1"),
        ("018080808080 00", r"over-long varint at byte offset 1: more than 5 bytes"),
        ("8080808010", r"varint at byte offset 0 is 4294967296, not below 2\*\*32"),
        ("00ffffffff7f", r"varint at byte offset 1 is 34359738367, not below 2\*\*32"),
    ],
)
def test_unpack_rejects(decoder: object, data: str, message: str) -> None:
    with pytest.raises(DecodeError, match=message):
        decoder(bytes.fromhex(data.replace(" ", "")))  # type: ignore[operator]


def test_non_minimal_varints_are_accepted_like_the_reference() -> None:
    # LEB128 padding is legal as long as the varint fits in 5 bytes and 32 bits.
    assert unpack_varints(bytes.fromhex("8000")) == [0]
    assert unpack_varints(bytes.fromhex("81808080 00".replace(" ", ""))) == [1]
    assert unpack_varints(bytes.fromhex("0a8180808000")) == [10, 1]


@SETTINGS
@given(st.lists(UINT32, max_size=300))
def test_roundtrip(values: list[int]) -> None:
    packed = pack_varints(values)
    assert unpack_varints(packed) == values
    assert unpack_varints_numpy(packed) == values


@SETTINGS
@given(st.lists(st.integers(min_value=0, max_value=300_000), max_size=300))
def test_roundtrip_token_sized(values: list[int]) -> None:
    assert unpack_varints(pack_varints(values)) == values


@SETTINGS
@given(st.binary(max_size=64))
def test_fast_and_numpy_paths_agree_on_any_bytes(data: bytes) -> None:
    try:
        fast: list[int] | str = unpack_varints(data)
    except DecodeError as exc:
        fast = str(exc)
    try:
        slow: list[int] | str = unpack_varints_numpy(data)
    except DecodeError as exc:
        slow = str(exc)
    assert type(fast) is type(slow)
    if isinstance(fast, list):
        assert fast == slow


# --- base64 --------------------------------------------------------------------------------------------


def test_b64_roundtrip_known() -> None:
    assert b64encode(bytes.fromhex("b24d0bfd0e00")) == "sk0L/Q4A"
    assert b64encode(b"\xb2M") == "sk0="
    assert b64decode("sk0L/Q4A") == bytes.fromhex("b24d0bfd0e00")
    assert b64decode("") == b""


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("sk0", r"missing '=' padding: length 3 is not a multiple of 4 \(data ends at offset 13\)"),
        ("sk0L/Q4A=", r"length 9 is not a multiple of 4 \(superfluous '=' padding at offset 18\)"),
        ("sk0L_Q4A", r"character '_' at offset 14 .*URL-safe base64 is not accepted"),
        ("sk0L-Q4A", r"character '-' at offset 14"),
        ("sk0L/Q4A====", r"more than two '=' padding characters, from offset 18"),
        ("QQ==QQ==", r"'=' padding at offset 12 is followed by more data"),
        ("sk1=", r"non-canonical final symbol at offset 12"),
        ("sh==", r"non-canonical final symbol at offset 11"),
        ("sk0L\n/Q4A", r"character '\\n' at offset 14"),
        ("sk é", r"character ' ' at offset 12"),
        ("skéA", r"character 'é' at offset 12"),
        ("s", r"length 1 leaves a single dangling symbol at offset 10"),
        ("====", r"more than two '='"),
    ],
)
def test_b64_rejects_with_position(text: str, message: str) -> None:
    with pytest.raises(DecodeError, match=r"invalid test base64: " + message):
        b64decode(text, what="test base64", offset=10)


@SETTINGS
@given(st.binary(max_size=100))
def test_b64_roundtrip(data: bytes) -> None:
    text = b64encode(data)
    assert text == base64.b64encode(data).decode()
    assert b64decode(text) == data


@SETTINGS
@given(
    st.text(alphabet="ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/=-_ \né", max_size=24)
)
def test_b64_strictness_is_canonical(text: str) -> None:
    # Whatever is accepted is exactly what the encoder would produce for those bytes.
    try:
        data = b64decode(text)
    except DecodeError:
        return
    assert b64encode(data) == text
    assert data == binascii.a2b_base64(text)


def test_utf8_rejects_lone_surrogates() -> None:
    assert utf8("héllo") == "héllo".encode()
    with pytest.raises(EncodeError, match=r"lone surrogate '\\ud800' at index 1; M2M messages must be UTF-8"):
        utf8("a\ud800b")


def test_c_helper_is_built_and_matches_the_python_path() -> None:
    # The optional C helper is what keeps TokenNative decoding fast; make (pip install -e .) builds it.
    from m2mwire.codecs import varint

    assert varint._c_unpack is not None, "m2mwire/codecs/_varint.c was not built: is a C compiler installed?"
    rng = random.Random(7)
    for _ in range(300):
        ids = [
            rng.choice([rng.randrange(128), rng.randrange(1 << 14), rng.randrange(1 << 32)])
            for _ in range(50)
        ]
        data = pack_varints(ids)
        assert varint._c_unpack(data) == varint._unpack_varints_protobuf(data) == ids
    for bad in (b"\x80", b"\x01\x80", b"\x80\x80\x80\x80\x80\x01", b"\xff\xff\xff\xff\x7f"):
        with pytest.raises(DecodeError) as c_err:
            unpack_varints(bad)
        with pytest.raises(DecodeError) as py_err:
            varint._unpack_varints_protobuf(bad)
        assert str(c_err.value) == str(py_err.value)
