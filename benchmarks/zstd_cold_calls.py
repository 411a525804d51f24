"""What one zstd codec call costs when its caches are cold, as in a session, against a hot loop.

Issue 16 asks for the 1 KB round trip within 1.1x of algorithm `none`. A round trip makes four
codec calls (compress and decompress each way). In a hot loop they cost ~5 µs in all, but in a
session the round trip runs ~90 µs of other Python (asyncio, websockets, the session) between two
calls of one context, and the context's code and tables are cold again by then. This measures one
per-direction context (python-zstandard's objects, the default session parameters: window 1 MiB,
hash/chain tables capped: codecs/zstdcontext.py's own parameters) at several levels, with and without
touching 8 MiB of other memory between two messages, over the benchmark's 1 KB messages:
``agent`` (the same JSON shape with a few new words, what agents exchange) and ``novel`` (new text
every time). The session itself takes levels 1-19 (``zstd={"level": N}``); negative levels are
shown to say whether zstd's fastest mode would change the picture.

    .venv/bin/python benchmarks/zstd_cold_calls.py [--tables]

``--tables`` measures level 3 with smaller match-finder tables than the session's (hash log 15,
chain log 14): what a cold call saves against the bytes it costs.
"""

from __future__ import annotations

import argparse
import statistics
import time

import zstandard
from bench_context import rtt_messages

from m2mwire.codecs.zstdcontext import DEFAULT_WINDOW, _parameters

_FLUSH = bytearray(8 << 20)


def _evict() -> None:
    """Touch a cache line every 64 bytes of 8 MiB: what the rest of a round trip does to L1/L2."""
    flush = _FLUSH
    for i in range(0, len(flush), 64):
        flush[i] = 1


def per_call(
    messages: list[bytes], level: int, cold: bool, tables: tuple[int, int] | None = None
) -> tuple[float, float, float]:
    """Median µs to compress and to decompress one message in one context per direction, and the
    mean compressed bytes, over every second message after 100 (the others warm the history).
    ``tables``: (hash log, chain log) in place of the session's."""
    params = _parameters(level, DEFAULT_WINDOW)
    if tables is not None:
        params = zstandard.ZstdCompressionParameters.from_level(
            level,
            window_log=params.window_log,
            hash_log=tables[0],
            chain_log=tables[1],
            write_checksum=0,
            write_content_size=0,
            write_dict_id=0,
        )
    compressor = zstandard.ZstdCompressor(compression_params=params).compressobj()
    decompressor = zstandard.ZstdDecompressor(max_window_size=DEFAULT_WINDOW).decompressobj()
    c_times, d_times, sizes = [], [], []
    for i, message in enumerate(messages):
        timed = i >= 100 and i % 2 == 1
        if timed and cold:
            _evict()
        t0 = time.perf_counter_ns()
        out = compressor.compress(message) + compressor.flush(zstandard.COMPRESSOBJ_FLUSH_BLOCK)
        t1 = time.perf_counter_ns()
        back = decompressor.decompress(out)
        t2 = time.perf_counter_ns()
        assert back == message
        if timed:
            c_times.append(t1 - t0)
            d_times.append(t2 - t1)
            sizes.append(len(out))
    return statistics.median(c_times) / 1e3, statistics.median(d_times) / 1e3, statistics.mean(sizes)


def tables_sweep() -> None:
    print("level 3, one context per direction, 1 KB messages; median µs per call, by table size")
    cells = ("hot c", "hot d", "cold c", "cold d")
    print(f"{'messages':8} {'hash':>4} {'chain':>5} " + " ".join(f"{c:>7}" for c in cells) + f" {'bytes':>6}")
    for kind in ("agent", "novel"):
        messages = [m.encode() for m in rtt_messages(kind, 600)]
        for tables in ((15, 14), (13, 12), (12, 11)):
            hot_c, hot_d, size = per_call(messages, 3, cold=False, tables=tables)
            cold_c, cold_d, _ = per_call(messages, 3, cold=True, tables=tables)
            times = " ".join(f"{t:7.1f}" for t in (hot_c, hot_d, cold_c, cold_d))
            print(f"{kind:8} {tables[0]:4} {tables[1]:5} {times} {size:6.0f}")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--tables", action="store_true", help="level 3 with smaller match-finder tables")
    if parser.parse_args().tables:
        tables_sweep()
        return
    print("one zstd context per direction, 1 KB messages; median µs per call (compress / decompress)")
    print(f"{'messages':8} {'level':>5} {'hot c':>7} {'hot d':>7} {'cold c':>7} {'cold d':>7} {'bytes':>6}")
    for kind in ("agent", "novel"):
        messages = [m.encode() for m in rtt_messages(kind, 600)]
        for level in (3, 1, -1, -5):
            hot_c, hot_d, size = per_call(messages, level, cold=False)
            cold_c, cold_d, _ = per_call(messages, level, cold=True)
            print(f"{kind:8} {level:5} {hot_c:7.1f} {hot_d:7.1f} {cold_c:7.1f} {cold_d:7.1f} {size:6.0f}")
    print(
        "\na round trip makes two of each call: 2 x (compress + decompress) is what zstd adds to it "
        "before the session's own work (bench_context.py section 5 measures the whole)"
    )


if __name__ == "__main__":
    main()
