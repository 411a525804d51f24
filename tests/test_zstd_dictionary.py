"""The dictionary training tool (python -m m2mwire.zstd_dictionary)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from m2mwire.codecs.zstdcontext import ContextCompressor, ZstdDictionary
from m2mwire.workloads import workload
from m2mwire.zstd_dictionary import main


def test_train_then_id(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    events = [content for _, content in workload("json_events")]
    samples = tmp_path / "events.jsonl"
    samples.write_text("\n".join(json.dumps(e) for e in events[1:]) + "\n\n")
    out = tmp_path / "events.dict"
    assert main(["train", str(out), str(samples), "--size", "8192"]) == 0
    dictionary = ZstdDictionary(out.read_bytes())
    assert capsys.readouterr().out.startswith(dictionary.id)
    assert main(["id", str(out)]) == 0
    assert capsys.readouterr().out.strip() == dictionary.id
    first = json.dumps(events[0], separators=(",", ":")).encode()
    primed = ContextCompressor(dictionary=dictionary).compress(first)
    assert len(primed) < 0.5 * len(ContextCompressor().compress(first))


def test_bad_input_is_reported(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"ok": 1}\nnot json\n')
    with pytest.raises(SystemExit, match=r"bad\.jsonl:2: not JSON"):
        main(["train", str(tmp_path / "x.dict"), str(bad)])
    assert main(["train", str(tmp_path / "x.dict"), str(tmp_path / "missing.txt")]) == 1
    assert "error:" in capsys.readouterr().err
