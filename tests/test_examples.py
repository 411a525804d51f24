"""The example agents, run as a user would: two processes talking over 127.0.0.1."""

from __future__ import annotations

import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


def _free_port(kind: int) -> int:
    with socket.socket(socket.AF_INET, kind) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _run_pair(scheme: str, server_script: str, client_script: str, *extra: str) -> str:
    """Start ``server_script`` on a free port, run ``client_script`` against it (passing the
    certificate fingerprint the server prints, for quic), and return the client's output."""
    port = _free_port(socket.SOCK_STREAM if scheme == "ws" else socket.SOCK_DGRAM)
    url = f"{scheme}://127.0.0.1:{port}"
    server = subprocess.Popen(
        [sys.executable, str(EXAMPLES / server_script), url, *extra],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        assert server.stdout is not None
        line = ""
        deadline = time.monotonic() + 30
        while "listening on" not in line and time.monotonic() < deadline:
            line = server.stdout.readline()
        assert "listening on" in line, line
        args = [sys.executable, str(EXAMPLES / client_script), url, *extra]
        if "sha256" in line:
            args.append(line.split("sha256 ")[1].rstrip(")\n"))
        done = subprocess.run(args, capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, done.stderr
        return done.stdout
    finally:
        server.terminate()
        server.wait(timeout=10)


@pytest.mark.parametrize("scheme", ["ws", "quic"])
def test_client_and_server_examples(scheme: str) -> None:
    out = _run_pair(scheme, "server.py", "client.py")
    assert "LATENT (hash_match)" in out
    assert "You asked: Which warehouse" in out
    assert "hidden state:" in out and "reply tensor (2048,)" in out


@pytest.mark.parametrize("scheme", ["ws", "quic"])
def test_planner_and_worker_examples(scheme: str) -> None:
    """Requests, a stream, admission by token and a tensor with extra, between two processes."""
    out = _run_pair(scheme, "worker.py", "planner.py", "t0ken")
    assert "without the right token: SECURITY_POLICY" in out
    assert "plan for restock Lyon: step 0 of restock Lyon" in out
    assert "plan for audit Madrid: step 0 of audit Madrid" in out
    assert "streamed: Shipping 40 pallets to Lyon is possible by Friday." in out
    assert "latent answer (2048,), extra {'layer': '8', 'worker': 'tanh'}" in out
