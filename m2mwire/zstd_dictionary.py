"""Train a shared zstd dictionary for session-context compression from your own messages.

    python -m m2mwire.zstd_dictionary train agents.dict samples/*.jsonl [--size 65536]
    python -m m2mwire.zstd_dictionary id agents.dict

A ``.jsonl`` file gives one sample per line (a JSON string is taken as its text, any other JSON
value in compact form, as a session sends it); any other file is one sample. ``train`` writes the
dictionary and prints its id (the SHA-256 both peers offer in HELLO). Use it on both sides::

    m2mwire.connect(url, zstd={"dictionaries": [Path("agents.dict").read_bytes()]})

zstd wants roughly a hundred times the dictionary size in samples; a dictionary helps the first
messages of every session (later ones have the session's own history).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from m2mwire.codecs.jsonutil import dumps_compact
from m2mwire.codecs.zstdcontext import ZstdDictionary, train_dictionary
from m2mwire.errors import M2MError

__all__ = ["load_samples", "main"]


def load_samples(paths: list[Path]) -> list[bytes]:
    """The samples in ``paths``: a line each from ``.jsonl`` files, the whole file otherwise."""
    samples: list[bytes] = []
    for path in paths:
        if path.suffix != ".jsonl":
            samples.append(path.read_bytes())
            continue
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            if not line.strip():
                continue
            try:
                value = json.loads(line)
            except ValueError as exc:
                raise SystemExit(f"{path}:{number}: not JSON ({exc}); use one JSON value per line") from None
            samples.append((value if isinstance(value, str) else dumps_compact(value)).encode("utf-8"))
    return samples


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m m2mwire.zstd_dictionary", description=__doc__.split("\n")[0]
    )
    sub = parser.add_subparsers(dest="command", required=True)
    train = sub.add_parser("train", help="train a dictionary from sample messages")
    train.add_argument("output", type=Path)
    train.add_argument("samples", type=Path, nargs="+")
    train.add_argument("--size", type=int, default=64 * 1024, help="dictionary size in bytes (default 65536)")
    ident = sub.add_parser("id", help="print a dictionary's id (SHA-256 of its bytes)")
    ident.add_argument("dictionary", type=Path)
    args = parser.parse_args(argv)
    try:
        if args.command == "id":
            print(ZstdDictionary(args.dictionary.read_bytes()).id)
            return 0
        samples = load_samples(args.samples)
        dictionary = train_dictionary(samples, args.size)
    except (OSError, M2MError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    args.output.write_bytes(dictionary.data)
    print(f"{dictionary.id}  {args.output} ({len(dictionary.data)} bytes from {len(samples)} samples)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
