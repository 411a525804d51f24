"""TokenNative: round trips for every vocabulary, strict decoding, limits, binary form."""

from __future__ import annotations

import contextlib
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from m2mwire.codecs import compress, decompress
from m2mwire.codecs.limits import Limits
from m2mwire.codecs.tokenizers import Encoding, get_tokenizer
from m2mwire.codecs.tokennative import (
    compress_binary,
    decode_tokennative,
    decompress_binary,
    encode_tokennative,
    parse_tk_header,
    tokenize,
)
from m2mwire.codecs.varint import b64encode, pack_varints
from m2mwire.errors import DecodeError, EncodeError, LimitExceeded

SETTINGS = settings(max_examples=120, deadline=None)
SPECIALS = {
    Encoding.CL100K: [
        "<|endoftext|>",
        "<|fim_prefix|>",
        "<|fim_middle|>",
        "<|fim_suffix|>",
        "<|endofprompt|>",
    ],
    Encoding.O200K: ["<|endoftext|>", "<|endofprompt|>"],
    Encoding.LLAMA3: ["<|begin_of_text|>", "<|eot_id|>", "<|python_tag|>", "<|reserved_special_token_200|>"],
}
ALL_SPECIAL_TEXT = sorted({s for specials in SPECIALS.values() for s in specials})
# Full Unicode minus surrogates (st.text's default), with special-token strings mixed in.
TEXT = st.lists(st.one_of(st.text(max_size=40), st.sampled_from(ALL_SPECIAL_TEXT)), max_size=6).map("".join)


def _tk(encoding: Encoding, ids: list[int]) -> str:
    return f"#TK|{encoding.wire_id}|" + b64encode(pack_varints(ids))


@pytest.mark.parametrize("encoding", list(Encoding))
@SETTINGS
@given(text=TEXT)
def test_roundtrip_text_and_binary(encoding: Encoding, text: str) -> None:
    wire = encode_tokennative(text, encoding)
    assert wire.startswith(f"#TK|{encoding.wire_id}|") and wire.isascii()
    assert decode_tokennative(wire) == text
    binary = compress_binary(text, encoding=encoding)
    assert binary[0] == encoding.binary_id
    assert decompress_binary(binary) == text
    assert decompress_binary(bytearray(binary)) == text
    assert decompress_binary(memoryview(binary)) == text


@pytest.mark.parametrize("encoding", list(Encoding))
def test_special_tokens_become_special_ids(encoding: Encoding) -> None:
    tokenizer = get_tokenizer(encoding)
    for special in SPECIALS[encoding]:
        ids = tokenize(f"a{special}b", encoding)
        assert tokenizer.encode_single_token(special) in ids
        assert decode_tokennative(encode_tokennative(f"a{special}b", encoding)) == f"a{special}b"


def test_other_vocabularies_specials_are_plain_text() -> None:
    # <|eot_id|> is special only for Llama 3; in cl100k it is ordinary text and still round-trips.
    ids = tokenize("<|eot_id|>", Encoding.CL100K)
    assert len(ids) > 1
    assert decode_tokennative(encode_tokennative("<|eot_id|>", "C")) == "<|eot_id|>"


def test_lone_surrogates_are_refused_not_replaced() -> None:
    with pytest.raises(EncodeError, match="lone surrogate"):
        encode_tokennative("ok \udcff", "C")
    with pytest.raises(EncodeError, match="lone surrogate"):
        compress_binary("\ud83d", encoding="O")


def test_empty() -> None:
    assert encode_tokennative("", "C") == "#TK|C|"
    assert decode_tokennative("#TK|O|") == ""
    assert compress_binary("", encoding="L") == b"\x02"
    assert decompress_binary(b"\x01") == ""


# --- strict decoding -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("wire", "message"),
    [
        ("#TK|X|sk0L/Q4A", r"unknown TokenNative tokenizer id 'X' at offset 4.*does not fall back to cl100k"),
        ("#TK|CX|sk0L/Q4A", r"unknown TokenNative tokenizer id 'CX'"),
        ("#TK|c|sk0L/Q4A", r"unknown TokenNative tokenizer id 'c'"),
        ("#TK||sk0L/Q4A", r"unknown TokenNative tokenizer id ''"),
        ("#TK|C", r"no '\|' after the tokenizer id"),
        ("#T1|C|sk0=", r"expected the prefix '#TK\|'"),
        ("#TK|C|sk0", r"missing '=' padding"),
        ("#TK|C|sk0L/Q4A=", r"superfluous '=' padding at offset 14"),
        ("#TK|C|sk0L_Q4A", r"character '_' at offset 10"),
        ("#TK|C|gA==", r"truncated varint"),
        ("#TK|C|gICAgIAB", r"over-long varint"),
        ("#TK|C|gICAgBA=", r"not below 2\*\*32"),
    ],
)
def test_decode_errors(wire: str, message: str) -> None:
    with pytest.raises(DecodeError, match=message):
        decode_tokennative(wire)


@pytest.mark.parametrize(
    ("encoding", "bad_id"),
    [
        (Encoding.CL100K, 100_256),  # gap between the ranks and the first special
        (Encoding.CL100K, 100_261),  # gap between fim_suffix and endofprompt
        (Encoding.CL100K, 100_277),
        (Encoding.O200K, 199_998),
        (Encoding.O200K, 200_019),
        (Encoding.LLAMA3, 128_256),
        (Encoding.LLAMA3, 2**32 - 1),
    ],
)
def test_ids_outside_the_vocabulary(encoding: Encoding, bad_id: int) -> None:
    with pytest.raises(
        DecodeError, match=rf"token id {bad_id} \(token #1\) is not in the {encoding.value} vocabulary"
    ):
        decode_tokennative(_tk(encoding, [15, bad_id, 16]))
    with pytest.raises(DecodeError, match=rf"token id {bad_id}"):
        decompress_binary(bytes((encoding.binary_id,)) + pack_varints([bad_id]))


def test_invalid_utf8_after_detokenization() -> None:
    # cl100k id 9468 is the first two bytes of a four-byte emoji: alone it is not UTF-8.
    assert get_tokenizer("C").decode_single_token_bytes(9468) == b"\xf0\x9f"
    with pytest.raises(DecodeError, match=r"invalid UTF-8 at byte 0"):
        decode_tokennative(_tk(Encoding.CL100K, [9468]))


def test_unknown_binary_tokenizer_byte_is_rejected() -> None:
    # The reference reads any unknown byte as cl100k; we refuse it.
    with pytest.raises(DecodeError, match=r"unknown TokenNative binary tokenizer byte 3 at offset 0"):
        decompress_binary(bytes.fromhex("03b24d0bfd0e00"))
    with pytest.raises(DecodeError, match=r"empty TokenNative binary message"):
        decompress_binary(b"")


def test_parse_header() -> None:
    assert parse_tk_header("#TK|O|abcd") == (Encoding.O200K, 6)
    assert parse_tk_header("#TK|L|") == (Encoding.LLAMA3, 6)


# --- limits --------------------------------------------------------------------------------------------


def test_wire_over_message_limit_rejected_before_decoding() -> None:
    wire = "#TK|C|" + "!" * 100  # garbage, but the size check comes first
    with pytest.raises(LimitExceeded, match="over the limit of 50 bytes") as info:
        decode_tokennative(wire, limits=Limits(max_message_bytes=50))
    assert info.value.limit == 50 and info.value.actual == 106
    with pytest.raises(LimitExceeded):
        decompress_binary(b"\x00" * 51, limits=Limits(max_message_bytes=50))


def test_decoded_output_limit() -> None:
    text = "word " * 100
    wire = encode_tokennative(text, "C")
    assert decode_tokennative(wire, limits=Limits(max_output_bytes=500)) == text
    with pytest.raises(
        LimitExceeded, match="decoded TokenNative content is 500 bytes, over the limit of 499"
    ):
        decode_tokennative(wire, limits=Limits(max_output_bytes=499))


def test_output_limit_stops_early_on_huge_expansion(monkeypatch: pytest.MonkeyPatch) -> None:
    # 200k copies of a long token: ~3 MB of output from ~600 KB of varints. With a 1 MB cap the decoder
    # must stop after the first chunk instead of building the whole output.
    import m2mwire.codecs.tokennative as tn

    long_token = max(range(100_000), key=lambda i: len(get_tokenizer("C").decode_single_token_bytes(i)))
    ids = [long_token] * 200_000
    decoded_lengths: list[int] = []
    real = get_tokenizer("C").decode_bytes

    class Spy:
        name = "cl100k_base"

        def decode_bytes(self, chunk: list[int]) -> bytes:
            out = real(chunk)
            decoded_lengths.append(len(out))
            return out

    monkeypatch.setattr(tn, "get_tokenizer", lambda enc: Spy())
    monkeypatch.setattr(tn, "c_detokenize", None)  # the pure-Python path, used without the C helper
    with pytest.raises(LimitExceeded, match="decoded TokenNative content"):
        decompress_binary(b"\x00" + pack_varints(ids), limits=Limits(max_output_bytes=1_000_000))
    assert len(decoded_lengths) == 1


def test_output_limit_checked_before_allocating_in_the_c_path() -> None:
    import tracemalloc

    import m2mwire.codecs.tokennative as tn

    assert tn.c_detokenize is not None
    long_token = max(range(100_000), key=lambda i: len(get_tokenizer("C").decode_single_token_bytes(i)))
    frame = b"\x00" + pack_varints([long_token] * 200_000)  # ~26 MB of output
    tracemalloc.start()
    try:
        with pytest.raises(LimitExceeded, match="decoded TokenNative content"):
            decompress_binary(frame, limits=Limits(max_output_bytes=1_000_000))
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 4_000_000  # nothing close to the output size was allocated


def test_c_and_python_paths_agree(monkeypatch: pytest.MonkeyPatch) -> None:
    import m2mwire.codecs.tokennative as tn

    texts = ["Hello, world!", "héllo wörld 👋 <|endoftext|>", "", "x" * 5000, "日本語のテキスト\n\tend"]
    wires = [compress(t, "tokennative", encoding=e) for t in texts for e in ("C", "O", "L")]
    bad = ["#TK|C|gA==", "#TK|C|gICAgIAB", "#TK|C|sk0L/Q4A=", "#TK|C|sk0", "#TK|C|gICEBw==", "#TK|C|/////w8="]
    fast = [_outcome(decompress, w) for w in wires + bad]
    monkeypatch.setattr(tn, "c_detokenize", None)
    slow = [_outcome(decompress, w) for w in wires + bad]
    assert fast == slow
    assert fast[: len(texts) * 3] == [("ok", t) for t in texts for _ in range(3)]


def _outcome(fn: Any, arg: Any) -> tuple[str, str]:
    try:
        return ("ok", fn(arg))
    except Exception as exc:
        return (type(exc).__name__, str(exc))


def test_encode_wire_limit() -> None:
    with pytest.raises(LimitExceeded, match="TokenNative wire message"):
        encode_tokennative("hello world " * 50, "C", limits=Limits(max_message_bytes=40))


# --- mutation fuzzing ----------------------------------------------------------------------------------

BASE_WIRES = [
    encode_tokennative(
        '{"model":"gpt-4o","messages":[{"role":"user","content":"Hello 👋 <|endoftext|>"}]}', enc
    )
    for enc in Encoding
]


@SETTINGS
@given(
    base=st.sampled_from(BASE_WIRES),
    position=st.integers(min_value=0, max_value=200),
    kind=st.sampled_from(["flip", "truncate", "insert", "delete"]),
    char=st.characters(),
)
def test_mutated_wires_only_raise_decode_errors(base: str, position: int, kind: str, char: str) -> None:
    i = position % (len(base) + 1)
    mutated = {
        "flip": base[:i] + char + base[i + 1 :],
        "truncate": base[:i],
        "insert": base[:i] + char + base[i:],
        "delete": base[:i] + base[i + 1 :],
    }[kind]
    try:
        result = decode_tokennative(mutated)
    except (DecodeError, LimitExceeded):
        return
    assert isinstance(result, str)


@SETTINGS
@given(st.binary(max_size=40))
def test_random_binary_only_raises_decode_errors(data: bytes) -> None:
    with contextlib.suppress(DecodeError, LimitExceeded):
        assert isinstance(decompress_binary(data), str)
