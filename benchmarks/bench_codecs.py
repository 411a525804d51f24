"""Codec benchmark: compression on the sample corpus, TokenNative speed, Brotli quality sweep.

Run: ``.venv/bin/python benchmarks/bench_codecs.py`` (about a minute on a 2-core VM). Prints tables only.

* Savings per algorithm over ``m2mwire.samples`` (bytes and cl100k tokens of the *wire string*), next to
  the seed's claims, plus the figures behind automatic selection.
* TokenNative encode/decode throughput against raw tiktoken in the same process: interleaved trials,
  median of 7, CPU time (``time.process_time``).
* Brotli quality sweep (q1..q6 and q11) on the corpus, which is how the default quality was chosen.
* Varint packing: protobuf (upb) against a vectorised numpy packer, which is how the packer was chosen.
"""

from __future__ import annotations

import base64
import importlib.util
import platform
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import brotli
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from m2mwire.codecs import (
    Algorithm,
    Encoding,
    compress,
    compress_binary,
    count_tokens,
    decompress,
    decompress_binary,
    get_tokenizer,
    select_algorithm,
)
from m2mwire.codecs.compressed import DEFAULT_BROTLI_QUALITY
from m2mwire.codecs.tokennative import decode_tokennative, encode_tokennative
from m2mwire.codecs.varint import pack_varints, unpack_varints
from m2mwire.errors import EncodeError
from m2mwire.samples import sample_payloads

TRIALS = 7
CLAIMS = {
    "tokennative": "50-60%",
    "token": "25-40%",
    "brotli": "60-80%",
    "dictionary": "20-30%",
    "none": "0%",
}


def utf8_len(text: str) -> int:
    return len(text.encode("utf-8"))


def pct(saved: float, total: float) -> str:
    return f"{100 * (1 - saved / total):+.1f}%" if total else "n/a"


def cpu_median(cases: dict[str, Callable[[], object]], target_s: float = 0.05) -> dict[str, float]:
    """Median CPU seconds per call of each case; trials are interleaved round-robin across the cases."""
    loops = {}
    for name, fn in cases.items():
        fn()  # warm up
        start = time.process_time()
        n = 0
        while time.process_time() - start < target_s / 4:
            fn()
            n += 1
        loops[name] = max(1, int(n * 4))
    samples: dict[str, list[float]] = {name: [] for name in cases}
    for _ in range(TRIALS):
        for name, fn in cases.items():
            n = loops[name]
            start = time.process_time()
            for _ in range(n):
                fn()
            samples[name].append((time.process_time() - start) / n)
    return {name: statistics.median(values) for name, values in samples.items()}


def table(headers: list[str], rows: list[list[str]]) -> None:
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(headers)]
    line = "  ".join(
        h.rjust(w) if i else h.ljust(w) for i, (h, w) in enumerate(zip(headers, widths, strict=True))
    )
    print(line)
    print("-" * len(line))
    for row in rows:
        print(
            "  ".join(
                c.rjust(w) if i else c.ljust(w) for i, (c, w) in enumerate(zip(row, widths, strict=True))
            )
        )
    print()


# --- 1. savings on the corpus ----------------------------------------------------------------------


def savings(corpus: list[tuple[str, str]], t1: bool) -> None:
    originals = [(utf8_len(c), count_tokens(c)) for _, c in corpus]
    orig_bytes = sum(b for b, _ in originals)
    orig_tokens = sum(t for _, t in originals)
    print(
        f"== 1. Savings on the sample corpus: {len(corpus)} payloads, {orig_bytes:,} bytes, "
        f"{orig_tokens:,} cl100k tokens"
    )
    print(
        "   wire bytes / wire tokens are of the wire *string* (tokens counted with cl100k); "
        "savings = 1 - wire/original"
    )
    print()
    variants: list[tuple[str, str, Callable[[str], str]]] = [
        ("tokennative C", "tokennative", lambda c: compress(c, "tokennative", encoding="C")),
        ("tokennative O", "tokennative", lambda c: compress(c, "tokennative", encoding="O")),
        ("tokennative L", "tokennative", lambda c: compress(c, "tokennative", encoding="L")),
        ("brotli q5", "brotli", lambda c: compress(c, "brotli")),
        ("dictionary", "dictionary", lambda c: compress(c, "dictionary")),
        ("none", "none", lambda c: compress(c, "none")),
        ("auto (bytes)", "", lambda c: compress(c)),
        ("auto (tokens)", "", lambda c: compress(c, optimize="tokens")),
    ]
    if t1:
        variants.insert(3, ("token (T1)", "token", lambda c: compress(c, "token")))
    rows = []
    for label, alg, fn in variants:
        n = ob = ot = wb = wt = 0
        for (_, content), (b, t) in zip(corpus, originals, strict=True):
            try:
                wire = fn(content)
            except EncodeError:  # T1 on non-JSON, NONE on prefix-like content
                continue
            n += 1
            ob += b
            ot += t
            wb += utf8_len(wire)
            wt += count_tokens(wire)
        rows.append(
            [
                label,
                str(n),
                f"{ob:,}",
                f"{ot:,}",
                f"{wb:,}",
                f"{wt:,}",
                pct(wb, ob),
                pct(wt, ot),
                CLAIMS.get(alg, ""),
            ]
        )
    table(
        [
            "algorithm",
            "n",
            "orig B",
            "orig tok",
            "wire B",
            "wire tok",
            "bytes saved",
            "tokens saved",
            "seed claim",
        ],
        rows,
    )


def crossover(corpus: list[tuple[str, str]], t1: bool) -> None:
    print("== 2. Wire size as % of the original, by content size (the basis of automatic selection)")
    print("   ascii = payloads with < 25% multi-byte UTF-8 share; 'picked' = what select_algorithm chooses")
    print()
    buckets = [
        ("< 100 B", 0, 100),
        ("100 B - 1 KB", 100, 1024),
        ("1 - 4 KB", 1024, 4096),
        (">= 4 KB", 4096, 1 << 40),
    ]
    algs = ["tokennative", "brotli", "dictionary"] + (["token"] if t1 else [])
    rows = []
    for label, lo, hi in buckets:
        for kind in ("ascii", "non-ascii"):
            members = []
            for _, c in corpus:
                size = utf8_len(c)
                heavy = (size - len(c)) >= 0.25 * size
                if lo <= size < hi and heavy == (kind == "non-ascii"):
                    members.append(c)
            if not members:
                continue
            total = sum(utf8_len(c) for c in members)
            cells = []
            for alg in algs:
                got = [(utf8_len(c), utf8_len(compress(c, alg))) for c in members if _ok(c, alg)]
                cells.append(f"{100 * sum(w for _, w in got) / sum(b for b, _ in got):.0f}%" if got else "-")
            picked = sorted({select_algorithm(c).value for c in members})
            rows.append([f"{label} {kind}", str(len(members)), f"{total:,}", *cells, ",".join(picked)])
    table(["size", "n", "bytes", *algs, "picked (bytes)"], rows)


def _ok(content: str, alg: str) -> bool:
    try:
        compress(content, alg)
    except EncodeError:
        return False
    return True


def selection_quality(corpus: list[tuple[str, str]]) -> None:
    print("== 3. Automatic selection against an oracle that tries every algorithm per payload")
    print()
    rows = []
    for optimize in ("bytes", "tokens"):
        selected = oracle = original = 0
        for _, content in corpus:
            measure = utf8_len if optimize == "bytes" else count_tokens
            wires = {}
            for alg in Algorithm:
                if alg is Algorithm.ZLIB or (optimize == "bytes" and alg is Algorithm.TOKEN):
                    continue  # bytes mode only uses byte-exact codecs
                try:
                    wires[alg] = measure(compress(content, alg))
                except EncodeError:
                    continue
            selected += measure(compress(content, optimize=optimize))  # type: ignore[arg-type]
            oracle += min(wires.values())
            original += measure(content)
        rows.append(
            [
                optimize,
                f"{original:,}",
                f"{selected:,}",
                f"{oracle:,}",
                pct(selected, original),
                f"{100 * (selected / oracle - 1):.1f}%",
            ]
        )
    table(["optimize", "original", "selected", "oracle", "saved", "over oracle"], rows)
    contents = [c for _, c in corpus]
    for optimize in ("bytes", "tokens"):
        start = time.process_time()
        for _ in range(20):
            for c in contents:
                select_algorithm(c, optimize=optimize)  # type: ignore[arg-type]
        per = (time.process_time() - start) / (20 * len(contents))
        print(
            f"   select_algorithm(optimize={optimize!r}): {per * 1e6:.1f} us per payload "
            "(mean over the corpus)"
        )
    print()


# --- 4. TokenNative speed ----------------------------------------------------------------------------


def tokennative_speed(corpus: list[tuple[str, str]]) -> None:
    print("== 4. TokenNative speed against raw tiktoken (CPU time, interleaved trials, median of 7)")
    print("   raw encode = enc.encode(text, allowed_special='all'); raw decode = enc.decode(ids)")
    print("   goals: codec encode costs <= 1.25x raw encode; codec decode runs at >= 50% of raw decode speed")
    print()
    small = [c for _, c in corpus if 700 <= utf8_len(c) <= 1400]
    doc = "\n\n".join(c for _, c in corpus)
    doc = doc.encode()[:102_400].decode("utf-8", "ignore")
    sets = [(f"{len(small)} x ~1 KB payloads", small), ("100 KB document", [doc])]
    rows = []
    for encoding in (Encoding.CL100K, Encoding.O200K):
        enc = get_tokenizer(encoding)
        for label, texts in sets:
            nbytes = sum(utf8_len(t) for t in texts)
            ids = [enc.encode(t, allowed_special="all") for t in texts]
            ntok = sum(len(i) for i in ids)
            wires = [encode_tokennative(t, encoding) for t in texts]
            frames = [compress_binary(t, encoding=encoding) for t in texts]
            assert [decode_tokennative(w) for w in wires] == texts
            times = cpu_median(
                {
                    "raw_enc": lambda texts=texts, enc=enc: [
                        enc.encode(t, allowed_special="all") for t in texts
                    ],
                    "tk_enc": lambda texts=texts, e=encoding: [encode_tokennative(t, e) for t in texts],
                    "raw_dec": lambda ids=ids, enc=enc: [enc.decode(i) for i in ids],
                    "tk_dec": lambda wires=wires: [decode_tokennative(w) for w in wires],
                    "bin_dec": lambda frames=frames: [decompress_binary(f) for f in frames],
                }
            )
            for op, raw, codec in (
                ("encode", "raw_enc", "tk_enc"),
                ("decode", "raw_dec", "tk_dec"),
                ("decode binary", "raw_dec", "bin_dec"),
            ):
                ratio = times[codec] / times[raw] if op == "encode" else times[raw] / times[codec]
                goal = "ok" if (ratio <= 1.25 if op == "encode" else ratio >= 0.5) else "MISSED"
                rows.append(
                    [
                        f"{encoding.value} {label}",
                        op,
                        f"{nbytes / times[raw] / 1e6:.1f}",
                        f"{nbytes / times[codec] / 1e6:.1f}",
                        f"{ntok / times[codec] / 1e6:.2f}",
                        f"{ratio:.2f}x" if op == "encode" else f"{100 * ratio:.0f}%",
                        goal,
                    ]
                )
    table(["input", "op", "raw MB/s", "codec MB/s", "codec Mtok/s", "codec vs raw", "goal"], rows)


def varint_speed(corpus: list[tuple[str, str]]) -> None:
    print("== 5. Varint packing of token ids (CPU time, median of 7): protobuf upb vs vectorised numpy")
    print()
    enc = get_tokenizer(Encoding.CL100K)
    small_ids = enc.encode(next(c for _, c in corpus if 900 <= utf8_len(c) <= 1100), allowed_special="all")
    big_ids = enc.encode("\n".join(c for _, c in corpus)[:100_000], allowed_special="all")
    rows = []
    for label, ids in (("1 KB payload", small_ids), ("100 KB document", big_ids)):
        packed = pack_varints(ids)
        times = cpu_median(
            {
                "pb_pack": lambda ids=ids: pack_varints(ids),
                "np_pack": lambda ids=ids: _numpy_pack(ids),
                "pb_unpack": lambda packed=packed: unpack_varints(packed),
                "np_unpack": lambda packed=packed: _numpy_unpack(packed),
            }
        )
        assert _numpy_pack(ids) == packed and _numpy_unpack(packed) == ids
        for op in ("pack", "unpack"):
            rows.append(
                [
                    f"{label} ({len(ids)} ids)",
                    op,
                    f"{times['pb_' + op] * 1e6:.1f}",
                    f"{times['np_' + op] * 1e6:.1f}",
                ]
            )
    table(["input", "op", "protobuf us", "numpy us"], rows)


def _numpy_pack(ids: list[int]) -> bytes:
    values = np.asarray(ids, dtype=np.uint64)
    lengths = np.ones(values.shape, dtype=np.int64)
    for shift in (7, 14, 21, 28):
        lengths += values >= (1 << shift)
    ends = np.cumsum(lengths)
    starts = ends - lengths
    out = np.empty(int(ends[-1]) if ends.size else 0, dtype=np.uint8)
    for k in range(5):
        sel = lengths > k
        if not sel.any():
            break
        group = (values[sel] >> np.uint64(7 * k)) & np.uint64(0x7F)
        more = (lengths[sel] > k + 1).astype(np.uint64) << np.uint64(7)
        out[starts[sel] + k] = (group | more).astype(np.uint8)
    return out.tobytes()


def _numpy_unpack(data: bytes) -> list[int]:
    from m2mwire.codecs.varint import unpack_varints_numpy

    return unpack_varints_numpy(data)


# --- 6. Brotli quality sweep ----------------------------------------------------------------------------


def brotli_sweep(corpus: list[tuple[str, str]]) -> None:
    print(
        "== 6. Brotli quality sweep on the corpus (lgwin 22; CPU time, median of 3; wire = prefix + base64)"
    )
    print()
    payloads = [c.encode() for _, c in corpus]
    total = sum(map(len, payloads))
    rows = []
    for quality in (1, 2, 3, 4, 5, 6, 11):
        compressed = [brotli.compress(p, quality=quality, lgwin=22) for p in payloads]
        size = sum(map(len, compressed))
        wire = sum(len("#M2M[v3.0]|DATA:") + len(base64.b64encode(c)) for c in compressed)
        comp_t, dec_t = [], []
        for _ in range(3):
            start = time.process_time()
            for p in payloads:
                brotli.compress(p, quality=quality, lgwin=22)
            comp_t.append(time.process_time() - start)
            start = time.process_time()
            for c in compressed:
                brotli.decompress(c)
            dec_t.append(time.process_time() - start)
        comp, dec = statistics.median(comp_t), statistics.median(dec_t)
        mark = "  <- default" if quality == DEFAULT_BROTLI_QUALITY else ""
        rows.append(
            [
                f"q{quality}{mark}",
                f"{size:,}",
                f"{total / size:.2f}",
                f"{wire:,}",
                f"{total / comp / 1e6:.1f}",
                f"{total / dec / 1e6:.0f}",
                f"{comp / len(payloads) * 1e6:.0f}",
            ]
        )
    table(
        ["quality", "compressed B", "ratio", "wire B", "compress MB/s", "decompress MB/s", "us/payload"], rows
    )


def main() -> None:
    started = time.perf_counter()
    corpus = sample_payloads()
    t1 = importlib.util.find_spec("m2mwire.codecs.t1") is not None
    print(
        f"m2mwire codec benchmark - Python {platform.python_version()}, {platform.machine()}, "
        f"T1 included: {t1}"
    )
    print()
    for _, c in corpus:  # sanity: every byte-exact codec round-trips every payload
        for alg in ("tokennative", "brotli", "dictionary"):
            assert decompress(compress(c, alg)) == c
    savings(corpus, t1)
    crossover(corpus, t1)
    selection_quality(corpus)
    tokennative_speed(corpus)
    varint_speed(corpus)
    brotli_sweep(corpus)
    print(f"total wall time {time.perf_counter() - started:.1f} s")


if __name__ == "__main__":
    main()
