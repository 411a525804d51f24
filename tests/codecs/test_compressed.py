"""Brotli (#M2M[v3.0]|DATA:, #BR|) and deprecated zlib (#M2M[v2.0]|DATA:): round trips, bombs, errors."""

from __future__ import annotations

import base64
import contextlib
import logging
import time
import tracemalloc
import zlib

import brotli
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from m2mwire.codecs.compressed import (
    BROTLI_PREFIX,
    DEFAULT_BROTLI_QUALITY,
    ZLIB_PREFIX,
    brotli_decompress,
    decode_brotli,
    decode_zlib,
    encode_brotli,
)
from m2mwire.codecs.limits import Limits
from m2mwire.errors import DecodeError, EncodeError, LimitExceeded

SETTINGS = settings(max_examples=120, deadline=None)
MiB = 1 << 20


def _brotli_zero_bomb(chunks: int) -> bytes:
    """A Brotli stream of ``chunks`` x 16 MiB of zeros, built without compressing them all.

    After a flush, each further 16 MiB of zeros compresses to the same few bytes, so the middle block
    is replicated (verified once by decompressing the 64-chunk bomb: exactly 1 GiB of zeros, 897 bytes).
    """
    compressor = brotli.Compressor(quality=5, lgwin=24)
    block = bytes(16 * MiB)
    first = compressor.process(block) + compressor.flush()
    middle = compressor.process(block) + compressor.flush()
    return first + middle * (chunks - 1) + compressor.finish()


@pytest.fixture(scope="module")
def gib_bomb() -> bytes:
    return _brotli_zero_bomb(64)


def _zlib_wire(data: bytes) -> str:
    return ZLIB_PREFIX + base64.b64encode(zlib.compress(data)).decode()


# --- Brotli --------------------------------------------------------------------------------------------


@SETTINGS
@given(st.text())
def test_brotli_roundtrip(text: str) -> None:
    wire = encode_brotli(text)
    assert wire.startswith(BROTLI_PREFIX) and wire.isascii()
    assert decode_brotli(wire) == text
    assert decode_brotli("#BR|" + wire[len(BROTLI_PREFIX) :]) == text


@pytest.mark.parametrize("quality", [0, 1, 4, 5, 6, 11])
def test_brotli_qualities_roundtrip(quality: int) -> None:
    text = '{"messages":[{"role":"user","content":"héllo 👋"}]}' * 20
    assert decode_brotli(encode_brotli(text, quality=quality)) == text


def test_default_quality_is_the_measured_choice() -> None:
    assert DEFAULT_BROTLI_QUALITY == 5
    text = "hello world " * 100
    assert (
        encode_brotli(text)
        == BROTLI_PREFIX + base64.b64encode(brotli.compress(text.encode(), quality=5)).decode()
    )


def test_brotli_rejects_bad_quality_and_surrogates() -> None:
    with pytest.raises(EncodeError, match=r"quality must be 0\.\.11"):
        encode_brotli("x", quality=12)
    with pytest.raises(EncodeError, match="lone surrogate"):
        encode_brotli("\udc80")


def test_brotli_bomb_is_refused_quickly_with_little_memory(gib_bomb: bytes) -> None:
    assert len(gib_bomb) < 1024
    wire = BROTLI_PREFIX + base64.b64encode(gib_bomb).decode()
    tracemalloc.start()
    started = time.perf_counter()
    try:
        with pytest.raises(
            LimitExceeded, match=r"decompressed Brotli content .* over the limit of 16777216"
        ) as info:
            decode_brotli(wire)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert time.perf_counter() - started < 10
    assert info.value.limit == 16 * MiB
    assert peak < 64 * MiB  # the limit plus about one output slice, never the gigabyte


def test_brotli_bomb_with_a_small_limit(gib_bomb: bytes) -> None:
    with pytest.raises(LimitExceeded, match="over the limit of 1000 bytes"):
        brotli_decompress(gib_bomb, 1000)


def test_bomb_construction_is_sound() -> None:
    small = _brotli_zero_bomb(2)
    assert brotli_decompress(small, 64 * MiB) == bytes(32 * MiB)


def test_output_exactly_at_the_limit_is_accepted() -> None:
    data = brotli.compress(b"a" * 5000)
    assert brotli_decompress(data, 5000) == b"a" * 5000
    with pytest.raises(LimitExceeded):
        brotli_decompress(data, 4999)


@pytest.mark.parametrize(
    ("wire", "error", "message"),
    [
        ("#M2M[v3.0]|G0gA", DecodeError, r"must start with '#M2M\[v3.0\]\|DATA:'"),
        ("#M2M|DATA:G0gA", DecodeError, r"not a Brotli message"),
        (BROTLI_PREFIX + "G0gA4IzUYs0Z7kSQt5Rd17Rmoim2N9N-ikUH", DecodeError, r"character '-' at offset 47"),
        (BROTLI_PREFIX + "////", DecodeError, r"corrupt Brotli stream"),
        (BROTLI_PREFIX + "AAAA", DecodeError, r"truncated Brotli stream"),
        (BROTLI_PREFIX, DecodeError, r"truncated Brotli stream"),
    ],
)
def test_brotli_errors(wire: str, error: type[Exception], message: str) -> None:
    with pytest.raises(error, match=message):
        decode_brotli(wire)


def test_brotli_truncated_and_trailing_garbage() -> None:
    data = brotli.compress(b"hello world " * 30)
    with pytest.raises(DecodeError, match="truncated Brotli stream"):
        decode_brotli(BROTLI_PREFIX + base64.b64encode(data[:-3]).decode())
    with pytest.raises(DecodeError, match="corrupt Brotli stream"):
        decode_brotli(BROTLI_PREFIX + base64.b64encode(data + b"xx").decode())


def test_brotli_content_must_be_utf8() -> None:
    wire = BROTLI_PREFIX + base64.b64encode(brotli.compress(b"ok \xff\xfe")).decode()
    with pytest.raises(DecodeError, match=r"Brotli content is not valid UTF-8 at byte 3"):
        decode_brotli(wire)


def test_brotli_wire_limit_checked_first() -> None:
    with pytest.raises(LimitExceeded, match="Brotli wire message"):
        decode_brotli(BROTLI_PREFIX + "!" * 100, limits=Limits(max_message_bytes=64))
    with pytest.raises(LimitExceeded, match="Brotli wire message"):
        encode_brotli("x" * 100, limits=Limits(max_message_bytes=20))


# --- zlib v2.0 -----------------------------------------------------------------------------------------


def test_zlib_decodes_with_a_warning(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="m2mwire.codecs"):
        assert decode_zlib(_zlib_wire("héllo wörld 👋".encode())) == "héllo wörld 👋"
    assert any("deprecated M2M v2.0" in r.getMessage() for r in caplog.records)


def test_zlib_gzip_framing_also_read() -> None:
    import gzip

    wire = ZLIB_PREFIX + base64.b64encode(gzip.compress(b"gzipped")).decode()
    assert decode_zlib(wire) == "gzipped"


def test_zlib_falls_back_to_brotli_as_the_seed_allows() -> None:
    wire = ZLIB_PREFIX + base64.b64encode(brotli.compress(b"brotli inside v2")).decode()
    assert decode_zlib(wire) == "brotli inside v2"


def test_zlib_bomb_is_capped() -> None:
    compressor = zlib.compressobj(9)
    block = bytes(16 * MiB)
    bomb = b"".join(compressor.compress(block) for _ in range(4)) + compressor.flush()  # 64 MiB of zeros
    wire = ZLIB_PREFIX + base64.b64encode(bomb).decode()
    tracemalloc.start()
    try:
        with pytest.raises(LimitExceeded, match="decompressed zlib content"):
            decode_zlib(wire, limits=Limits(max_output_bytes=4 * MiB))
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 32 * MiB


@pytest.mark.parametrize(
    ("payload", "message"),
    [
        (b"not compressed at all", r"corrupt zlib stream.*not a Brotli stream either"),
        (zlib.compress(b"hello world")[:-4], r"truncated zlib stream"),
        (zlib.compress(b"hello") + b"junk", r"4 bytes of garbage after the end of the zlib stream"),
        (zlib.compress(b"\xff\xfe"), r"zlib content is not valid UTF-8 at byte 0"),
    ],
)
def test_zlib_errors(payload: bytes, message: str) -> None:
    with pytest.raises(DecodeError, match=message):
        decode_zlib(ZLIB_PREFIX + base64.b64encode(payload).decode())


def test_zlib_prefix_required() -> None:
    with pytest.raises(DecodeError, match=r"expected the prefix '#M2M\[v2.0\]\|DATA:'"):
        decode_zlib("#M2M[v2.0]|eJw=")


# --- mutation fuzzing ----------------------------------------------------------------------------------

BASE = encode_brotli('{"model":"gpt-4o","messages":[{"role":"user","content":"Hello, world! 👋"}]}' * 3)


@SETTINGS
@given(
    position=st.integers(min_value=0, max_value=400),
    kind=st.sampled_from(["flip", "truncate", "insert"]),
    char=st.sampled_from("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/=-_ é"),
)
def test_mutated_brotli_only_raises_decode_errors(position: int, kind: str, char: str) -> None:
    i = position % (len(BASE) + 1)
    mutated = {
        "flip": BASE[:i] + char + BASE[i + 1 :],
        "truncate": BASE[:i],
        "insert": BASE[:i] + char + BASE[i:],
    }[kind]
    for candidate in (mutated, ZLIB_PREFIX + mutated[len(BROTLI_PREFIX) :]):
        decoder = decode_zlib if candidate.startswith(ZLIB_PREFIX) else decode_brotli
        with contextlib.suppress(DecodeError, LimitExceeded):
            assert isinstance(decoder(candidate), str)


@SETTINGS
@given(st.binary(max_size=64))
def test_random_streams_only_raise_decode_errors(data: bytes) -> None:
    for prefix, decoder in ((BROTLI_PREFIX, decode_brotli), (ZLIB_PREFIX, decode_zlib)):
        with contextlib.suppress(DecodeError, LimitExceeded):
            assert isinstance(decoder(prefix + base64.b64encode(data).decode()), str)
