"""``import m2mwire`` and a text-only session load none of the heavy optional libraries.

Each check runs in a fresh interpreter (this one has imported everything already): it imports
m2mwire, then serves WebSocket on 127.0.0.1 port 0 and connects to it in the same process, sends
one text message and reads the echo, and reports which of the libraries below are in
``sys.modules`` at each step. The server side shares the process, so the sets hold for it too: a
text session's server needs none of them either.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

# Libraries a text session must not pay for: numpy and protobuf (AVP latent frames), tiktoken
# (token codecs: ~0.2 s to build a tokenizer), zstandard (zstd messages), aioquic (QUIC), nats.
HEAVY = ("numpy", "google.protobuf", "tiktoken", "zstandard", "aioquic", "nats")

SCRIPT = """
import asyncio, json, sys
HEAVY = {heavy!r}
ALGORITHMS = {algorithms!r}

def loaded():
    return sorted(name for name in HEAVY if name in sys.modules)

import m2mwire
report = {{"import": loaded()}}

async def main():
    async def echo(session):
        async for message in session:
            await session.send(message.text or "")

    options = {{"algorithms": ALGORITHMS}} if ALGORITHMS else {{}}
    async with m2mwire.serve(echo, "ws://127.0.0.1:0", **options) as server:
        report["serve"] = loaded()
        async with m2mwire.connect(server.url, **options) as session:
            report["algorithms"] = [a.value for a in session.info.algorithms]
            await session.send("hello, text-only peer")
            reply = await asyncio.wait_for(session.recv(), 10)
            assert reply.text == "hello, text-only peer", reply
    report["round_trip"] = loaded()

asyncio.run(asyncio.wait_for(main(), 30))
print(json.dumps(report))
"""


def run(algorithms: list[str] | None) -> dict[str, list[str]]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT.format(heavy=HEAVY, algorithms=algorithms)],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
        cwd=ROOT,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    report: dict[str, list[str]] = json.loads(done.stdout.splitlines()[-1])
    return report


def test_import_m2mwire_loads_none_of_them() -> None:
    assert run(["none"])["import"] == []


@pytest.mark.parametrize("algorithms", [["none"], ["brotli", "dictionary", "m2m", "none"]])
def test_a_text_session_loads_none_of_them(algorithms: list[str]) -> None:
    """No token codec and no zstd negotiated: a text round trip needs none of the libraries."""
    report = run(algorithms)
    assert report["serve"] == [] and report["round_trip"] == [], report


def test_default_session_loads_only_what_it_negotiated() -> None:
    """By default TokenNative and zstd are negotiated: the tokenizer is built at connect (in a
    thread, so the first large message does not stall the loop) and zstd codes every message, so
    tiktoken and zstandard load; numpy, protobuf, aioquic and nats still do not."""
    report = run(None)
    assert {"tokennative", "zstd"} <= set(report["algorithms"]), report
    assert report["round_trip"] == ["tiktoken", "zstandard"], report


def test_importing_a_module_never_hides_a_lazy_export() -> None:
    """Importing a submodule sets it as an attribute of its package, so a module named like one
    of m2mwire's lazy exports (``m2mwire/gateway.py`` was) replaced ``m2mwire.gateway()`` with
    the module once anything imported it: ``m2mwire.gateway(...)`` then raised "'module' object
    is not callable" in user code, depending on import order."""
    import pkgutil

    import m2mwire

    top_level = {info.name for info in pkgutil.iter_modules(m2mwire.__path__)}
    clash = sorted(top_level & set(m2mwire.__all__))
    assert not clash, f"modules named like lazy exports of m2mwire: {clash}"
    code = (
        "import importlib, m2mwire\n"
        "for name in ('m2mwire.shell.gateway', 'm2mwire.cli', 'm2mwire.demo'):\n"
        "    importlib.import_module(name)\n"
        "assert callable(m2mwire.gateway) and callable(m2mwire.connect), type(m2mwire.gateway)\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)
