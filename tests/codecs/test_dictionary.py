"""Dictionary (#M2M|, #DI|): seed table with escapes (lossless for all text), and the reference dialect."""

from __future__ import annotations

import base64
import contextlib

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from m2mwire.codecs.dictionary import (
    FORMAT_MARKER,
    REFERENCE_PATTERNS,
    SEED_PATTERNS,
    decode_dictionary,
    encode_dictionary,
)
from m2mwire.codecs.limits import Limits
from m2mwire.errors import DecodeError, EncodeError, LimitExceeded

SETTINGS = settings(max_examples=150, deadline=None)
PATTERN_TEXT = [p.decode() for p in SEED_PATTERNS.values()]
# Characters whose UTF-8 contains the code bytes 0x80-0x87 (e.g. U+0100 = C4 80, U+2000 = E2 80 80).
CODE_BYTE_CHARS = ["Ā", "ą", "\u2000", "\u2007", "\U0001f600", "\u0780", "Ȁ"]
TEXT = st.lists(
    st.one_of(st.text(max_size=30), st.sampled_from(PATTERN_TEXT), st.sampled_from(CODE_BYTE_CHARS)),
    max_size=8,
).map("".join)


def _body(wire: str) -> bytes:
    return base64.b64decode(wire.split("|", 1)[1])


def test_seed_table_encoding_bytes() -> None:
    wire = encode_dictionary('{"messages":[{"role":"user","content":"Hi"}]}')
    assert wire == "#M2M|+YaASGmFfQ=="
    assert _body(wire) == bytes([FORMAT_MARKER, 0x86, 0x80]) + b"Hi" + bytes([0x85]) + b"}"


def test_greedy_longest_first() -> None:
    # '"},' and '"}]' must win over '"}'.
    assert _body(encode_dictionary('a"},b"}]c"}d'))[1:] == b"a\x84b\x85c\x83d"
    for code, pattern in SEED_PATTERNS.items():
        assert _body(encode_dictionary(pattern.decode()))[1:] == bytes([code])


def test_code_bytes_in_utf8_are_escaped() -> None:
    wire = encode_dictionary("Ā x")  # U+0100 is C4 80
    assert _body(wire) == bytes([FORMAT_MARKER, 0xC4, 0xF8, 0x80, 0x20, 0x78])
    assert decode_dictionary(wire) == "Ā x"


def test_empty_and_alt_prefix() -> None:
    assert encode_dictionary("") == "#M2M|+Q=="
    assert decode_dictionary("#M2M|+Q==") == ""
    assert decode_dictionary("#DI|+YaASGmFfQ==") == '{"messages":[{"role":"user","content":"Hi"}]}'


@SETTINGS
@given(TEXT)
def test_roundtrip_all_text(text: str) -> None:
    wire = encode_dictionary(text)
    assert wire.startswith("#M2M|") and wire.isascii()
    assert decode_dictionary(wire) == text


def test_surrogates_refused() -> None:
    with pytest.raises(EncodeError, match="lone surrogate"):
        encode_dictionary("\ud800")


# --- reference dialect (decode only) -------------------------------------------------------------------


def test_reference_table_decoding() -> None:
    body = bytes([0x87]) + b'"gpt-4o"' + bytes([0x88, 0x80]) + b'"Hi' + bytes([0x85, 0x8C]) + b"}"
    wire = "#M2M|" + base64.b64encode(body).decode()
    assert (
        decode_dictionary(wire)
        == '{"model":"gpt-4o","messages":[{"role":"user","content":"Hi"}],"stream":false}'
    )


def test_reference_every_code_and_latin1() -> None:
    body = bytes(REFERENCE_PATTERNS) + bytes([0x8D, 0xFF, 0xE9])
    expected = "".join(p.decode() for p in REFERENCE_PATTERNS.values()) + "\x8d\xff\xe9"
    assert decode_dictionary("#M2M|" + base64.b64encode(body).decode()) == expected


def test_reference_raw_payloads() -> None:
    assert decode_dictionary('#M2M|{"model":"gpt-4o"}') == '{"model":"gpt-4o"}'
    assert decode_dictionary("#M2M|test") == "µë-"  # valid base64, so decoded: same as the reference


def test_reference_payload_never_starts_with_our_marker() -> None:
    # The reference encoder only emits ASCII and codes 0x80-0xB4, so 0xF9 first means "ours".
    assert FORMAT_MARKER not in REFERENCE_PATTERNS and FORMAT_MARKER >= 0x80


# --- errors and limits ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (bytes([FORMAT_MARKER]) + b"ab\xf8", r"not valid UTF-8 at byte 2"),
        (bytes([FORMAT_MARKER]) + b"ab\xf8A", r"not valid UTF-8 at byte 2"),
        (bytes([FORMAT_MARKER, FORMAT_MARKER]), r"not valid UTF-8 at byte 0"),
        (bytes([FORMAT_MARKER]) + b"\xc4", r"not valid UTF-8 at byte 0"),
        (bytes([FORMAT_MARKER]) + b"\xff", r"not valid UTF-8"),
    ],
)
def test_seed_dialect_invalid_bodies(body: bytes, message: str) -> None:
    with pytest.raises(DecodeError, match=message):
        decode_dictionary("#M2M|" + base64.b64encode(body).decode())


def test_wrong_prefix() -> None:
    with pytest.raises(DecodeError, match="not a Dictionary message"):
        decode_dictionary("#TK|C|")


def test_output_limit_seed_dialect() -> None:
    text = '{"role":"assistant","content":"' * 100  # 3100 bytes from 101 body bytes
    wire = encode_dictionary(text)
    assert decode_dictionary(wire, limits=Limits(max_output_bytes=3100)) == text
    with pytest.raises(
        LimitExceeded, match="decoded Dictionary content is 3100 bytes, over the limit of 3099"
    ):
        decode_dictionary(wire, limits=Limits(max_output_bytes=3099))


def test_output_limit_counts_escapes_exactly() -> None:
    text = "Ā" * 100  # 200 bytes; 100 escape pairs must not be counted as 31-byte patterns
    wire = encode_dictionary(text)
    assert decode_dictionary(wire, limits=Limits(max_output_bytes=200)) == text
    with pytest.raises(LimitExceeded):
        decode_dictionary(wire, limits=Limits(max_output_bytes=199))


def test_output_limit_reference_dialect() -> None:
    body = bytes([0xA2]) * 100  # '"finish_reason":"length"' x 100 = 2400 bytes
    wire = "#M2M|" + base64.b64encode(body).decode()
    assert len(decode_dictionary(wire, limits=Limits(max_output_bytes=2400))) == 2400
    with pytest.raises(LimitExceeded, match="2400 bytes, over the limit of 2399"):
        decode_dictionary(wire, limits=Limits(max_output_bytes=2399))
    latin = "#M2M|" + base64.b64encode(bytes([0xFF]) * 60).decode()  # 60 chars, 120 UTF-8 bytes
    with pytest.raises(LimitExceeded, match="120 bytes"):
        decode_dictionary(latin, limits=Limits(max_output_bytes=119))


def test_raw_payload_limit_and_wire_limit() -> None:
    with pytest.raises(LimitExceeded):
        decode_dictionary("#M2M|{" + "x" * 50, limits=Limits(max_output_bytes=40))
    with pytest.raises(LimitExceeded, match="Dictionary wire message"):
        decode_dictionary("#M2M|" + "A" * 100, limits=Limits(max_message_bytes=50))


# --- mutation fuzzing ----------------------------------------------------------------------------------

BASE = encode_dictionary(
    '{"model":"gpt-4o","messages":[{"role":"system","content":"Ā 👋 x"},{"role":"user"}]}'
)


@SETTINGS
@given(
    position=st.integers(min_value=0, max_value=200),
    kind=st.sampled_from(["flip", "truncate", "insert"]),
    char=st.characters(),
)
def test_mutated_wires_only_raise_decode_errors(position: int, kind: str, char: str) -> None:
    i = position % (len(BASE) + 1)
    mutated = {
        "flip": BASE[:i] + char + BASE[i + 1 :],
        "truncate": BASE[:i],
        "insert": BASE[:i] + char + BASE[i:],
    }[kind]
    if not mutated.startswith(("#M2M|", "#DI|")):
        return
    with contextlib.suppress(DecodeError, LimitExceeded):
        assert isinstance(decode_dictionary(mutated), str)


@SETTINGS
@given(st.binary(max_size=80))
def test_random_bodies_only_raise_decode_errors(data: bytes) -> None:
    for body in (data, bytes([FORMAT_MARKER]) + data):
        with contextlib.suppress(DecodeError, LimitExceeded):
            assert isinstance(decode_dictionary("#M2M|" + base64.b64encode(body).decode()), str)
