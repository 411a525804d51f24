"""AVP codec speed and memory: m2mwire vs the reference SDK (`avp` 0.6.2), same frames, same process.

Run: .venv/bin/python benchmarks/bench_avp.py   (about a minute on a 2-core host; prints a table)
     .venv/bin/python benchmarks/bench_avp.py --paths   (each fast path vs its general path, seconds)

Cases (medians of interleaved trials, so both sides see the same machine state):
* hidden state: 4096 float32 (16 KiB) with realistic metadata, encode + decode + tensor view (+ metadata);
* KV cache: 32 layers x 8 kv heads x 128 head_dim x 512 tokens, float16 (64 MiB), encode + decode +
  per-layer views, without and with zstd (level 1).

The SDK gets the payload as ready-made ``bytes`` (its encode does not take numpy arrays); we get the
arrays. Goals: >= 3x the SDK's KV throughput, >= 1.5x its hidden-state messages/s, and a KV round trip
that peaks at <= 2x the payload size (tracemalloc, numpy allocations included, in a subprocess).
"""

from __future__ import annotations

import gc
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import avp as sdk  # noqa: E402
import deflate  # noqa: E402
import numpy as np  # noqa: E402

from m2mwire import avp  # noqa: E402

LAYERS, HEADS, HEAD_DIM, TOKENS = 32, 8, 128, 512
HIDDEN_TRIALS, HIDDEN_NUMBER = 31, 500
KV_BYTES = 2 * LAYERS * HEADS * HEAD_DIM * TOKENS * 2 + 17
META = {
    "session_id": "4f9c2a7e1b3d4e5f8a9b0c1d2e3f4a5b",
    "source_agent_id": "planner",
    "target_agent_id": "solver",
    "model_id": "meta-llama/Llama-2-7b",
    "hidden_dim": 4096,
    "num_layers": 32,
}


def interleaved(contenders: dict[str, Callable[[], object]], trials: int, number: int) -> dict[str, float]:
    """Median seconds per call of each contender, trials interleaved round-robin."""
    times: dict[str, list[float]] = {name: [] for name in contenders}
    for fn in contenders.values():  # warm up
        fn()
    for _ in range(trials):
        for name, fn in contenders.items():
            gc.collect()
            gc.disable()
            start = time.perf_counter()
            for _ in range(number):
                fn()
            times[name].append((time.perf_counter() - start) / number)
            gc.enable()
    return {name: statistics.median(t) for name, t in times.items()}


def bench_hidden() -> dict[str, float]:
    hidden = np.random.default_rng(0).standard_normal(4096).astype(np.float32)
    payload = hidden.tobytes()
    sdk_md = sdk.AVPMetadata(**META, tensor_shape=(4096,))
    ours_md = avp.AVPMetadata(**META, tensor_shape=(4096,))  # type: ignore[arg-type]
    assert avp.encode(hidden, ours_md) == sdk.encode(payload, sdk_md)

    def sdk_rt() -> object:
        msg = sdk.decode(sdk.encode(payload, sdk_md))
        return msg.embedding, msg.metadata

    def ours_rt() -> object:
        return avp.decode(avp.encode(hidden, ours_md)).tensor()

    def ours_rt_md() -> object:
        msg = avp.decode(avp.encode(hidden, ours_md))
        return msg.tensor(), msg.metadata

    contenders = {"sdk": sdk_rt, "ours": ours_rt, "ours+metadata": ours_rt_md}
    return interleaved(contenders, trials=HIDDEN_TRIALS, number=HIDDEN_NUMBER)


def bench_paths() -> list[tuple[str, float, float]]:
    """Each AVP fast path against the general path it shortcuts, same frames (``--paths``): kept only
    where it measurably helps. Returns (case, general us, fast us)."""
    from m2mwire.codecs import avp as codec
    from m2mwire.codecs.limits import DEFAULT_LIMITS

    out = []
    for n in (256, 4096):
        hidden = np.random.default_rng(0).standard_normal(n).astype(np.float32)
        md = avp.AVPMetadata(**META, tensor_shape=(n,))  # type: ignore[arg-type]
        frame = avp.encode(hidden, md)
        assert b"".join(codec._general_parts(hidden, md, False, {})) == frame
        for _ in range(3):  # learn the template: later decodes take the known-prefix path
            avp.decode(frame)
        # Default arguments bind this iteration's values (the lambdas run inside the loop anyway).
        t = interleaved(
            {
                "enc general": lambda h=hidden, m=md: codec._general_parts(h, m, False, {}),
                "enc fast": lambda h=hidden, m=md: codec._fast_parts(h, m),
                "dec general": lambda f=frame: avp.decode(f, limits=DEFAULT_LIMITS),
                "dec fast": lambda f=frame: avp.decode(f),
            },
            trials=15,
            number=2000,
        )
        out.append((f"encode_parts, {n} fp32", t["enc general"] * 1e6, t["enc fast"] * 1e6))
        out.append((f"decode, {n} fp32", t["dec general"] * 1e6, t["dec fast"] * 1e6))
    return out


def kv_layers() -> list[tuple[np.ndarray[Any, Any], np.ndarray[Any, Any]]]:
    rng = np.random.default_rng(0)
    shape = (HEADS, TOKENS, HEAD_DIM)
    return [
        (
            rng.standard_normal(shape, dtype=np.float32).astype(np.float16),
            rng.standard_normal(shape, dtype=np.float32).astype(np.float16),
        )
        for _ in range(LAYERS)
    ]


def bench_kv(level: int) -> dict[str, float]:
    layers = kv_layers()
    payload = avp.build_kv_payload(layers)
    assert len(payload) == KV_BYTES
    sdk_md = sdk.AVPMetadata(**META, payload_type=sdk.PayloadType.KV_CACHE, dtype=sdk.DataType.FLOAT16)
    sdk_level = sdk.CompressionLevel.FAST if level else sdk.CompressionLevel.NONE
    frame = avp.encode_kv_cache(layers, compress=level, **META)  # type: ignore[arg-type]
    assert frame == sdk.encode(payload, sdk_md, sdk_level)

    def sdk_rt() -> object:
        return sdk.decode(sdk.encode(payload, sdk_md, sdk_level)).payload

    def ours_bytes_rt() -> object:  # encode() to one bytes object, then decode it
        return avp.decode(avp.encode_kv_cache(layers, compress=level, **META)).kv_cache().layers  # type: ignore[arg-type]

    def ours_parts_rt() -> object:  # encode_parts() as a transport sends it; decode a received frame
        avp.encode_kv_cache_parts(layers, compress=level, **META)  # type: ignore[arg-type]
        return avp.decode(frame).kv_cache().layers

    contenders = {"sdk": sdk_rt, "ours (bytes)": ours_bytes_rt}
    if not level:
        contenders["ours (parts)"] = ours_parts_rt
    return interleaved(contenders, trials=7 if not level else 3, number=1)


MEMORY_PROBE = """
import json, sys, tracemalloc
sys.path.insert(0, sys.argv[1])
import numpy as np
from m2mwire import avp
import avp as sdk
which, level = sys.argv[2], int(sys.argv[3])
rng = np.random.default_rng(0)
shape = (8, 512, 128)
layers = [(rng.standard_normal(shape, dtype=np.float32).astype(np.float16),
           rng.standard_normal(shape, dtype=np.float32).astype(np.float16)) for _ in range(32)]
payload = avp.build_kv_payload(layers) if which == "sdk" else None
md = sdk.AVPMetadata(payload_type=sdk.PayloadType.KV_CACHE, dtype=sdk.DataType.FLOAT16)
tracemalloc.start()
if which == "sdk":
    lvl = sdk.CompressionLevel.FAST if level else sdk.CompressionLevel.NONE
    msg = sdk.decode(sdk.encode(payload, md, lvl))
    kept = len(msg.payload)
else:
    kv = avp.decode(avp.encode_kv_cache(layers, compress=level)).kv_cache()
    kept = kv.nbytes
current, peak = tracemalloc.get_traced_memory()
print(json.dumps({"peak": peak, "kept": kept}))
"""


def memory(which: str, level: int) -> int:
    """Peak bytes allocated during one KV round trip (the input arrays/bytes exist before it)."""
    out = subprocess.run(
        [sys.executable, "-c", MEMORY_PROBE, str(ROOT), which, str(level)],
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    )
    peak: int = json.loads(out.stdout)["peak"]
    return peak


def main() -> int:
    started = time.perf_counter()
    if "--paths" in sys.argv:
        print("AVP fast paths vs the general paths (medians of 15 interleaved trials x 2000 calls):")
        for case, general, fast in bench_paths():
            print(f"  {case:24s} general {general:6.2f} us  fast {fast:6.2f} us  ({general / fast:.2f}x)")
        return 0
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    print(
        f"AVP codec benchmark: m2mwire vs avp {sdk.AVP_VERSION_STRING}, python {sys.version.split()[0]}, "
        f"numpy {np.__version__}, {cpus} CPUs; CRC-32 via deflate {deflate.__version__} (libdeflate)"
    )
    rows: list[tuple[str, str, str, str, str]] = []
    failures = 0

    def row(case: str, sdk_value: float, ours_value: float, unit: str, goal: float | None) -> None:
        nonlocal failures
        ratio = ours_value / sdk_value
        verdict = ""
        if goal is not None:
            ok = ratio >= goal
            failures += not ok
            verdict = f">= {goal:g}x: {'PASS' if ok else 'FAIL'}"
        rows.append((case, f"{sdk_value:,.2f} {unit}", f"{ours_value:,.2f} {unit}", f"{ratio:.2f}x", verdict))

    h = bench_hidden()
    row("hidden 4096 fp32, encode+decode", 1 / h["sdk"], 1 / h["ours"], "msg/s", 1.5)
    row("  same, ours also builds .metadata", 1 / h["sdk"], 1 / h["ours+metadata"], "msg/s", None)
    gb = KV_BYTES / 1e9
    kv = bench_kv(0)
    row("KV 64 MiB fp16, encode_parts+decode", gb / kv["sdk"], gb / kv["ours (parts)"], "GB/s", 3.0)
    row("  encode() to bytes + decode", gb / kv["sdk"], gb / kv["ours (bytes)"], "GB/s", None)
    kvz = bench_kv(1)
    row("KV 64 MiB fp16, zstd-1, encode+decode", gb / kvz["sdk"], gb / kvz["ours (bytes)"], "GB/s", None)

    widths = [max(len(r[i]) for r in [("case", "SDK", "m2mwire", "ratio", "goal"), *rows]) for i in range(5)]
    header = ("case", "SDK", "m2mwire", "ratio", "goal")
    for r in [header, tuple("-" * w for w in widths), *rows]:
        print(
            "  ".join(
                cell.rjust(w) if i in (1, 2, 3) else cell.ljust(w)
                for i, (cell, w) in enumerate(zip(r, widths, strict=True))
            )
        )
    print()
    print(
        f"Medians of interleaved trials: hidden state {HIDDEN_TRIALS} x {HIDDEN_NUMBER} round trips; "
        "KV 7 (zstd: 3)."
    )
    print(
        f"  hidden round trip: SDK {h['sdk'] * 1e6:.1f} us, ours {h['ours'] * 1e6:.1f} us "
        f"(+metadata {h['ours+metadata'] * 1e6:.1f} us)"
    )
    print(
        f"  KV round trip: SDK {kv['sdk'] * 1e3:.0f} ms; ours: parts {kv['ours (parts)'] * 1e3:.0f} ms, "
        f"bytes {kv['ours (bytes)'] * 1e3:.0f} ms"
    )
    print(f"  KV zstd-1 round trip: SDK {kvz['sdk'] * 1e3:.0f} ms, ours {kvz['ours (bytes)'] * 1e3:.0f} ms")
    print()
    payload_mib = KV_BYTES / 2**20
    print("Peak memory of one 64 MiB KV round trip (tracemalloc, allocations during the round trip;")
    print("the 64 MiB input already exists, so total = input + peak):")
    for which, level in (("ours", 0), ("sdk", 0), ("ours", 1), ("sdk", 1)):
        peak = memory(which, level)
        total = (payload_mib * 2**20 + peak) / (payload_mib * 2**20)
        goal = ""
        if which == "ours" and level == 0:
            ok = total <= 2.0 + 1e-3
            failures += not ok
            goal = f"  goal <= 2.0x: {'PASS' if ok else 'FAIL'}"
        name = f"{which}{' zstd-1' if level else ''}"
        print(f"  {name:12s} peak {peak / 2**20:7.1f} MiB during, {total:.2f}x payload in total{goal}")
    print(f"\ndone in {time.perf_counter() - started:.0f} s; {failures} goal(s) missed")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
