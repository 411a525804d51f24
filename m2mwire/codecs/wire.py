"""The M2M text wire: prefix dispatch for decoding, and :func:`compress` for encoding.

Decoder dispatch, first match wins:

=====================  ==========================================================
``#M2M|1|``            M2M v1 frame (the reference 0.4's default ``m2m``), text form
``#TK|``               TokenNative
``#T1|``               Token (T1)
``#M2M[v3.0]|``        Brotli (must continue with ``DATA:``)
``#M2M[v2.0]|``        deprecated zlib (must continue with ``DATA:``), logged warning
``#BR|``               Brotli (compression-doc spelling)
``#DI|`` / ``#M2M|``   Dictionary
``#ZS|``               session-context zstd: only its session can decode it, DecodeError here
other ``#M2M...``      DecodeError
``#XX|`` / ``#XXX|``   (A-Z, 0-9) unknown prefix: DecodeError
anything else          NONE: returned unchanged
=====================  ==========================================================
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Literal, NamedTuple

from m2mwire.codecs.compressed import (
    BROTLI_ALT_PREFIX,
    BROTLI_PREFIX,
    ZLIB_PREFIX,
    decode_brotli,
    decode_zlib,
    encode_brotli,
)
from m2mwire.codecs.dictionary import (
    DICTIONARY_ALT_PREFIX,
    DICTIONARY_PREFIX,
    decode_dictionary,
    encode_dictionary,
)
from m2mwire.codecs.limits import DEFAULT_LIMITS, Limits, check_size
from m2mwire.codecs.m2mframe import M2M_PREFIX, decode_m2m, encode_m2m
from m2mwire.codecs.select import (
    EMITTABLE_ALGORITHMS,
    Algorithm,
    Optimize,
    is_prefix_like,
    resolve_algorithm,
    select_algorithm,
)
from m2mwire.codecs.tokenizers import Encoding, resolve_encoding
from m2mwire.codecs.tokennative import TK_PREFIX, decode_tokennative, encode_tokennative, parse_tk_header
from m2mwire.codecs.utf8 import utf8_len
from m2mwire.codecs.varint import utf8
from m2mwire.errors import DecodeError, EncodeError, LimitExceeded

__all__ = ["T1_PREFIX", "Decoded", "compress", "decode_wire", "decompress", "detect_algorithm", "encode_with"]

T1_PREFIX = "#T1|"
# Algorithms that parse the content as JSON: both refuse (EncodeError/LimitExceeded) what T1 refuses.
_JSON_ONLY = frozenset({Algorithm.TOKEN, Algorithm.M2M})
ZSTD_PREFIX = "#ZS|"  # m2mwire.codecs.zstdcontext (not imported here: it needs a session's context)
_UNKNOWN_TAG = re.compile(r"#[A-Z0-9]{2,3}\|")


class Decoded(NamedTuple):
    """A decoded wire message: the content, the algorithm its prefix named, and the TokenNative tokenizer."""

    content: str
    algorithm: Algorithm
    encoding: Encoding | None = None


# The one enum alias codecs keep: compress() compares against NONE on every message, and a module
# global reads in ~7 ns against ~47 ns for Algorithm.NONE (timeit, CPython 3.11).
_NONE = Algorithm.NONE


def detect_algorithm(wire: str) -> Algorithm:
    """The algorithm named by ``wire``'s prefix (NONE when it has none).

    Raises :class:`DecodeError` for an unknown ``#M2M...`` form or an unknown ``#XX|`` tag.
    """
    if wire.startswith("#"):
        if wire.startswith(M2M_PREFIX):  # before #M2M| (Dictionary), which it also starts with
            return Algorithm.M2M
        if wire.startswith(TK_PREFIX):
            return Algorithm.TOKENNATIVE
        if wire.startswith(T1_PREFIX):
            return Algorithm.TOKEN
        if wire.startswith(("#M2M[v3.0]|", BROTLI_ALT_PREFIX)):
            return Algorithm.BROTLI
        if wire.startswith("#M2M[v2.0]|"):
            return Algorithm.ZLIB
        if wire.startswith((DICTIONARY_PREFIX, DICTIONARY_ALT_PREFIX)):
            return Algorithm.DICTIONARY
        if wire.startswith(ZSTD_PREFIX):
            return Algorithm.ZSTD
        if wire.startswith("#M2M"):
            raise DecodeError(
                f"unknown M2M prefix {wire[:16]!r}: expected '#M2M|1|' (M2M v1), '#M2M[v3.0]|DATA:' "
                "(Brotli), '#M2M[v2.0]|DATA:' (zlib) or '#M2M|' (Dictionary)"
            )
        match = _UNKNOWN_TAG.match(wire)
        if match:
            raise DecodeError(
                f"unknown M2M prefix {match.group()!r}: m2mwire reads #M2M|1|, #TK|, #T1|, #M2M[v3.0]|DATA:, "
                "#BR|, #M2M|, #DI| and #M2M[v2.0]|DATA:"
            )
    return Algorithm.NONE


def decode_wire(wire: str, *, limits: Limits = DEFAULT_LIMITS) -> Decoded:
    """Decode any M2M wire string; returns the content with the algorithm (and tokenizer) used."""
    if not isinstance(wire, str):
        raise DecodeError(f"a wire message is a str, not {type(wire).__name__}")
    size = utf8_len(wire)
    check_size("wire message", size, limits.max_message_bytes)
    if not wire.startswith("#"):  # fast path: no prefix at all, so NONE (the per-message hot case)
        check_size("content", size, limits.max_output_bytes)
        return Decoded(wire, _NONE)
    algorithm = detect_algorithm(wire)
    if algorithm is Algorithm.TOKENNATIVE:
        encoding, _ = parse_tk_header(wire)
        return Decoded(decode_tokennative(wire, limits=limits), algorithm, encoding)
    if algorithm is Algorithm.TOKEN:
        from m2mwire.codecs.t1 import decode_t1  # T1 is another module's; imported on first use

        return Decoded(decode_t1(wire, limits=limits), algorithm)
    if algorithm is Algorithm.BROTLI:
        if wire.startswith("#M2M[v3.0]|") and not wire.startswith(BROTLI_PREFIX):
            raise DecodeError(f"Brotli message must start with {BROTLI_PREFIX!r}")
        return Decoded(decode_brotli(wire, limits=limits), algorithm)
    if algorithm is Algorithm.ZLIB:
        if not wire.startswith(ZLIB_PREFIX):
            raise DecodeError(f"zlib v2.0 message must start with {ZLIB_PREFIX!r}")
        return Decoded(decode_zlib(wire, limits=limits), algorithm)
    if algorithm is Algorithm.DICTIONARY:
        return Decoded(decode_dictionary(wire, limits=limits), algorithm)
    if algorithm is Algorithm.M2M:
        return Decoded(decode_m2m(wire, limits=limits), algorithm)
    if algorithm is Algorithm.ZSTD:
        raise DecodeError(
            "a #ZS| message is compressed in its session's zstd context (all earlier messages are its "
            "history), so only that session can decode it"
        )
    check_size("content", utf8_len(wire), limits.max_output_bytes)
    return Decoded(wire, Algorithm.NONE)


def decompress(wire: str, *, limits: Limits = DEFAULT_LIMITS) -> str:
    """Decode any M2M wire string to its content (see :func:`decode_wire`)."""
    return decode_wire(wire, limits=limits).content


def compress(
    content: str,
    algorithm: str | Algorithm | None = None,
    *,
    encoding: str | Encoding = Encoding.CL100K,
    optimize: Optimize = "bytes",
    allowed: Iterable[str | Algorithm] | None = None,
    t1_dialect: Literal["seed", "reference"] = "seed",
    limits: Limits = DEFAULT_LIMITS,
) -> str:
    """Encode ``content`` as an M2M wire string.

    ``algorithm=None`` selects automatically among ``allowed`` (default: every emittable algorithm), see
    :func:`select_algorithm`. ``encoding`` is the TokenNative tokenizer. Raises :class:`EncodeError` for
    an unusable algorithm (ZLIB is never emitted; NONE cannot carry prefix-like content; T1 and m2m
    need JSON),
    :class:`LimitExceeded` for content over ``limits.max_output_bytes`` or a wire over
    ``limits.max_message_bytes``.
    """
    if not isinstance(content, str):
        raise EncodeError(f"compress() takes text (str), not {type(content).__name__}")
    enc = resolve_encoding(encoding)
    allowed = None if allowed is None else list(allowed)  # may be a one-shot iterator; used up to twice
    if algorithm is None:
        alg = select_algorithm(content, allowed=allowed, optimize=optimize, encoding=enc)
    else:
        alg = resolve_algorithm(algorithm)
        if alg is Algorithm.ZLIB:
            raise EncodeError("zlib (M2M v2.0) is deprecated and never emitted; use brotli")
        if allowed is not None and alg not in {resolve_algorithm(a) for a in allowed}:
            raise EncodeError(f"algorithm {alg.value!r} is not among the allowed ones")
    if algorithm is None and alg in _JSON_ONLY:
        try:
            return encode_with(content, alg, enc, t1_dialect=t1_dialect, limits=limits)
        except (EncodeError, LimitExceeded):
            # e.g. JSON nested deeper than limits.max_json_depth: T1 and m2m parse it, the others do
            # not need to.
            others = [a for a in (allowed or EMITTABLE_ALGORITHMS) if resolve_algorithm(a) not in _JSON_ONLY]
            if not others:
                raise
            alg = select_algorithm(content, allowed=others, optimize=optimize, encoding=enc)
    return encode_with(content, alg, enc, t1_dialect=t1_dialect, limits=limits)


def encode_with(
    content: str,
    algorithm: Algorithm,
    encoding: Encoding,
    *,
    t1_dialect: Literal["seed", "reference"] = "seed",
    limits: Limits = DEFAULT_LIMITS,
) -> str:
    """:func:`compress` with the algorithm and tokenizer already resolved and allowed.

    The session's per-message path: it checked both against what was negotiated, so nothing is
    looked up or validated twice. ``algorithm`` must not be ZLIB (never emitted).
    """
    size = utf8_len(content)
    if size > limits.max_output_bytes:  # a peer with the same limits could not decode it
        check_size("content", size, limits.max_output_bytes)
    if algorithm is _NONE:  # the per-message hot case: checks only, no copy
        if content.startswith("#") and is_prefix_like(content):
            raise EncodeError(
                f"content starting with {content[:8]!r} looks like an M2M prefix, so it cannot be sent "
                "uncompressed (the receiver would try to decode it); use another algorithm, e.g. brotli "
                "or tokennative"
            )
        if not content.isascii():
            utf8(content)
        if size > limits.max_message_bytes:
            check_size("wire message", size, limits.max_message_bytes)
        return content
    if algorithm is Algorithm.TOKENNATIVE:
        return encode_tokennative(content, encoding, limits=limits)
    if algorithm is Algorithm.BROTLI:
        return encode_brotli(content, limits=limits)
    if algorithm is Algorithm.DICTIONARY:
        return encode_dictionary(content, limits=limits)
    if algorithm is Algorithm.TOKEN:
        from m2mwire.codecs.t1 import encode_t1  # T1 is another module's; imported on first use

        return encode_t1(content, dialect=t1_dialect, limits=limits)
    if algorithm is Algorithm.M2M:
        return encode_m2m(content, limits=limits)
    if algorithm is Algorithm.ZSTD:
        raise EncodeError(
            "zstd compresses each message in its session's context: send it with Session.send(), or use "
            "m2mwire.codecs.zstdcontext.ContextCompressor directly"
        )
    raise EncodeError("zlib (M2M v2.0) is deprecated and never emitted; use brotli")
