"""Proxies that break connections on purpose, for the resume tests and benchmarks/bench_resume.py.

``TcpChaosProxy`` forwards TCP (WebSocket) and aborts a connection pair (RST, both sides) after a
random number of forwarded bytes, so cuts land mid-frame. ``UdpChaosProxy`` forwards UDP (QUIC)
and can blackhole the path: nothing passes until it is lifted, long enough for the connection to
be declared dead.
"""

from __future__ import annotations

import asyncio
import contextlib
import random

__all__ = ["TcpChaosProxy", "UdpChaosProxy"]


class TcpChaosProxy:
    """127.0.0.1:port -> target; ``cut_after=(lo, hi)`` cuts each connection after a random
    number of bytes (either direction) in that range; ``cut()`` cuts every connection now."""

    def __init__(self, target_port: int, *, cut_after: tuple[int, int] | None = None, seed: int = 0) -> None:
        self.target_port = target_port
        self.cut_after = cut_after
        self.rng = random.Random(seed)
        self.cuts = 0
        self.connections = 0
        self.refusing = False  # reset new connections at once (a server that is unreachable)
        self._server: asyncio.Server | None = None
        self._pairs: set[tuple[asyncio.StreamWriter, asyncio.StreamWriter]] = set()
        self._tasks: set[asyncio.Task[None]] = set()
        self.port = 0

    async def start(self) -> TcpChaosProxy:
        self._server = await asyncio.start_server(self._handle, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        if self.refusing:
            writer.transport.abort()
            return
        try:
            up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.target_port)
        except OSError:
            writer.transport.abort()
            return
        pair = (writer, up_writer)
        self._pairs.add(pair)
        budget = [self.rng.randint(*self.cut_after) if self.cut_after else -1]
        tasks = [
            asyncio.create_task(self._pump(reader, up_writer, pair, budget)),
            asyncio.create_task(self._pump(up_reader, writer, pair, budget)),
        ]
        self._tasks.update(tasks)
        try:
            await asyncio.gather(*tasks, return_exceptions=True)
        finally:
            self._tasks.difference_update(tasks)
            self._abort(pair)

    async def _pump(
        self,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        pair: tuple[asyncio.StreamWriter, asyncio.StreamWriter],
        budget: list[int],
    ) -> None:
        while True:
            data = await reader.read(65536)
            if not data:
                with contextlib.suppress(OSError):
                    writer.write_eof()
                return
            if budget[0] >= 0:
                if len(data) >= budget[0]:
                    # Part of a frame, then the cut: an RST after a moment (what was delivered
                    # before a real network fails gets read; an RST at once would make the
                    # kernel discard it), or a plain close half of the time.
                    writer.write(data[: budget[0]])
                    budget[0] = 0
                    self.cuts += 1
                    if self.rng.random() < 0.5:
                        for w in pair:
                            w.close()
                        self._pairs.discard(pair)
                    else:
                        await asyncio.sleep(0.005)
                        self._abort(pair)
                    return
                budget[0] -= len(data)
            writer.write(data)
            await writer.drain()

    def _abort(self, pair: tuple[asyncio.StreamWriter, asyncio.StreamWriter]) -> None:
        if pair in self._pairs:
            self._pairs.discard(pair)
            for w in pair:
                w.transport.abort()

    def cut(self) -> None:
        for pair in list(self._pairs):
            self.cuts += 1
            self._abort(pair)

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
        self.cut()
        for task in list(self._tasks):
            task.cancel()
        if self._server is not None:
            await self._server.wait_closed()


class _Downstream(asyncio.DatagramProtocol):
    def __init__(self, proxy: UdpChaosProxy) -> None:
        self.proxy = proxy
        self.transport: asyncio.DatagramTransport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def datagram_received(self, data: bytes, addr: tuple[str, int]) -> None:
        self.proxy._from_client(data, addr)


class _Upstream(asyncio.DatagramProtocol):
    def __init__(self, proxy: UdpChaosProxy, client: tuple[str, int]) -> None:
        self.proxy = proxy
        self.client = client
        self.transport: asyncio.DatagramTransport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def datagram_received(self, data: bytes, addr: tuple[str, int]) -> None:
        self.proxy._from_server(data, self.client)


class UdpChaosProxy:
    """127.0.0.1:port -> target (UDP), one upstream socket per client address;
    ``blackhole(seconds)`` drops every datagram both ways for that long."""

    def __init__(self, target_port: int) -> None:
        self.target_port = target_port
        self.port = 0
        self.blackholes = 0
        self._down: _Downstream | None = None
        self._ups: dict[tuple[str, int], _Upstream] = {}
        self._dark_until = 0.0
        self._loop = asyncio.get_running_loop()

    async def start(self) -> UdpChaosProxy:
        transport, protocol = await self._loop.create_datagram_endpoint(
            lambda: _Downstream(self), local_addr=("127.0.0.1", 0)
        )
        self._down = protocol
        self.port = transport.get_extra_info("sockname")[1]
        return self

    @property
    def flows(self) -> int:
        """Client addresses (UDP sockets, i.e. QUIC connections) that got through so far."""
        return len(self._ups)

    @property
    def dark(self) -> bool:
        return self._loop.time() < self._dark_until

    def blackhole(self, seconds: float) -> None:
        self.blackholes += 1
        self._dark_until = self._loop.time() + seconds

    def _from_client(self, data: bytes, addr: tuple[str, int]) -> None:
        if self.dark:
            return
        up = self._ups.get(addr)
        if up is None:
            up = _Upstream(self, addr)
            self._ups[addr] = up
            self._loop.create_task(self._open_upstream(up, data))
            return
        if up.transport is not None:
            up.transport.sendto(data, ("127.0.0.1", self.target_port))

    async def _open_upstream(self, up: _Upstream, first: bytes) -> None:
        transport, _ = await self._loop.create_datagram_endpoint(lambda: up, local_addr=("127.0.0.1", 0))
        transport.sendto(first, ("127.0.0.1", self.target_port))

    def _from_server(self, data: bytes, client: tuple[str, int]) -> None:
        if self.dark or self._down is None or self._down.transport is None:
            return
        self._down.transport.sendto(data, client)

    async def close(self) -> None:
        for up in self._ups.values():
            if up.transport is not None:
                up.transport.close()
        if self._down is not None and self._down.transport is not None:
            self._down.transport.close()
