"""Algorithm names and automatic algorithm selection.

:func:`select_algorithm` is a pure function of the content's size, a few substring probes and (only
when T1 is a candidate) one JSON parse: it never tokenizes or compresses. Its thresholds come from the
corpus measurements in docs/CODECS.md ("Automatic selection"), reproducible with
``benchmarks/bench_codecs.py``.
"""

from __future__ import annotations

import functools
import json
import re
import zlib
from collections.abc import Iterable
from enum import StrEnum
from typing import Literal

from m2mwire.codecs.tokenizers import Encoding, resolve_encoding
from m2mwire.codecs.utf8 import utf8_len
from m2mwire.errors import EncodeError

__all__ = [
    "EMITTABLE_ALGORITHMS",
    "Algorithm",
    "Optimize",
    "is_llm_api_payload",
    "is_prefix_like",
    "resolve_algorithm",
    "select_algorithm",
]

Optimize = Literal["bytes", "tokens"]


class Algorithm(StrEnum):
    """A compression algorithm; the value is the reference's serde name used in HELLO/ACCEPT/DATA."""

    TOKENNATIVE = "tokennative"
    TOKEN = "token"
    BROTLI = "brotli"
    DICTIONARY = "dictionary"
    NONE = "none"
    ZLIB = "zlib"  # deprecated M2M v2.0: decoded, never emitted
    M2M = "m2m"  # the reference 0.4's M2M v1 frame (#M2M|1|): JSON only
    # Session-context zstd (#ZS| / binary 0x5A): needs a session's context, so it is negotiated and
    # used by the session layer only, never by the stateless compress() or select_algorithm().
    ZSTD = "zstd"


EMITTABLE_ALGORITHMS: tuple[Algorithm, ...] = (
    Algorithm.TOKENNATIVE,
    Algorithm.TOKEN,
    Algorithm.BROTLI,
    Algorithm.DICTIONARY,
    Algorithm.NONE,
    Algorithm.M2M,
)

_ALGORITHM_ALIASES = {alg.value: alg for alg in Algorithm} | {"token_native": Algorithm.TOKENNATIVE}


def resolve_algorithm(name: str | Algorithm) -> Algorithm:
    """Map an algorithm name (``tokennative``, ``TOKEN_NATIVE``, ``brotli``, ..., any case) to Algorithm."""
    if isinstance(name, Algorithm):
        return name
    if isinstance(name, str):
        found = _ALGORITHM_ALIASES.get(name) or _ALGORITHM_ALIASES.get(name.strip().lower())
        if found is not None:
            return found
    raise EncodeError(
        f"unknown compression algorithm {name!r}; accepted (any case): tokennative / token_native, token, "
        "brotli, dictionary, m2m, none, zstd (sessions only), zlib (decode only)"
    )


# Anything the decoder would not hand back unchanged: an M2M-looking tag (#TK|, #T1|, #BR|, #DI|, #M3|,
# any #XX| / #XXX|) or anything starting with #M2M. Such content cannot travel as NONE.
_PREFIX_LIKE = re.compile(r"#(?:M2M|[A-Z0-9]{2,3}\|)")


def is_prefix_like(content: str) -> bool:
    """True when ``content`` starts like an M2M wire prefix, so sending it uncompressed would be ambiguous."""
    return content.startswith("#") and _PREFIX_LIKE.match(content) is not None


# Keys of OpenAI-style chat requests/responses/chunks; two distinct hits make a payload "LLM API" JSON.
_LLM_KEYS = (
    '"messages"',
    '"model"',
    '"role"',
    '"content"',
    '"choices"',
    '"delta"',
    '"tool_calls"',
    '"finish_reason"',
    '"usage"',
)
_PROBE_CHARS = 4096  # keys sit near the start; never scan a whole large payload
_FIRST_NON_SPACE = re.compile(r"\s*(\S)")


def _first_char(content: str) -> str:
    match = _FIRST_NON_SPACE.match(content)
    return match.group(1) if match else ""


def is_llm_api_payload(content: str) -> bool:
    """Cheap test: does ``content`` look like chat-API JSON (starts with ``{``, has two chat keys)?"""
    if _first_char(content) != "{":
        return False
    head = content[:_PROBE_CHARS]
    return sum(key in head for key in _LLM_KEYS) >= 2


def _is_json(content: str) -> bool:
    if _first_char(content) not in ("{", "["):
        return False
    try:
        json.loads(content)
    except (ValueError, RecursionError):
        return False
    return True


# Thresholds (UTF-8 bytes of the content); docs/CODECS.md "Automatic selection" has the measurements.
NONE_BELOW = 100  # seed 5.2.1; below this TokenNative saves at most ~15 bytes and doubles the tokens
BROTLI_FROM = 1024  # measured crossover: above ~1 KB Brotli's wire is smaller than TokenNative's
NON_ASCII_SHARE = 0.25  # bytes beyond one per character / total: CJK, emoji, ... tokenize poorly
# Automatic selection tokenizes (TokenNative) at most this many characters. Tokenizing runs on
# the event loop, and a peer that negotiated only tokennative made an echoing server tokenize all
# it sent back: 3 messages of 199 bytes (Brotli, 16 MiB each decoded) cost 29 s of CPU (stop 32's
# attack run). At 64 Ki characters a run of one letter still took 9.4 ms per 183-byte message;
# at 4,096, 0.42 ms (emoji 0.57 ms, prose 0.12 ms). Above it, where Brotli is not allowed,
# content goes as plain text: every M2M decoder reads unprefixed content as itself. (The seed's
# rules give TokenNative to content under 1 KB; ours, to content under 1 KiB where Brotli is
# allowed, and up to this where it is not.)
TOKENNATIVE_AUTO_MAX = 4096
# optimize="tokens": Brotli's base64 costs ~0.86 tokens per byte of a zlib-1 stream; pick it only when
# that is clearly below the content's estimated token count.
_BROTLI_TOKENS_PER_ZLIB1_BYTE = 0.86
_BROTLI_TOKEN_MARGIN = 0.9


def _allowed(allowed: Iterable[str | Algorithm] | None) -> tuple[Algorithm, ...]:
    if allowed is None:
        return EMITTABLE_ALGORITHMS
    return _allowed_tuple(tuple(allowed))


@functools.lru_cache(maxsize=256)
def _allowed_tuple(allowed: tuple[str | Algorithm, ...]) -> tuple[Algorithm, ...]:
    """The emittable algorithms among ``allowed``, in preference order. Cached: a session passes
    the same negotiated tuple with every message, and building this set and list each time was
    half of select_algorithm's ~1.2 us. An unknown name raises (an exception is not cached)."""
    wanted = {resolve_algorithm(a) for a in allowed}
    return tuple(a for a in EMITTABLE_ALGORITHMS if a in wanted)


def select_algorithm(
    content: str,
    *,
    allowed: Iterable[str | Algorithm] | None = None,
    optimize: Optimize = "bytes",
    encoding: str | Encoding = Encoding.CL100K,
) -> Algorithm:
    """Pick the algorithm for ``content`` among ``allowed`` (default: every emittable one).

    ``optimize="bytes"`` minimises wire bytes using byte-exact codecs (TokenNative, Brotli, None);
    ``"tokens"`` minimises the wire's LLM token count, where T1 (JSON-equivalent, not byte-identical)
    is preferred for chat-API JSON and Brotli for large, highly repetitive content. Content that is not
    JSON never gets T1 or m2m; prefix-like content never gets NONE; content of more than
    TOKENNATIVE_AUTO_MAX characters never gets TokenNative (NONE instead, allowed or not, when
    nothing else is allowed; EncodeError for prefix-like content). Nothing is tokenized; at most one zlib
    level-1 pass is made (``optimize="tokens"``, content of 1 KB or more). Raises :class:`EncodeError`
    when no allowed algorithm can carry the content.
    """
    resolve_encoding(encoding)  # validated for the caller; the measured rules hold for all three
    if optimize not in ("bytes", "tokens"):
        raise EncodeError(f"optimize must be 'bytes' or 'tokens', not {optimize!r}")
    candidates = _allowed(allowed)
    prefix_like = is_prefix_like(content)
    if prefix_like and Algorithm.NONE in candidates:
        candidates = tuple(a for a in candidates if a is not Algorithm.NONE)
    order = _bytes_order(content) if optimize == "bytes" else _tokens_order(content)
    json_ok: bool | None = None
    too_long = len(content) > TOKENNATIVE_AUTO_MAX
    for alg in order:
        if alg not in candidates:
            continue
        if alg is Algorithm.TOKENNATIVE and too_long:
            continue  # plain text below, if nothing else is allowed
        if alg is Algorithm.TOKEN or alg is Algorithm.M2M:
            if json_ok is None:
                json_ok = _is_json(content)
            if not json_ok:
                continue
        return alg
    if too_long and Algorithm.TOKENNATIVE in candidates:
        if not prefix_like:
            return Algorithm.NONE
        # Exempt, content that starts like a prefix made the cap moot: an attacker adds 4 bytes.
        raise EncodeError(
            f"this content starts like an M2M prefix, so it cannot go as plain text, and at "
            f"{len(content)} characters it is over the {TOKENNATIVE_AUTO_MAX} that automatic "
            "selection tokenizes: pass algorithm='tokennative' to tokenize it anyway, or offer "
            "brotli"
        )
    detail = " (it starts like an M2M prefix, so NONE cannot carry it)" if prefix_like else ""
    if Algorithm.TOKEN in candidates:
        detail += " (T1 needs JSON content)"
    if Algorithm.M2M in candidates:
        detail += " (m2m needs JSON content)"
    raise EncodeError(f"none of the allowed algorithms can carry this content{detail}")


_TK, _T1, _BR, _DI, _NONE, _M2M = (
    Algorithm.TOKENNATIVE,
    Algorithm.TOKEN,
    Algorithm.BROTLI,
    Algorithm.DICTIONARY,
    Algorithm.NONE,
    Algorithm.M2M,
)


def _sizes(content: str) -> tuple[int, int]:
    """(UTF-8 bytes, characters)."""
    chars = len(content)
    return utf8_len(content), chars


# T1 last: it is not byte-exact, so it is only a fallback here. Dictionary's base64 wire was larger
# than the content for every corpus payload over 100 bytes, so it comes after NONE. M2M v1 frames
# (byte-exact, JSON only) are Brotli q5 plus a header of 27 bytes or more, base64'd: never smaller
# than Brotli, so they serve peers that negotiated nothing better (the reference 0.4's default).
_SMALL_ORDER = (_NONE, _TK, _BR, _DI, _M2M, _T1)
_NON_ASCII_ORDER = (_BR, _NONE, _TK, _DI, _M2M, _T1)
_LARGE_ORDER = (_BR, _TK, _NONE, _DI, _M2M, _T1)
_MEDIUM_ORDER = (_TK, _BR, _NONE, _DI, _M2M, _T1)


def _bytes_order(content: str) -> tuple[Algorithm, ...]:
    size, chars = _sizes(content)
    if size < NONE_BELOW:
        return _SMALL_ORDER
    if (size - chars) >= NON_ASCII_SHARE * size:
        return _NON_ASCII_ORDER
    if size >= BROTLI_FROM:
        return _LARGE_ORDER
    return _MEDIUM_ORDER


def _estimated_tokens(content: str, size: int, chars: int) -> float:
    # ~4 bytes per token for ASCII text, ~2 for digits (cl100k/o200k split numbers into 1-3 digits),
    # ~1 per non-ASCII character. Only used to decide whether Brotli can beat plain text on tokens.
    non_ascii = (size - chars) / 2
    digits = sum(map(content.count, "0123456789"))
    return (chars - non_ascii - digits) / 4 + digits / 2 + non_ascii


def _tokens_order(content: str) -> tuple[Algorithm, ...]:
    size, chars = _sizes(content)
    if size >= BROTLI_FROM:
        zlib1 = len(zlib.compress(content.encode("utf-8", "surrogatepass"), 1))
        if _BROTLI_TOKENS_PER_ZLIB1_BYTE * zlib1 < _BROTLI_TOKEN_MARGIN * _estimated_tokens(
            content, size, chars
        ):
            return (_BR, _NONE, _T1, _TK, _DI, _M2M)
    first = (_T1,) if is_llm_api_payload(content) else ()
    rest = (_TK, _BR) if size < BROTLI_FROM else (_BR, _TK)
    return (*first, _NONE, _T1, *rest, _DI, _M2M)
