"""Prefix dispatch, compress/decompress, NONE ambiguity, limits, and the public re-exports."""

from __future__ import annotations

import base64
import json
import sys
import types
import zlib

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import m2mwire.codecs as codecs
from m2mwire.codecs import (
    Algorithm,
    Decoded,
    Encoding,
    compress,
    decode_wire,
    decompress,
    detect_algorithm,
    resolve_algorithm,
)
from m2mwire.codecs.limits import DEFAULT_LIMITS, Limits
from m2mwire.errors import DecodeError, EncodeError, LimitExceeded
from m2mwire.samples import sample_payloads

SETTINGS = settings(max_examples=100, deadline=None)
REQUEST = '{"model":"gpt-4o","messages":[{"role":"user","content":"Hello"}]}'


def test_public_api_is_reexported() -> None:
    for name in [
        "Encoding",
        "resolve_encoding",
        "get_tokenizer",
        "count_tokens",
        "available_encodings",
        "tokenizer_path",
        "register_tokenizer_file",
        "Algorithm",
        "resolve_algorithm",
        "select_algorithm",
        "compress",
        "decompress",
        "detect_algorithm",
        "decode_wire",
        "Decoded",
        "compress_binary",
        "decompress_binary",
    ]:
        assert name in codecs.__all__
        assert getattr(codecs, name) is not None
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        codecs.nope  # noqa: B018


# --- algorithm names -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("tokennative", Algorithm.TOKENNATIVE),
        ("TOKEN_NATIVE", Algorithm.TOKENNATIVE),
        ("token_native", Algorithm.TOKENNATIVE),
        ("TOKEN", Algorithm.TOKEN),
        ("Brotli", Algorithm.BROTLI),
        ("DICTIONARY", Algorithm.DICTIONARY),
        ("none", Algorithm.NONE),
        ("ZLIB", Algorithm.ZLIB),
        (Algorithm.BROTLI, Algorithm.BROTLI),
    ],
)
def test_resolve_algorithm(name: str | Algorithm, expected: Algorithm) -> None:
    assert resolve_algorithm(name) is expected


@pytest.mark.parametrize("name", ["m3", "gzip", "TK", "", "token-native"])
def test_resolve_algorithm_unknown(name: str) -> None:
    with pytest.raises(EncodeError, match=r"unknown compression algorithm .*tokennative / token_native"):
        resolve_algorithm(name)


# --- dispatch ------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("algorithm", "prefix"),
    [
        (Algorithm.TOKENNATIVE, "#TK|C|"),
        (Algorithm.TOKEN, "#T1|"),
        (Algorithm.BROTLI, "#M2M[v3.0]|DATA:"),
        (Algorithm.DICTIONARY, "#M2M|"),
        (Algorithm.NONE, "{"),
    ],
)
def test_each_algorithm_round_trips_and_is_detected(algorithm: Algorithm, prefix: str) -> None:
    wire = compress(REQUEST, algorithm)
    assert wire.startswith(prefix)
    assert detect_algorithm(wire) is algorithm
    decoded = decode_wire(wire)
    assert decoded.algorithm is algorithm
    if algorithm is Algorithm.TOKEN:
        assert json.loads(decoded.content)["messages"] == json.loads(REQUEST)["messages"]
    else:
        assert decoded.content == REQUEST
    assert decoded.encoding is (Encoding.CL100K if algorithm is Algorithm.TOKENNATIVE else None)


@pytest.mark.parametrize("encoding", list(Encoding))
def test_decode_wire_reports_the_tokenizer(encoding: Encoding) -> None:
    wire = compress("héllo", "tokennative", encoding=encoding.reference_name)
    assert decode_wire(wire) == Decoded("héllo", Algorithm.TOKENNATIVE, encoding)


def test_alias_prefixes_are_read() -> None:
    br = compress(REQUEST, "brotli")
    assert decompress("#BR|" + br.split(":", 1)[1]) == REQUEST
    assert detect_algorithm("#BR|xx") is Algorithm.BROTLI
    di = compress(REQUEST, "dictionary")
    assert decompress("#DI|" + di[len("#M2M|") :]) == REQUEST
    assert detect_algorithm("#DI|") is Algorithm.DICTIONARY


def test_zlib_is_decoded_but_never_emitted() -> None:
    wire = "#M2M[v2.0]|DATA:" + base64.b64encode(zlib.compress(REQUEST.encode())).decode()
    assert decode_wire(wire) == Decoded(REQUEST, Algorithm.ZLIB)
    with pytest.raises(EncodeError, match="deprecated and never emitted"):
        compress(REQUEST, "zlib")
    with pytest.raises(DecodeError, match="must start with"):
        decompress("#M2M[v2.0]|eJw=")


def test_t1_is_dispatched_to_the_t1_module(monkeypatch: pytest.MonkeyPatch) -> None:
    fake = types.ModuleType("m2mwire.codecs.t1")
    calls: list[tuple[str, object]] = []

    def encode_t1(content: str, *, dialect: str = "seed", limits: Limits = DEFAULT_LIMITS) -> str:
        calls.append(("encode", dialect))
        return "#T1|" + content

    def decode_t1(wire: str, *, limits: Limits = DEFAULT_LIMITS) -> str:
        calls.append(("decode", limits.max_output_bytes))
        return wire[4:]

    fake.encode_t1 = encode_t1  # type: ignore[attr-defined]
    fake.decode_t1 = decode_t1  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "m2mwire.codecs.t1", fake)
    assert compress("{}", "token", t1_dialect="reference") == "#T1|{}"
    assert decompress("#T1|{}", limits=Limits(max_output_bytes=77)) == "{}"
    assert calls == [("encode", "reference"), ("decode", 77)]


def test_t1_needs_json() -> None:
    with pytest.raises(EncodeError, match="JSON"):
        compress("plain prose", "token")


@pytest.mark.parametrize(
    ("wire", "message"),
    [
        ("#M2M|1|IgABAAAA", r"M2M v1 frame is 6 bytes after the prefix, shorter than its 20-byte header"),
        ("#M2M|1|", r"M2M v1 frame is 0 bytes"),
        ("#M2M[v4.0]|DATA:abc", r"unknown M2M prefix '#M2M\[v4.0\]\|DATA:"),
        ("#M2Mx", r"unknown M2M prefix"),
        ("#M3|AQ==", r"unknown M2M prefix '#M3\|'"),
        ("#ZL|eJw=", r"unknown M2M prefix '#ZL\|'"),
        ("#DC|x", r"unknown M2M prefix '#DC\|'"),
        ("#TK2|x", r"unknown M2M prefix '#TK2\|'"),
        ("#M2M[v3.0]|xyz", r"must start with '#M2M\[v3.0\]\|DATA:'"),
    ],
)
def test_unknown_or_unsupported_prefixes(wire: str, message: str) -> None:
    with pytest.raises(DecodeError, match=message):
        decompress(wire)


@pytest.mark.parametrize(
    "text",
    [
        "",
        "hello",
        "# heading",
        "#tk|lowercase is not a tag",
        "#TOOLONG|x",
        "#A|x",
        " #TK|C|",
        "#T1 no bar",
        "TK|C|x",
    ],
)
def test_plain_text_is_none(text: str) -> None:
    assert detect_algorithm(text) is Algorithm.NONE
    assert decode_wire(text) == Decoded(text, Algorithm.NONE)
    assert compress(text, "none") == text


@pytest.mark.parametrize(
    "text", ["#TK|C|sk0=", "#T1|{}", "#M2M whatever", "#BR|", "#DI|x", "#XY|z", "#M3|", "#AB1|"]
)
def test_prefix_like_content_cannot_be_none(text: str) -> None:
    with pytest.raises(EncodeError, match="looks like an M2M prefix"):
        compress(text, "none")
    wire = compress(text)  # automatic selection picks something unambiguous
    assert detect_algorithm(wire) is not Algorithm.NONE
    assert decompress(wire) == text


@SETTINGS
@given(st.text())
def test_none_is_lossless_whenever_allowed(text: str) -> None:
    try:
        wire = compress(text, "none")
    except EncodeError:
        assert codecs.select.is_prefix_like(text)
        return
    assert decompress(wire) == text


# --- compress options ----------------------------------------------------------------------------------


def test_allowed_restricts_explicit_and_automatic_choices() -> None:
    with pytest.raises(EncodeError, match="'brotli' is not among the allowed"):
        compress(REQUEST, "brotli", allowed=["tokennative"])
    assert compress("x" * 2000, allowed=["TOKEN_NATIVE"]).startswith("#TK|")
    with pytest.raises(EncodeError, match="none of the allowed algorithms"):
        compress("#TK|C|", allowed=["none"])


def test_surrogates_rejected_for_every_algorithm() -> None:
    for alg in ("tokennative", "brotli", "dictionary", "none"):
        with pytest.raises(EncodeError, match="lone surrogate"):
            compress("bad \udc00 text", alg)


def test_content_over_the_output_limit_is_refused() -> None:
    with pytest.raises(LimitExceeded, match="content is 200 bytes, over the limit of 100"):
        compress("a" * 200, "brotli", limits=Limits(max_output_bytes=100))


def test_non_str_inputs() -> None:
    with pytest.raises(EncodeError, match="takes text"):
        compress(b"bytes", "none")  # type: ignore[arg-type]
    with pytest.raises(DecodeError, match="is a str"):
        decompress(b"#TK|C|")  # type: ignore[arg-type]


def test_unknown_encoding_is_an_encode_error() -> None:
    with pytest.raises(EncodeError, match="unknown tokenizer encoding"):
        compress("x", "tokennative", encoding="gpt2")


# --- limits --------------------------------------------------------------------------------------------


def test_message_limit_is_checked_before_dispatch() -> None:
    small = Limits(max_message_bytes=32)
    for wire in ("#TK|C|" + "A" * 40, "#M2M|1|" + "A" * 40, "#QQ|" + "x" * 40, "plain " * 10, "é" * 17):
        with pytest.raises(LimitExceeded, match=r"wire message is .* over the limit of 32 bytes"):
            decompress(wire, limits=small)


def test_none_output_limit() -> None:
    with pytest.raises(LimitExceeded, match="content"):
        decompress("x" * 50, limits=Limits(max_output_bytes=49))


# --- the corpus ----------------------------------------------------------------------------------------


@pytest.mark.parametrize(("name", "content"), sample_payloads())
def test_corpus_round_trips_with_every_byte_exact_codec(name: str, content: str) -> None:
    for alg in ("tokennative", "brotli", "dictionary"):
        for encoding in Encoding if alg == "tokennative" else (Encoding.CL100K,):
            wire = compress(content, alg, encoding=encoding)
            assert wire.isascii()
            assert decompress(wire) == content, (name, alg, encoding)
    for optimize in ("bytes", "tokens"):
        wire = compress(content, optimize=optimize)  # type: ignore[arg-type]
        decoded = decompress(wire)
        if detect_algorithm(wire) is Algorithm.TOKEN:
            _assert_t1_equivalent(json.loads(content), json.loads(decoded))
        else:
            assert decoded == content


def _assert_t1_equivalent(original: object, decoded: object) -> None:
    """T1 (seed dialect) gives the same JSON value, plus seed defaults restored on a request object."""
    if not isinstance(original, dict) or not isinstance(decoded, dict):
        assert decoded == original
        return
    defaults = {
        "temperature",
        "top_p",
        "n",
        "stream",
        "frequency_penalty",
        "presence_penalty",
        "logit_bias",
        "stop",
    }
    assert {k: v for k, v in decoded.items() if k in original} == original
    assert set(decoded) - set(original) <= defaults


def test_automatic_t1_falls_back_when_t1_refuses() -> None:
    deep = {"model": "gpt-4o", "messages": [{"role": "user", "content": "x"}], "meta": {}}
    node = deep["meta"]
    for _ in range(40):  # deeper than limits.max_json_depth (32): T1 refuses, the others do not parse JSON
        node["a"] = {}  # type: ignore[index]
        node = node["a"]  # type: ignore[index]
    content = json.dumps(deep)
    with pytest.raises((EncodeError, LimitExceeded)):
        compress(content, "token")
    wire = compress(content, optimize="tokens")
    assert detect_algorithm(wire) is not Algorithm.TOKEN
    assert decompress(wire) == content
    with pytest.raises((EncodeError, LimitExceeded)):
        compress(content, optimize="tokens", allowed=["token"])


WIRE_BASES = [compress(REQUEST, alg) for alg in ("tokennative", "token", "brotli", "dictionary")] + [
    "#M2M[v2.0]|DATA:" + base64.b64encode(zlib.compress(REQUEST.encode())).decode()
]


@SETTINGS
@given(
    base=st.sampled_from(WIRE_BASES),
    position=st.integers(min_value=0, max_value=120),
    kind=st.sampled_from(["flip", "truncate", "insert", "delete"]),
    char=st.characters(),
)
def test_mutated_wires_of_every_kind_only_raise_decode_errors(
    base: str, position: int, kind: str, char: str
) -> None:
    i = position % (len(base) + 1)
    mutated = {
        "flip": base[:i] + char + base[i + 1 :],
        "truncate": base[:i],
        "insert": base[:i] + char + base[i:],
        "delete": base[:i] + base[i + 1 :],
    }[kind]
    try:
        result = decompress(mutated)
    except (DecodeError, LimitExceeded):
        return
    assert isinstance(result, str)
