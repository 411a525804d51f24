"""What decoding one hostile message costs: wall time and peak RSS growth, each case in a fresh process.

Run: .venv/bin/python benchmarks/decode_bounds.py            (all cases, ~15 s on a 2-core host)
     .venv/bin/python benchmarks/decode_bounds.py json-flat  (one case, in this process)

Cases (issue 11): ``brotli-2mib`` (2 MiB of "a": used to fail to decode), ``avp-bomb`` (a ~32 KB zstd
frame of 1 GiB of zeros, decoded with a 16 MiB session's limit; ``avp-bomb-nolimit`` is the codec's own
1 GiB default, what sessions used before), ``json-flat`` (16 MiB of ``[{},{},...]``, over the array
limit), ``json-valid`` (5.5 M empty objects in arrays of 10,000: within every limit), ``t1-expand``
(a 14.4 MB T1 wire expanding past 16 MiB). Peak RSS is reset (``/proc/self/clear_refs``) just before
the decode, after the input was built; Linux only. Every version of m2mwire runs these cases (only
public functions are used), so the same script gives the before and after figures.
"""

from __future__ import annotations

import struct
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any

CASES = ("brotli-2mib", "avp-bomb", "avp-bomb-nolimit", "json-flat", "json-valid", "t1-expand")
MiB = 1 << 20


def _status(key: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(key):
                return int(line.split()[1]) * 1024
    raise RuntimeError(f"{key} not in /proc/self/status")


def _avp_bomb() -> bytes:
    import zstandard

    from m2mwire.codecs import avp

    cobj = zstandard.ZstdCompressor(level=3).compressobj(size=1 << 30)
    zero = bytes(MiB)
    bomb = b"".join([cobj.compress(zero) for _ in range(1024)] + [cobj.flush()])
    frame = avp.encode(bytes(4096), compress=True)  # real metadata; the payload is swapped
    header = avp.parse_header(frame)
    meta = frame[12 : 12 + header.metadata_length]
    return struct.pack("<2sBBII", b"AV", 1, header.flags, len(meta) + len(bomb), len(meta)) + meta + bomb


def _case(name: str) -> Callable[[], Any]:
    if name == "brotli-2mib":
        from m2mwire.codecs import compress, decompress

        wire = compress("a" * (2 * MiB), "brotli")
        return lambda: decompress(wire)
    if name.startswith("avp-bomb"):
        from m2mwire.codecs import avp

        frame = _avp_bomb()
        if name == "avp-bomb-nolimit":
            return lambda: avp.decode(frame)
        return lambda: avp.decode(frame, max_output_bytes=16 * MiB)
    from m2mwire.codecs.jsonutil import loads_limited

    if name == "json-flat":
        text = "[" + "{}," * (16 * MiB // 3 - 1) + "{}]"
        return lambda: loads_limited(text)
    if name == "json-valid":
        text = "[" + ",".join(["[" + ",".join(["{}"] * 10_000) + "]"] * 550) + "]"
        return lambda: loads_limited(text)
    if name == "t1-expand":
        from m2mwire.codecs.t1 import decode_t1

        row = "[" + ",".join(['{"M":"g4o"}'] * 10_000) + "]"
        wire = "#T1|[" + ",".join([row] * 120) + "]"
        return lambda: decode_t1(wire)
    raise SystemExit(f"unknown case {name!r}; cases: {', '.join(CASES)}")


def measure(name: str) -> str:
    import numpy  # noqa: F401  (loaded in every session already; not part of the cost)

    run = _case(name)
    base = _status("VmRSS:")
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # reset the peak (VmHWM) to the current RSS
    started = time.perf_counter()
    try:
        run()
        verdict = "decoded"
    except Exception as exc:
        verdict = f"{type(exc).__name__}: {str(exc)[:90]}"
    elapsed = time.perf_counter() - started
    peak = _status("VmHWM:") - base
    return f"{name:17s} {elapsed:5.2f} s  peak RSS +{peak / 1e6:5.0f} MB  {verdict}"


def main() -> None:
    if len(sys.argv) > 1:
        print(measure(sys.argv[1]))
        return
    for name in CASES:
        out = subprocess.run([sys.executable, __file__, name], capture_output=True, text=True, check=False)
        print(out.stdout.strip() or out.stderr.strip().splitlines()[-1])


if __name__ == "__main__":
    main()
