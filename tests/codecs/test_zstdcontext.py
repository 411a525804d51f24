"""The session-context zstd codec: wire format, bounds, integrity, dictionaries."""

from __future__ import annotations

import random
import tracemalloc
import zlib
from typing import TypeVar

import pytest
import zstandard

from m2mwire.codecs import compress, decode_wire, detect_algorithm
from m2mwire.codecs.select import Algorithm, is_prefix_like
from m2mwire.codecs.zstdcontext import (
    DEFAULT_WINDOW,
    MAX_WINDOW,
    MIN_WINDOW,
    OUTPUT_SLACK,
    ContextCompressor,
    ContextDecompressor,
    ZstdDictionary,
    normalize_window,
    payload_bound,
    train_dictionary,
)
from m2mwire.errors import DecodeError, EncodeError, LimitExceeded

_Context = TypeVar("_Context", ContextCompressor, ContextDecompressor)


def _primed(context: _Context, raw: bool) -> _Context:
    """``context``, restarted with a prefix when ``raw``: frames primed with history are the ones
    that use the raw libzstd context (codecs/zstdraw.py); the others use python-zstandard's objects."""
    if raw:
        context.restart(b"a prefix both ends agree on: the history of a session " * 20)
    return context


MESSAGES = [f'{{"step":{i},"history":"{"the same history again " * (i + 1)}"}}'.encode() for i in range(20)]


def test_each_payload_decodes_at_once_and_history_shrinks_later_messages() -> None:
    cc, dc = ContextCompressor(), ContextDecompressor()
    sizes = []
    for message in MESSAGES:
        payload = cc.compress(message)
        assert dc.decompress(payload, 1 << 20) == message
        sizes.append(len(payload))
    assert sizes[-1] < sizes[0] + 40  # the 20th message is mostly a reference to the 19th
    assert cc.messages == dc.messages == len(MESSAGES)


def test_wire_format_is_plain_zstd_with_a_crc32_per_message() -> None:
    """What a third implementation does: CRC-32 (big-endian) + the bytes of ZSTD_e_flush."""
    cc = ContextCompressor(window=1 << 16)
    payloads = [cc.compress(m) for m in MESSAGES]
    for message, payload in zip(MESSAGES, payloads, strict=True):
        assert int.from_bytes(payload[:4], "big") == zlib.crc32(message)
    assert payloads[0][4:8] == b"\x28\xb5\x2f\xfd"  # the frame header once, in the first message
    stream = zstandard.ZstdDecompressor().decompressobj()
    assert stream.decompress(b"".join(p[4:] for p in payloads)) == b"".join(MESSAGES)
    assert zstandard.get_frame_parameters(payloads[0][4:]).window_size == 1 << 16
    # ... and the other way round: a plain zstd stream flushed per message decodes here.
    plain = zstandard.ZstdCompressor(level=1).compressobj()
    dc = ContextDecompressor()
    for message in MESSAGES:
        body = plain.compress(message) + plain.flush(zstandard.COMPRESSOBJ_FLUSH_BLOCK)
        assert dc.decompress(zlib.crc32(message).to_bytes(4, "big") + body, 1 << 20) == message


@pytest.mark.parametrize("raw", [True, False], ids=["raw", "objects"])
def test_output_is_bounded_and_a_bomb_allocates_little(raw: bool) -> None:
    cc = _primed(ContextCompressor(raw=raw), raw)
    bomb = cc.compress(b"\0" * (64 << 20))
    assert len(bomb) < 16 * 1024
    dc = _primed(ContextDecompressor(raw=raw), raw)
    tracemalloc.start()
    try:
        with pytest.raises(LimitExceeded, match="over the limit of 1048576"):
            dc.decompress(bomb, 1 << 20)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < (1 << 20) + OUTPUT_SLACK + (1 << 20)


def test_exact_limit_is_accepted() -> None:
    cc, dc = ContextCompressor(), ContextDecompressor()
    assert dc.decompress(cc.compress(b"x" * 5000), 5000) == b"x" * 5000
    with pytest.raises(LimitExceeded):
        dc.decompress(cc.compress(b"x" * 5001), 5000)


@pytest.mark.parametrize("raw", [True, False], ids=["raw", "objects"])
def test_frame_with_a_larger_window_than_agreed_is_refused(raw: bool) -> None:
    big = _primed(ContextCompressor(window=MAX_WINDOW, raw=raw), raw)
    small = _primed(ContextDecompressor(window=1 << 16, raw=raw), raw)
    with pytest.raises(DecodeError, match="memory"):
        small.decompress(big.compress(b"abc" * 100), 1 << 20)


@pytest.mark.parametrize("position", [4, 6, -1, -2])
@pytest.mark.parametrize("raw", [True, False], ids=["raw", "objects"])
def test_corruption_anywhere_is_a_decode_error(position: int, raw: bool) -> None:
    cc, dc = _primed(ContextCompressor(raw=raw), raw), _primed(ContextDecompressor(raw=raw), raw)
    dc.decompress(cc.compress(MESSAGES[0]), 1 << 20)
    payload = bytearray(cc.compress(MESSAGES[5]))
    payload[position] ^= 0x20
    with pytest.raises(DecodeError, match="zstd"):
        dc.decompress(bytes(payload), 1 << 20)


def test_lost_and_reordered_messages_are_decode_errors() -> None:
    cc, dc = ContextCompressor(), ContextDecompressor()
    first, second, third = (cc.compress(m) for m in MESSAGES[:3])
    dc.decompress(first, 1 << 20)
    with pytest.raises(DecodeError, match=r"lost or reordered|corrupt"):
        dc.decompress(third, 1 << 20)


@pytest.mark.parametrize("raw", [True, False], ids=["raw", "objects"])
def test_short_payload_and_ended_frame_are_errors(raw: bool) -> None:
    with pytest.raises(DecodeError, match=r"shorter than its 4-byte CRC-32"):
        ContextDecompressor().decompress(b"\0\0", 100)
    ended = zstandard.ZstdCompressor(write_content_size=False).compress(b"hello")
    with pytest.raises(DecodeError, match="ended its zstd frame"):
        _primed(ContextDecompressor(raw=raw), raw).decompress(
            zlib.crc32(b"hello").to_bytes(4, "big") + ended, 100
        )


def test_reset_starts_a_new_frame_on_both_sides() -> None:
    cc, dc = ContextCompressor(), ContextDecompressor()
    dc.decompress(cc.compress(MESSAGES[0]), 1 << 20)
    cc.reset()
    dc.reset()
    payload = cc.compress(MESSAGES[1])
    assert payload[4:8] == b"\x28\xb5\x2f\xfd"
    assert dc.decompress(payload, 1 << 20) == MESSAGES[1]


def test_memory_is_taken_on_first_use_only() -> None:
    cc, dc = ContextCompressor(), ContextDecompressor()
    assert cc.memory_size() == dc.memory_size() == 0
    dc.decompress(cc.compress(b"x"), 10)
    assert cc.memory_size() > 0 and dc.memory_size() > 0


def test_windows() -> None:
    assert normalize_window(0) == DEFAULT_WINDOW
    assert normalize_window(3 << 20) == 2 << 20
    assert normalize_window(1) == MIN_WINDOW
    assert normalize_window(1 << 40) == MAX_WINDOW
    with pytest.raises(EncodeError, match="power of two"):
        ContextCompressor(window=3000)
    assert payload_bound(0) >= 4 + 18


def test_dictionary_primes_both_sides() -> None:
    samples = [m * 3 for m in MESSAGES] * 10
    dictionary = train_dictionary(samples, 4096)
    assert dictionary == ZstdDictionary(dictionary.data) and len(dictionary.id) == 64
    with_dict = ContextCompressor(dictionary=dictionary).compress(MESSAGES[7])
    without = ContextCompressor().compress(MESSAGES[7])
    assert len(with_dict) < len(without)
    assert ContextDecompressor(dictionary=dictionary).decompress(with_dict, 1 << 20) == MESSAGES[7]
    with pytest.raises(DecodeError):
        ContextDecompressor().decompress(with_dict, 1 << 20)
    with pytest.raises(EncodeError, match="train_dictionary"):
        ZstdDictionary(b"")
    with pytest.raises(EncodeError, match="needs sample"):
        train_dictionary([])


def test_text_prefix_is_reserved_and_needs_a_session() -> None:
    wire = "#ZS|AAAAAA=="
    assert detect_algorithm(wire) is Algorithm.ZSTD and is_prefix_like(wire)
    with pytest.raises(DecodeError, match="only that session"):
        decode_wire(wire)
    with pytest.raises(EncodeError, match=r"Session\.send"):
        compress("hello", "zstd")
    with pytest.raises(EncodeError, match="none of the allowed"):
        compress("hello", allowed=["zstd"])


@pytest.mark.parametrize("raw", [True, False], ids=["raw", "objects"])
def test_large_messages_take_the_sliced_path_and_round_trip(raw: bool) -> None:
    # Incompressible bytes: the payload is far above the one-call size, so it is fed in slices
    # (objects) or decoded into several output chunks (raw).
    big = random.Random(5).randbytes(3 << 20)
    cc, dc = _primed(ContextCompressor(raw=raw), raw), _primed(ContextDecompressor(raw=raw), raw)
    payload = cc.compress(big)
    assert len(payload) * 32768 > (16 << 20) + OUTPUT_SLACK
    assert dc.decompress(payload, 16 << 20) == big
    again = big[: 1 << 20] + b"tail"  # history still in step after the sliced message
    assert dc.decompress(cc.compress(again), 16 << 20) == again


def test_min_window_is_zstds_smallest() -> None:
    """MIN_WINDOW is written as a number (zstdcontext does not import zstandard until used)."""
    assert MIN_WINDOW == 1 << zstandard.WINDOWLOG_MIN
