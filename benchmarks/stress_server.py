"""The m2mwire server that ``stress_hostile.py`` attacks, run in its own process as users run one.

    python benchmarks/stress_server.py ws://127.0.0.1:0 [--identity] [--idle-timeout S] [--timers JSON]

It serves with ``m2mwire.serve`` and picks a handler per session from the peer's ``agent_id`` prefix,
so one server can run good sessions (echo) next to an attacker's (which may want a handler that never
reads, raises or ignores its session):

    echo-*   (and anything else)  echo every message back
    sink-*   never read; wait until the session is over
    raise-*  read one message, then raise RuntimeError
    ignore-* ignore the session entirely (sleep), for Server.aclose() timing

Standard output carries one JSON object per line (``event``: ``url``, ``open``, ``end``, ``stats``,
``aclosed``), with ``t`` = ``time.monotonic()``, which is system-wide on Linux, so the driver can
compare it with its own clock. Standard input takes commands, one per line: ``stats``, ``gc`` (run
the cycle collector, then ``stats``), ``count MODULE:CLASS`` (live instances
of that class),
``aclose SECONDS`` (time ``Server.aclose()``, giving up after SECONDS) and ``quit``. The log goes to
standard error at INFO, as ``m2mwire serve`` logs.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import gc
import importlib
import json
import logging
import sys
import threading
import time
from typing import Any

import m2mwire
from m2mwire.api import Server, Session

# The identity an attacker replays to reach latent (AVP) mode: it is in the server's ACCEPT anyway.
IDENTITY: dict[str, Any] = {
    "model_family": "stress",
    "model_id": "stress/model",
    "model_hash": "ab" * 32,
    "hidden_dim": 1024,
    "num_layers": 2,
}


def emit(event: str, **fields: Any) -> None:
    print(json.dumps({"event": event, "t": time.monotonic(), **fields}), flush=True)


def _status_kb() -> dict[str, int]:
    out: dict[str, int] = {}
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(("VmRSS:", "VmHWM:")):
                out[line[:5]] = int(line.split()[1])
    return out


async def _echo(session: Session) -> None:
    async for message in session:
        if message.kind == "json":
            await session.send(message.json())
        elif message.kind == "avp":
            assert message.avp is not None
            await session.send(message.avp)
        else:
            assert message.text is not None  # kind "text" carries text
            await session.send(message.text)


async def _wait_over(session: Session) -> None:
    while session.close_event is None:
        await asyncio.sleep(0.1)


async def _raise(session: Session) -> None:
    await session.recv()
    raise RuntimeError("stress: the handler failed on purpose")


async def _ignore(session: Session) -> None:
    await asyncio.sleep(3600)


HANDLERS = {"sink": _wait_over, "raise": _raise, "ignore": _ignore}


def _peer(session: Session) -> str:
    with contextlib.suppress(Exception):
        return str(session.info.peer_agent_id)
    return "?"


async def handler(session: Session) -> None:
    peer = _peer(session)
    run = HANDLERS.get(peer.split("-", 1)[0], _echo)
    emit("open", peer=peer)
    error = ""
    try:
        await run(session)
    except BaseException as exc:  # reported, then re-raised so the server treats it as it would
        error = f"{type(exc).__name__}: {exc}"[:200]
        raise
    finally:
        closed = session.close_event
        emit("end", peer=peer, error=error, close=repr(closed)[:200] if closed is not None else "")


async def _commands(server: Server) -> None:
    loop = asyncio.get_running_loop()
    lines: asyncio.Queue[str] = asyncio.Queue()

    def reader() -> None:  # a thread: stdin as a pipe works the same everywhere this way
        for line in sys.stdin:
            loop.call_soon_threadsafe(lines.put_nowait, line)
        loop.call_soon_threadsafe(lines.put_nowait, "quit")

    threading.Thread(target=reader, daemon=True).start()
    while True:
        words = (await lines.get()).split()
        if not words:
            continue
        cmd = words[0]
        if cmd == "quit":
            return
        if cmd == "gc":
            gc.collect()
        if cmd in ("stats", "gc"):
            emit("stats", active=server.active_sessions, **_status_kb())
        elif cmd == "count":
            module, _, name = words[1].partition(":")
            try:
                cls = getattr(importlib.import_module(module), name)
                n = sum(1 for o in gc.get_objects() if isinstance(o, cls))
            except (ImportError, AttributeError):
                n = -1
            emit("count", name=words[1], n=n)
        elif cmd == "aclose":
            started = time.monotonic()
            try:
                await asyncio.wait_for(server.aclose(), float(words[1]))
                emit("aclosed", seconds=time.monotonic() - started, timed_out=False)
            except TimeoutError:
                emit("aclosed", seconds=time.monotonic() - started, timed_out=True)
            return


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("url")
    parser.add_argument("--identity", action="store_true", help="offer IDENTITY (latent mode)")
    parser.add_argument("--idle-timeout", type=float, help="QUIC idle_timeout")
    parser.add_argument("--timers", help="JSON dict of Timers fields")
    args = parser.parse_args()
    options: dict[str, Any] = {}
    if args.identity:
        options["identity"] = m2mwire.ModelIdentity(**IDENTITY)
    if args.idle_timeout is not None:
        options["idle_timeout"] = args.idle_timeout
    ignored: list[str] = []
    if args.timers:
        # Only the timers this m2mwire knows: the same script measures older and newer code.
        known = {f.name for f in dataclasses.fields(m2mwire.Timers)}
        wanted = json.loads(args.timers)
        options["timers"] = {k: v for k, v in wanted.items() if k in known}
        ignored = sorted(set(wanted) - known)
    server = await m2mwire.serve(handler, args.url, **options)
    emit("url", url=server.url, fingerprint=server.fingerprint, ignored_timers=ignored)
    try:
        await _commands(server)
    finally:
        # A server that cannot close promptly (the aclose attack) must not keep this process alive.
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(server.aclose(), 2)


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, stream=sys.stderr)
    asyncio.run(main())
