"""``m2mwire serve URL --workers N`` and ``m2mwire gateway`` as real processes (nats-server on loopback)."""

from __future__ import annotations

import asyncio
import os
import socket
import sys
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest

import m2mwire
from m2mwire.api import Session
from m2mwire.errors import M2MError, TransportError
from m2mwire.transport.nats.local import LocalNatsServer

ROOT = Path(__file__).resolve().parents[1]


def free_port(kind: int = socket.SOCK_STREAM) -> int:
    with socket.socket(socket.AF_INET, kind) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@asynccontextmanager
async def cli(*args: str) -> AsyncIterator[asyncio.subprocess.Process]:
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "m2mwire",
        *args,
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.DEVNULL,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    try:
        yield proc
    finally:
        if proc.returncode is None:
            proc.terminate()
        await asyncio.wait_for(proc.wait(), 20)


async def connect_when_up(url: str, **options: Any) -> Session:
    """The workers take a moment to start: retry for up to 20 s."""
    for _ in range(100):
        try:
            return await asyncio.wait_for(m2mwire.connect(url, **options), 5)
        except (M2MError, OSError, TimeoutError):
            await asyncio.sleep(0.2)
    raise AssertionError(f"nothing served {url} within 20 s")


async def kept_fingerprint(host: str, cert_dir: Path | None = None) -> str:
    """The fingerprint of the certificate kept in ``cert_dir``, by default the one for ``host``
    (conftest's M2MWIRE_STATE_DIR), once the process serving it has made it."""
    from m2mwire.transport.certstore import default_cert_dir, persistent_self_signed

    cert = (cert_dir or default_cert_dir(host)) / "cert.pem"
    for _ in range(100):
        if cert.exists():
            return persistent_self_signed(cert.parent)[2]
        await asyncio.sleep(0.2)
    raise AssertionError(f"no certificate was kept in {cert.parent} within 20 s")


async def workers_seen(url: str, sessions: int, **options: Any) -> set[str]:
    seen = set()
    for _ in range(sessions):
        session = await connect_when_up(url, **options)
        seen.add(session.info.peer_agent_id)
        await session.send("hello")
        assert (await asyncio.wait_for(session.recv(), 10)).text
        await session.close()
    return seen


async def test_serve_nats_with_two_workers(nats_server: LocalNatsServer) -> None:
    url = f"{nats_server.url}/test.{uuid.uuid4().hex}"
    async with cli("serve", url, "--workers", "2") as parent:
        await connect_when_up(url)  # the first worker is up
        await asyncio.sleep(1.0)  # and the second (each imports m2mwire and joins the queue group)
        assert len(await workers_seen(url, 20)) == 2
        parent.terminate()
        await asyncio.wait_for(parent.wait(), 20)
    # the parent took its workers with it: nobody serves the subject any more
    with pytest.raises(TransportError, match="no worker serves"):
        await asyncio.wait_for(m2mwire.connect(url), 5)


@pytest.mark.parametrize("scheme", ["ws", "quic"])
async def test_serve_with_two_workers_on_one_port(scheme: str) -> None:
    port = free_port(socket.SOCK_STREAM if scheme == "ws" else socket.SOCK_DGRAM)
    url = f"{scheme}://127.0.0.1:{port}"
    async with cli("serve", url, "--workers", "2"):
        options: dict[str, Any] = {}
        if scheme == "quic":  # both workers present the certificate kept in the state directory
            options["fingerprint"] = await kept_fingerprint("127.0.0.1")
        await connect_when_up(url, **options)
        await asyncio.sleep(1.0)
        assert len(await workers_seen(url, 20, **options)) == 2  # the kernel spread them


def test_workers_need_a_fixed_port(capsys: pytest.CaptureFixture[str]) -> None:
    from m2mwire.cli import EXIT_USAGE, main

    assert main(["serve", "ws://127.0.0.1:0", "--workers", "2"]) == EXIT_USAGE
    assert "needs a fixed port" in capsys.readouterr().err


async def test_gateway_command(nats_server: LocalNatsServer) -> None:
    url = f"{nats_server.url}/test.{uuid.uuid4().hex}"

    async def echo(session: Session) -> None:
        async for message in session:
            await session.send(message.text or "")

    port = free_port()
    async with m2mwire.serve(echo, url, agent_id="worker-behind-gateway"):
        async with cli("gateway", f"ws://127.0.0.1:{port}", url):
            session = await connect_when_up(f"ws://127.0.0.1:{port}")
            assert session.info.peer_agent_id == "worker-behind-gateway"
            await session.send("through")
            assert (await asyncio.wait_for(session.recv(), 10)).text == "through"
            await session.close()


async def test_gateway_command_keeps_its_certificate_in_cert_dir(
    nats_server: LocalNatsServer, tmp_path: Path
) -> None:
    """``m2mwire gateway --cert-dir DIR``: a restarted gateway presents the certificate its
    clients pinned (the console command took only --certfile/--keyfile before)."""
    url = f"{nats_server.url}/test.{uuid.uuid4().hex}"

    async def echo(session: Session) -> None:
        async for message in session:
            await session.send(message.text or "")

    cert_dir = tmp_path / "gw-certs"
    fingerprint = ""
    async with m2mwire.serve(echo, url):
        for _ in range(2):  # the pin taken from the first start works against the restart
            port = free_port(socket.SOCK_DGRAM)
            async with cli("gateway", f"quic://127.0.0.1:{port}", url, "--cert-dir", str(cert_dir)):
                fingerprint = fingerprint or await kept_fingerprint("127.0.0.1", cert_dir)
                session = await connect_when_up(f"quic://127.0.0.1:{port}", fingerprint=fingerprint)
                await session.send("pinned")
                assert (await asyncio.wait_for(session.recv(), 10)).text == "pinned"
                await session.close()
