"""Automatic algorithm selection: rules, restrictions, purity, and the corpus figures behind them."""

from __future__ import annotations

import json
import zlib

import brotli
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from m2mwire.codecs import Algorithm, compress, count_tokens, select_algorithm
from m2mwire.codecs import tokenizers as tokenizers_module
from m2mwire.codecs.select import (
    BROTLI_FROM,
    NONE_BELOW,
    TOKENNATIVE_AUTO_MAX,
    is_llm_api_payload,
    is_prefix_like,
)
from m2mwire.errors import EncodeError
from m2mwire.samples import sample_payloads

SETTINGS = settings(max_examples=150, deadline=None)


def _chat(content: str) -> str:
    return json.dumps({"model": "gpt-4o", "messages": [{"role": "user", "content": content}]})


SAMPLES = dict(sample_payloads())
PROSE = "The deployment failed again with a timeout while waiting for the database migration. "


def test_thresholds_are_the_documented_ones() -> None:
    assert (NONE_BELOW, BROTLI_FROM) == (100, 1024)


@pytest.mark.parametrize(
    ("content", "expected"),
    [
        ("ok", Algorithm.NONE),
        (_chat("Hi"), Algorithm.NONE),  # 65 bytes
        ("#TK|C|sk0= is a TokenNative wire", Algorithm.TOKENNATIVE),  # small, but NONE would be ambiguous
        (_chat(PROSE * 5), Algorithm.TOKENNATIVE),  # ~500 bytes of chat JSON
        (PROSE * 5, Algorithm.TOKENNATIVE),  # ~450 bytes of prose
        (_chat(PROSE * 12), Algorithm.BROTLI),  # > 1 KB
        (PROSE * 30, Algorithm.BROTLI),
        ("部署再次失败了，等待数据库迁移完成时出现超时。" * 5, Algorithm.BROTLI),  # non-ASCII heavy  # noqa: RUF001
    ],
)
def test_bytes_rules(content: str, expected: Algorithm) -> None:
    assert select_algorithm(content) is expected
    assert select_algorithm(content, encoding="o200k_base") is expected  # rules hold for every vocabulary


@pytest.mark.parametrize(
    ("content", "expected"),
    [
        (_chat("Hi"), Algorithm.TOKEN),
        (SAMPLES["req_tools_all"], Algorithm.TOKEN),  # 2 KB chat request, not repetitive enough for Brotli
        (_chat(PROSE * 12), Algorithm.BROTLI),  # the same sentence 12 times: Brotli's wire has fewer tokens
        ('{"status":"ok","task_id":"t-1"}', Algorithm.NONE),  # JSON, but not chat-API JSON
        (PROSE * 3, Algorithm.NONE),
        (
            "\n".join(f"2026-01-17T10:00:{i:02d}Z INFO worker heartbeat queue_depth=3" for i in range(60)),
            Algorithm.BROTLI,
        ),
        ("#T1|{} looks like a prefix", Algorithm.TOKENNATIVE),
        ("#T1|" + PROSE * 20, Algorithm.BROTLI),
    ],
)
def test_tokens_rules(content: str, expected: Algorithm) -> None:
    assert select_algorithm(content, optimize="tokens") is expected


def test_t1_is_never_chosen_for_bytes_when_a_byte_exact_codec_is_allowed() -> None:
    for _, content in sample_payloads():
        assert select_algorithm(content) is not Algorithm.TOKEN


@SETTINGS
@given(st.text(max_size=300), st.sampled_from(["bytes", "tokens"]))
def test_non_json_never_gets_t1(text: str, optimize: str) -> None:
    for allowed in (None, ["token", "none", "brotli"], ["token", "tokennative"]):
        try:
            alg = select_algorithm(text, optimize=optimize, allowed=allowed)  # type: ignore[arg-type]
        except EncodeError:
            continue
        if alg is Algorithm.TOKEN:
            json.loads(text)  # must be JSON
        if alg is Algorithm.NONE:
            assert not is_prefix_like(text)


@SETTINGS
@given(st.text(max_size=200))
def test_selection_always_encodes_and_decodes(text: str) -> None:
    from m2mwire.codecs import decompress

    wire = compress(text)
    assert decompress(wire) == text


def test_allowed_restrictions() -> None:
    big = _chat(PROSE * 20)
    assert select_algorithm(big, allowed=["dictionary"]) is Algorithm.DICTIONARY
    assert select_algorithm(big, allowed=["tokennative", "none"]) is Algorithm.TOKENNATIVE
    assert select_algorithm(big, allowed=["token"]) is Algorithm.TOKEN
    assert select_algorithm("ok", allowed=["brotli", "dictionary"]) is Algorithm.BROTLI
    with pytest.raises(EncodeError, match=r"T1 needs JSON content"):
        select_algorithm("plain text", allowed=["token"])
    with pytest.raises(EncodeError, match=r"starts like an M2M prefix"):
        select_algorithm("#TK|x", allowed=["none"])
    with pytest.raises(EncodeError, match="none of the allowed"):
        select_algorithm("x", allowed=[])
    with pytest.raises(EncodeError, match="unknown compression algorithm"):
        select_algorithm("x", allowed=["gzip"])
    # The allowed set is cached per tuple (a session passes the same one every message): a list,
    # a tuple, names or members give the same choice, and a bad name raises every time.
    for allowed in (["none", "brotli"], ("none", "brotli"), (Algorithm.BROTLI, Algorithm.NONE)):
        assert select_algorithm("#TK|x", allowed=allowed) is Algorithm.BROTLI
        assert select_algorithm("plain", allowed=allowed) is Algorithm.NONE
    for _ in range(2):
        with pytest.raises(EncodeError, match="unknown compression algorithm"):
            select_algorithm("x", allowed=("none", "gzip"))


def test_invalid_options() -> None:
    with pytest.raises(EncodeError, match="optimize must be"):
        select_algorithm("x", optimize="speed")  # type: ignore[arg-type]
    with pytest.raises(EncodeError, match="unknown tokenizer encoding"):
        select_algorithm("x", encoding="gpt2")


def test_llm_payload_probe() -> None:
    assert is_llm_api_payload(_chat("x"))
    assert is_llm_api_payload('  {"choices":[{"delta":{"content":"x"}}]}')
    assert not is_llm_api_payload('{"model":"gpt-4o"}')  # one key is not enough
    assert not is_llm_api_payload('[{"role":"user","content":"x"}]')
    assert not is_llm_api_payload("role content messages")


# --- purity --------------------------------------------------------------------------------------------


def test_selection_never_tokenizes_or_compresses_in_bytes_mode(monkeypatch: pytest.MonkeyPatch) -> None:
    def forbidden(*args: object, **kwargs: object) -> None:
        raise AssertionError("selection must not tokenize or compress")

    monkeypatch.setattr(tokenizers_module, "get_tokenizer", forbidden)
    monkeypatch.setattr(zlib, "compress", forbidden)
    monkeypatch.setattr(brotli, "compress", forbidden)
    for _, content in sample_payloads():
        select_algorithm(content)


def test_tokens_mode_compresses_at_most_once(monkeypatch: pytest.MonkeyPatch) -> None:
    real = zlib.compress
    calls: list[int] = []

    def counting(data: bytes, level: int = -1) -> bytes:
        calls.append(level)
        return real(data, level)

    monkeypatch.setattr(zlib, "compress", counting)
    monkeypatch.setattr(tokenizers_module, "get_tokenizer", lambda *a: (_ for _ in ()).throw(AssertionError))
    for _, content in sample_payloads():
        calls.clear()
        select_algorithm(content, optimize="tokens")
        assert calls in ([], [1])


# --- corpus regression: the figures in docs/CODECS.md --------------------------------------------------


def test_corpus_selection_is_close_to_the_best_codec_per_payload() -> None:
    """Automatic selection stays within 3% of an oracle that tries every codec (measured: 1.1% / 0.6%)."""
    totals = {"bytes": [0, 0, 0], "tokens": [0, 0, 0]}  # original, selected, oracle
    for _, content in sample_payloads():
        wires = {}
        for alg in Algorithm:
            if alg is Algorithm.ZLIB:
                continue
            try:
                wires[alg] = compress(content, alg)
            except EncodeError:
                continue
        size = {alg: len(w.encode()) for alg, w in wires.items()}
        tokens = {alg: count_tokens(w) for alg, w in wires.items()}
        exact = {alg: v for alg, v in size.items() if alg is not Algorithm.TOKEN}
        chosen_b = select_algorithm(content)
        chosen_t = select_algorithm(content, optimize="tokens")
        totals["bytes"][0] += len(content.encode())
        totals["bytes"][1] += size[chosen_b]
        totals["bytes"][2] += min(exact.values())
        totals["tokens"][0] += count_tokens(content)
        totals["tokens"][1] += tokens[chosen_t]
        totals["tokens"][2] += min(tokens.values())
    for _, (original, selected, oracle) in totals.items():
        assert selected <= oracle * 1.03
        assert selected < original
    assert totals["bytes"][1] <= 0.35 * totals["bytes"][0]  # measured 31.8% of the original bytes
    assert totals["tokens"][1] <= 0.75 * totals["tokens"][0]  # measured 70.0% of the original tokens


def test_long_content_is_never_tokenized_by_automatic_selection() -> None:
    """A peer that negotiated only tokennative made an echoing server tokenize everything it
    sent back, on its event loop: 3 messages of 199 bytes (Brotli, 16 MiB decoded each) cost
    29 s of CPU (stop 32's attack run). Past TOKENNATIVE_AUTO_MAX characters, content goes as
    plain text where nothing but TokenNative is allowed (every decoder reads it); asked for by
    name, TokenNative still encodes it."""
    long = PROSE * (TOKENNATIVE_AUTO_MAX // len(PROSE) + 1)
    assert select_algorithm(long, allowed=["tokennative"]) is Algorithm.NONE
    assert select_algorithm(long, allowed=["tokennative", "brotli"]) is Algorithm.BROTLI
    assert select_algorithm(long[:TOKENNATIVE_AUTO_MAX], allowed=["tokennative"]) is Algorithm.TOKENNATIVE
    # Content that starts like a prefix has no plain form: exempt, it made the cap moot.
    with pytest.raises(EncodeError, match="pass algorithm='tokennative' to tokenize it anyway"):
        select_algorithm("#TK|" + long, allowed=["tokennative"])
    assert select_algorithm("#TK|" + long, allowed=["tokennative", "brotli"]) is Algorithm.BROTLI
    with pytest.raises(EncodeError, match="none of the allowed"):
        select_algorithm(long, allowed=[])
