"""What every attack of ``stress_hostile.py`` runs inside: a server process, good sessions in another
process, an RSS sampler, and the figures of one table row.

The server is ``stress_server.py`` (``m2mwire.serve`` in its own process, log on standard error in a
file); the good sessions are ``stress_good.py``. Both inherit this process's environment, so
``PYTHONPATH`` picks the m2mwire under test for all three.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
MB = 1024 * 1024


def read_status(pid: int) -> dict[str, int]:
    """VmRSS / VmHWM of a process in KiB (empty once it is gone)."""
    out: dict[str, int] = {}
    with contextlib.suppress(OSError), open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(("VmRSS:", "VmHWM:")):
                out[line[:5]] = int(line.split()[1])
    return out


def reset_peak(pid: int) -> bool:
    """Reset the kernel's peak-RSS mark (VmHWM) of a process we own (Linux >= 4.0)."""
    try:
        with open(f"/proc/{pid}/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


@dataclass
class Row:
    """One attack's figures; ``None`` where a figure does not apply."""

    name: str
    item: str
    transport: str
    rss_base_mb: float | None = None
    rss_peak_mb: float | None = None  # peak RSS minus RSS before the attack
    rss_end_mb: float | None = None  # RSS at the end minus RSS before the attack
    stall_ms: float | None = None  # worst round trip of a good session
    good_sent: int | None = None
    good_lost: int | None = None  # requests without an echo
    good_error: str = ""
    dropped: str = "-"  # the attacker's fate, e.g. "after 11.2 s", "no (alive at 20 s)"
    outcome: str = ""
    log_kb: float | None = None  # server log growth during the attack
    seconds: float = 0.0  # wall time of the whole row (server start to stop)
    error: str = ""  # the harness or the attack itself failed


class ServerProcess:
    """``stress_server.py`` in a child process, its stdout events, commands and RSS."""

    def __init__(self, proc: asyncio.subprocess.Process, log_path: Path) -> None:
        self.proc = proc
        self.log_path = log_path
        self.events: list[dict[str, Any]] = []
        self._changed = asyncio.Event()
        self._reader = asyncio.create_task(self._read())
        self.url = ""
        self.fingerprint: str | None = None

    @classmethod
    async def start(cls, url: str, args: list[str], workdir: Path) -> ServerProcess:
        log_path = workdir / "server.log"
        log = open(log_path, "wb")  # noqa: SIM115 - handed to the child, closed by close()
        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            "-u",
            str(HERE / "stress_server.py"),
            url,
            *args,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=log,
            limit=1 << 24,
        )
        log.close()
        server = cls(proc, log_path)
        event = await server.wait_event(lambda e: e["event"] == "url", 30)
        if event is None:
            await server.close()
            raise RuntimeError(f"server did not start; log: {server.log_tail()}")
        server.url, server.fingerprint = event["url"], event.get("fingerprint")
        return server

    async def _read(self) -> None:
        assert self.proc.stdout is not None
        while line := await self.proc.stdout.readline():
            with contextlib.suppress(ValueError):
                self.events.append(json.loads(line))
                self._changed.set()
        self._changed.set()

    async def wait_event(self, match: Any, timeout: float, since: int = 0) -> dict[str, Any] | None:
        """The first event from index ``since`` on for which ``match(event)`` is true, or None."""
        deadline = time.monotonic() + timeout
        while True:
            for event in self.events[since:]:
                if match(event):
                    return event
            if self._reader.done():
                return None
            left = deadline - time.monotonic()
            if left <= 0:
                return None
            self._changed.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._changed.wait(), left)

    async def command(self, line: str, reply: str | None, timeout: float = 30.0) -> dict[str, Any] | None:
        """Send one command; wait for the next event named ``reply``."""
        since = len(self.events)
        assert self.proc.stdin is not None
        try:
            self.proc.stdin.write(line.encode() + b"\n")
            await self.proc.stdin.drain()
        except (ConnectionError, RuntimeError):
            return None
        if reply is None:
            return None
        return await self.wait_event(lambda e: e["event"] == reply, timeout, since)

    def peer_events(self, prefix: str) -> tuple[dict[str, Any] | None, dict[str, Any] | None]:
        """The first ``open`` and ``end`` events of a peer whose agent id starts with ``prefix``."""
        opened = next((e for e in self.events if e["event"] == "open" and e["peer"].startswith(prefix)), None)
        ended = next((e for e in self.events if e["event"] == "end" and e["peer"].startswith(prefix)), None)
        return opened, ended

    def status(self) -> dict[str, int]:
        return read_status(self.proc.pid)

    def log_size(self) -> int:
        try:
            return self.log_path.stat().st_size
        except OSError:
            return 0

    def log_tail(self, since: int = 0, limit: int = 1 << 20) -> str:
        with contextlib.suppress(OSError), open(self.log_path, "rb") as f:
            f.seek(since)
            return f.read(limit).decode("utf-8", "replace")
        return ""

    async def close(self) -> None:
        if self.proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                self.proc.send_signal(signal.SIGKILL)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.proc.wait(), 10)
        self._reader.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._reader


class GoodProcess:
    """``stress_good.py``: good sessions that measure their worst round trip."""

    def __init__(self, proc: asyncio.subprocess.Process) -> None:
        self.proc = proc
        self.result: dict[str, Any] | None = None

    @classmethod
    async def start(cls, url: str, sessions: int, fingerprint: str | None) -> GoodProcess:
        args = [url, "--sessions", str(sessions)]
        if fingerprint:
            args += ["--fingerprint", fingerprint]
        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            str(HERE / "stress_good.py"),
            *args,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        good = cls(proc)
        assert proc.stdout is not None
        line = await asyncio.wait_for(proc.stdout.readline(), 30)
        if not line.startswith(b'{"ready"'):
            err = b""
            if proc.stderr is not None:
                with contextlib.suppress(TimeoutError):
                    err = await asyncio.wait_for(proc.stderr.read(), 5)
            await good.kill()
            raise RuntimeError(f"good sessions did not start: {line!r} {err[-500:]!r}")
        return good

    async def stop(self) -> dict[str, Any] | None:
        """Tell the sessions to stop; their result (None if the process gave none)."""
        if self.result is not None or self.proc.returncode is not None:
            return self.result
        assert self.proc.stdin is not None and self.proc.stdout is not None
        try:
            self.proc.stdin.write(b"stop\n")
            await self.proc.stdin.drain()
            line = await asyncio.wait_for(self.proc.stdout.readline(), 15)
            self.result = json.loads(line) if line else None
        except (ConnectionError, TimeoutError, ValueError):
            self.result = None
        await self.kill(grace=3)
        return self.result

    async def kill(self, grace: float = 0) -> None:
        if grace:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.proc.wait(), grace)
        if self.proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                self.proc.kill()
            await self.proc.wait()


@dataclass
class Harness:
    """The context of one attack: its server, its good sessions and the row being filled in."""

    row: Row
    server: ServerProcess | None = None
    good: GoodProcess | None = None
    base_kb: int = 0
    peak_kb: int = 0
    log_base: int = 0
    attack_started: float = 0.0
    workdir: Path = field(default_factory=lambda: Path(tempfile.mkdtemp(prefix="m2mstress-")))
    _sampler: asyncio.Task[None] | None = None

    @property
    def url(self) -> str:
        assert self.server is not None
        return self.server.url

    async def setup(self, transport: str, server_args: list[str], good_sessions: int) -> None:
        url = "quic://127.0.0.1:0" if transport == "quic" else "ws://127.0.0.1:0"
        self.server = await ServerProcess.start(url, server_args, self.workdir)
        if good_sessions:
            self.good = await GoodProcess.start(self.server.url, good_sessions, self.server.fingerprint)
        await asyncio.sleep(0.5)  # let the good sessions settle into their rhythm
        status = self.server.status()
        self.base_kb = self.peak_kb = status.get("VmRSS", 0)
        reset_peak(self.server.proc.pid)
        self.log_base = self.server.log_size()
        self._sampler = asyncio.create_task(self._sample())
        self.attack_started = time.monotonic()

    async def _sample(self) -> None:
        assert self.server is not None
        pid = self.server.proc.pid
        while True:
            rss = read_status(pid).get("VmRSS")
            if rss is None:
                return
            self.peak_kb = max(self.peak_kb, rss)
            await asyncio.sleep(0.02)

    def elapsed(self) -> float:
        return time.monotonic() - self.attack_started

    async def stop_good(self) -> None:
        """Stop the good sessions and put their figures in the row (idempotent)."""
        if self.good is None:
            return
        result = await self.good.stop()
        row = self.row
        if result is None:
            row.good_error = "good-session process gave no result"
            return
        sessions = result["sessions"]
        row.stall_ms = max(s["worst_s"] for s in sessions) * 1000
        row.good_sent = sum(s["sent"] for s in sessions)
        row.good_lost = sum(s["sent"] - s["received"] for s in sessions)
        row.good_error = "; ".join(s["error"] for s in sessions if s["error"])[:160]

    def rss_now_mb(self) -> float | None:
        if self.server is None:
            return None
        rss = self.server.status().get("VmRSS")
        return None if rss is None else (rss - self.base_kb) / 1024

    def dropped_after(self, prefix: str, waited: float) -> str:
        """The attacker's fate from the server's events: when its handler ended, relative to the start
        of the attack, or that it was still running after ``waited`` seconds."""
        assert self.server is not None
        opened, ended = self.server.peer_events(prefix)
        if opened is None:
            return "never established"
        if ended is None:
            return f"no (alive at {waited:.0f} s)"
        return f"after {ended['t'] - self.attack_started:.1f} s"

    async def finish(self) -> None:
        await self.stop_good()
        row = self.row
        if self.server is not None:
            status = self.server.status()
            hwm = status.get("VmHWM", 0)
            self.peak_kb = max(self.peak_kb, hwm)
            row.rss_base_mb = self.base_kb / 1024
            row.rss_peak_mb = (self.peak_kb - self.base_kb) / 1024
            if "VmRSS" in status and row.rss_end_mb is None:
                row.rss_end_mb = (status["VmRSS"] - self.base_kb) / 1024
            row.log_kb = (self.server.log_size() - self.log_base) / 1024
        if self._sampler is not None:
            self._sampler.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._sampler

    async def close(self, keep_log: Path | None = None) -> None:
        if keep_log is not None and self.server is not None:
            keep_log.mkdir(parents=True, exist_ok=True)
            with contextlib.suppress(OSError):
                (keep_log / f"{self.row.name}.log").write_bytes(self.server.log_path.read_bytes())
        if self.good is not None:
            await self.good.kill()
        if self.server is not None:
            await self.server.close()
        for path in self.workdir.iterdir():
            with contextlib.suppress(OSError):
                path.unlink()
        with contextlib.suppress(OSError):
            os.rmdir(self.workdir)
