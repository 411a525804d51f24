"""The UDP side of the QUIC transport: a batching datagram transport and address helpers.

aioquic's cost is per packet, and asyncio's datagram transport hands over one datagram per
event-loop turn, after which aioquic builds its reply packets (ACKs, window updates, more data).
:class:`UdpTransport` reads every queued datagram first and lets each connection that received
some flush once at the end, which halves the CPU per byte in bulk transfers.
"""

from __future__ import annotations

import asyncio
import collections
import ipaddress
import logging
import socket
from typing import Any, Protocol

__all__ = ["UdpTransport", "format_address", "is_loopback", "udp_endpoint"]

logger = logging.getLogger("m2mwire.transport")


class Batched(Protocol):
    """A connection that defers its flush while :class:`UdpTransport` reads a batch."""

    def after_datagrams(self) -> None: ...


def format_address(addr: Any) -> str:
    host, port = str(addr[0]), int(addr[1])
    host = host.removeprefix("::ffff:") if host.startswith("::ffff:") and "." in host else host
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.split("%", 1)[0]).is_loopback
    except ValueError:
        return False


def _tune_socket(sock: socket.socket, size: int) -> None:
    for option in (socket.SO_RCVBUF, socket.SO_SNDBUF):
        try:
            sock.setsockopt(socket.SOL_SOCKET, option, size)
        except OSError as exc:  # pragma: no cover - platform dependent
            logger.debug("could not set UDP socket buffer option %s: %s", option, exc)
    # Linux reports twice the usable size and caps the request at net.core.{r,w}mem_max.
    logger.debug(
        "UDP socket buffers: requested %d bytes, kernel granted SO_RCVBUF=%d SO_SNDBUF=%d",
        size,
        sock.getsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF),
        sock.getsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF),
    )


class UdpTransport(asyncio.DatagramTransport):
    """A UDP transport that reads every queued datagram per readiness event, then flushes once.

    The connections that received datagrams in a batch (they add themselves to :attr:`batch`)
    flush once at its end. Works on any event loop with add_reader/add_writer.
    """

    max_batch = 64
    max_queued = 4096  # datagrams waiting for a full socket buffer; beyond, QUIC sees a loss

    def __init__(
        self, loop: asyncio.AbstractEventLoop, sock: socket.socket, protocol: asyncio.DatagramProtocol
    ) -> None:
        super().__init__(extra={"socket": sock, "sockname": sock.getsockname()})
        self._loop = loop
        self._sock = sock
        self._fd = sock.fileno()
        self._protocol = protocol
        self._queue: collections.deque[tuple[bytes, Any]] = collections.deque()
        self._closing = False
        self.batch: set[Batched] | None = None  # connections to flush at the end of this read
        protocol.connection_made(self)
        loop.add_reader(self._fd, self._read_ready)

    def _read_ready(self) -> None:
        batch: set[Batched] = set()
        self.batch = batch
        try:
            for _ in range(self.max_batch):  # bounded, so one busy socket cannot starve the loop
                try:
                    data, addr = self._sock.recvfrom(65536)
                except (BlockingIOError, InterruptedError):
                    break
                except OSError as exc:
                    self._protocol.error_received(exc)
                    break
                self._protocol.datagram_received(data, addr)
                if self._closing:
                    break
        finally:
            self.batch = None
        for proto in batch:
            proto.after_datagrams()

    def sendto(self, data: bytes | bytearray | memoryview, addr: Any = None) -> None:
        if self._closing:
            return
        if not self._queue:
            try:
                self._sock.sendto(data, addr)
                return
            except (BlockingIOError, InterruptedError):
                self._loop.add_writer(self._fd, self._write_ready)
            except OSError as exc:
                self._protocol.error_received(exc)
                return
        if len(self._queue) < self.max_queued:
            self._queue.append((bytes(data), addr))

    def _write_ready(self) -> None:
        while self._queue:  # bounded by the queue
            data, addr = self._queue[0]
            try:
                self._sock.sendto(data, addr)
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:
                self._protocol.error_received(exc)
            self._queue.popleft()
        self._loop.remove_writer(self._fd)

    def get_write_buffer_size(self) -> int:
        return sum(len(d) for d, _ in self._queue)

    def is_closing(self) -> bool:
        return self._closing

    def close(self) -> None:
        if self._closing:
            return
        self._closing = True
        self._loop.remove_reader(self._fd)
        self._loop.remove_writer(self._fd)
        self._queue.clear()
        self._loop.call_soon(self._connection_lost)

    def abort(self) -> None:
        self.close()

    def _connection_lost(self) -> None:
        try:
            self._protocol.connection_lost(None)
        finally:
            self._sock.close()


async def udp_endpoint(
    protocol: asyncio.DatagramProtocol,
    host: str,
    port: int,
    *,
    socket_buffer: int,
    family: int = 0,
    reuse_port: bool = False,
) -> UdpTransport:
    loop = asyncio.get_running_loop()
    infos = await loop.getaddrinfo(host, port, family=family, type=socket.SOCK_DGRAM, flags=socket.AI_PASSIVE)
    family, _, _, _, addr = infos[0]
    sock = socket.socket(family, socket.SOCK_DGRAM)
    try:
        _tune_socket(sock, socket_buffer)
        if reuse_port:  # several worker processes on one port: the kernel spreads the clients
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        sock.setblocking(False)
        sock.bind(addr)
        return UdpTransport(loop, sock, protocol)
    except BaseException:
        sock.close()
        raise
