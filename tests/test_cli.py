"""The console command, run as a user would (the demo is the README's main job)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from m2mwire.schemas.messages import json_schema

ROOT = Path(__file__).resolve().parents[1]


def m2mwire(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "m2mwire", *args],
        input=stdin,
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
    )


def test_demo_runs_both_transports_and_reports_every_message() -> None:
    done = m2mwire("demo")
    assert done.returncode == 0, done.stderr
    out = done.stdout
    assert "== Codecs" in out
    assert "Live session over WS" in out and "Live session over QUIC" in out
    assert out.count("mode LATENT (hash_match)") == 2
    assert out.count("hidden state (AVP, float32)") == 2
    assert "chat request (token/T1)" in out and "text as TokenNative binary" in out


def test_compress_then_decompress_round_trip() -> None:
    content = '{"model":"gpt-4o","messages":[{"role":"user","content":"Hello, wörld"}]}'
    for algorithm in ("tokennative", "token", "brotli", "dictionary", "none"):
        wire = m2mwire("compress", "-", "--algorithm", algorithm, stdin=content)
        assert wire.returncode == 0, wire.stderr
        back = m2mwire("decompress", "-", stdin=wire.stdout)
        assert back.returncode == 0, back.stderr
        value = json.loads(back.stdout)
        if algorithm == "token":  # T1 restores the omitted request defaults (temperature, top_p, ...)
            assert value.pop("temperature") == 1.0 and value.pop("top_p") == 1.0
            value = {k: v for k, v in value.items() if k in ("model", "messages")}
        assert value == json.loads(content)


def test_bad_wire_is_a_clean_error() -> None:
    done = m2mwire("decompress", "#TK|C|not base64!")
    assert done.returncode == 1
    assert "DecodeError" in done.stderr and "Traceback" not in done.stderr


def test_schema_command_matches_exported_file() -> None:
    done = m2mwire("schema", "--stdout")
    assert done.returncode == 0
    assert json.loads(done.stdout) == json_schema()
