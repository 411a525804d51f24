"""The raw libzstd contexts (codecs/zstdraw.py) against python-zstandard's objects (the general
path): same wire, each decodes what the other makes, and a new frame rebuilds no context."""

from __future__ import annotations

import random

import pytest
import zstandard
from hypothesis import given, settings
from hypothesis import strategies as st

from m2mwire.codecs.zstdcontext import ContextCompressor, ContextDecompressor, train_dictionary
from m2mwire.codecs.zstdraw import OUTPUT_CHUNK, REQUIRED, binding_supported, raw_available
from m2mwire.errors import DecodeError, LimitExceeded

pytestmark = pytest.mark.skipif(not raw_available(), reason="python-zstandard without its cffi module")

WORDS = [f"w{i}".encode() for i in range(200)]
DICTIONARY = train_dictionary([b" ".join(random.Random(i).choices(WORDS, k=200)) for i in range(200)], 4096)

# An operation: (0, seed) = compress a message; (1, seed) = restart with a prefix cut from the
# messages so far (seed 0: an empty prefix); (2, _) = reset.
OPS = st.lists(st.tuples(st.integers(0, 2), st.integers(0, 2**16)), min_size=1, max_size=40)


def _message(rng: random.Random, sent: list[bytes]) -> bytes:
    if rng.random() < 0.1:
        return b""  # in a frame already begun: a payload with no zstd bytes at all
    parts = [b" ".join(rng.choices(WORDS, k=rng.randint(0, 300)))]
    if sent and rng.random() < 0.6:  # a quote of an earlier message: what a prefix is for
        quoted = rng.choice(sent)
        start = rng.randrange(len(quoted) + 1)
        parts.append(quoted[start : start + rng.randint(0, 2000)])
    if rng.random() < 0.1:  # incompressible: raw blocks
        parts.append(rng.randbytes(rng.randint(0, 5000)))
    return b"|".join(parts)


@settings(max_examples=80, deadline=None)
@given(ops=OPS, seed=st.integers(0, 2**32 - 1), window_log=st.integers(10, 20), dictionary=st.booleans())
def test_raw_and_object_contexts_decode_each_other(
    ops: list[tuple[int, int]], seed: int, window_log: int, dictionary: bool
) -> None:
    """Differential: the same operations on a raw and an object pair; every payload decodes to
    its message in all four combinations, and where no prefix is involved the bytes are equal."""
    rng = random.Random(seed)
    window = 1 << window_log
    kwargs = {"dictionary": DICTIONARY if dictionary else None}
    compressors = {raw: ContextCompressor(window, raw=raw, **kwargs) for raw in (True, False)}
    decompressors = {
        (made, reader): ContextDecompressor(window, raw=reader, **kwargs)
        for made in (True, False)
        for reader in (True, False)
    }
    sent: list[bytes] = []
    primed = False  # the current frames started with a prefix
    for op, value in ops:
        if op == 0:
            message = _message(rng, sent)
            payloads = {raw: compressor.compress(message) for raw, compressor in compressors.items()}
            if not primed:
                assert payloads[True] == payloads[False]
            for (made, _), decompressor in decompressors.items():
                assert decompressor.decompress(payloads[made], 1 << 24) == message
            sent.append(message)
        elif op == 1:
            history = b"".join(sent)[-window:]
            prefix = history[-(value % (len(history) + 1)) :] if value % 7 else b""
            primed = bool(prefix)
            for context in (*compressors.values(), *decompressors.values()):
                context.restart(prefix)
        else:
            primed = False
            for context in (*compressors.values(), *decompressors.values()):
                context.reset()


def test_a_new_frame_builds_no_new_zstd_context(monkeypatch: pytest.MonkeyPatch) -> None:
    """Regression: every restarted frame built a ZstdCompressor and a ZstdDecompressor (~8 µs
    each to construct, plus a fresh workspace: ~30 µs per restarted message on the two ends); now
    one libzstd context per direction lives as long as the session."""
    built = {"compressors": 0, "decompressors": 0}
    real_compressor, real_decompressor = zstandard.ZstdCompressor, zstandard.ZstdDecompressor

    def compressor(*args: object, **kwargs: object) -> zstandard.ZstdCompressor:
        built["compressors"] += 1
        return real_compressor(*args, **kwargs)  # type: ignore[arg-type]

    def decompressor(*args: object, **kwargs: object) -> zstandard.ZstdDecompressor:
        built["decompressors"] += 1
        return real_decompressor(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(zstandard, "ZstdCompressor", compressor)
    monkeypatch.setattr(zstandard, "ZstdDecompressor", decompressor)
    cc, dc = ContextCompressor(), ContextDecompressor()
    history = b"the system prompt and the tools, which every frame of the session is primed with. "
    for i in range(50):
        message = b"a reply quoting the request before it: " + history[-600:] + str(i).encode()
        cc.restart(history)
        dc.restart(history)
        assert dc.decompress(cc.compress(message), 1 << 20) == message
        history += message
    assert built == {"compressors": 0, "decompressors": 0}


def test_raw_output_bound_is_one_chunk_past_the_limit() -> None:
    """A bomb is refused after at most OUTPUT_CHUNK bytes past the limit (one call's output)."""
    cc, dc = ContextCompressor(), ContextDecompressor()
    for context in (cc, dc):
        context.restart(b"history: frames primed with it use the raw contexts")
    bomb = cc.compress(b"\0" * (8 << 20))
    with pytest.raises(LimitExceeded, match="over the limit of 100000"):
        dc.decompress(bomb, 100_000)
    assert OUTPUT_CHUNK <= 64 * 1024


def test_raw_errors_are_decode_errors_naming_zstd() -> None:
    cc, dc = ContextCompressor(), ContextDecompressor()
    for context in (cc, dc):
        context.restart(b"history: frames primed with it use the raw contexts")
    payload = bytearray(cc.compress(b"hello " * 100))
    payload[6] ^= 0xFF  # inside the frame header
    with pytest.raises(DecodeError, match="corrupt zstd context message #1"):
        dc.decompress(bytes(payload), 1 << 20)


def test_only_the_verified_python_zstandard_binding_is_used() -> None:
    """The cffi ``lib`` is python-zstandard's internal: another minor version, or a binding that
    lacks a name this module calls, falls back to the objects instead of failing later."""
    import zstandard
    from zstandard import backend_cffi

    assert binding_supported(zstandard.__version__, backend_cffi.lib)  # what this suite runs on
    assert not binding_supported("0.26.0", backend_cffi.lib)
    assert not binding_supported("0.24.1", backend_cffi.lib)
    assert not binding_supported("dev", backend_cffi.lib)

    class Lacking:
        pass

    for name in REQUIRED:
        setattr(Lacking, name, 0)
    assert binding_supported(zstandard.__version__, Lacking)
    delattr(Lacking, "ZSTD_CCtx_refPrefix")
    assert not binding_supported(zstandard.__version__, Lacking)


def test_small_payloads_decode_into_the_contexts_own_buffer(monkeypatch: pytest.MonkeyPatch) -> None:
    """Regression (cost): a payload of 129 bytes to 1 KiB (a 1 KB message's, agent-like or novel)
    got an output buffer of 32 x its size allocated per message, though its output fits the 4 KiB
    one the context keeps. Now only output that outgrows that buffer allocates, and it still
    decodes whole (a 1 KiB payload expanding to 200 KB) and within its limit."""
    from m2mwire.codecs import zstdraw

    cc, dc = ContextCompressor(), ContextDecompressor()
    for context in (cc, dc):
        context.restart(b"history: frames primed with it use the raw contexts")
    rng = random.Random(1)
    small = [bytes(rng.choices(b"abcdefghij ", k=1000)) for _ in range(5)]
    payloads = [cc.compress(message) for message in small]
    assert all(129 <= len(p) <= 1024 for p in payloads)
    assert dc.decompress(payloads.pop(0), 1 << 20) == small.pop(0)  # the context is made here
    allocated: list[object] = []
    real = zstdraw._new_buffer
    monkeypatch.setattr(zstdraw, "_new_buffer", lambda *a: allocated.append(a) or real(*a))
    assert [dc.decompress(p, 1 << 20) for p in payloads] == small
    assert allocated == []
    big = b"x" * 200_000 + bytes(rng.choices(b"abcdefghij ", k=700))
    payload = cc.compress(big)
    assert len(payload) <= 1024
    assert dc.decompress(payload, 1 << 20) == big
    assert allocated  # output past the context's buffer: pieces of OUTPUT_CHUNK
    bomb = cc.compress(big)
    with pytest.raises(LimitExceeded, match="over the limit of 100000"):
        dc.decompress(bomb, 100_000)
