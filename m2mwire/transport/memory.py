"""An in-memory channel pair with the whole channel contract, and a transport around it.

For testing the session shell deterministically, without sockets (websockets tests its protocol
over ``socket.socketpair()``, httpcore over a mock backend). Each direction has a bounded buffer
on the receiving side, and the pair behaves as a connection does:

* **reading**: the receiver's buffer is delivered, in order, to ``start_push``'s callback (one
  loop turn after the write, as a socket's data arrives; a text message as its UTF-8 bytes and
  the text flag, as every transport hands it) or to ``recv()`` (text decoded to ``str``);
  ``pause_reading()`` stops delivery and the buffer then fills.
* **writing**: ``send_now`` writes when the peer's buffer has room and returns False otherwise;
  ``send()`` waits for room (real backpressure: nothing is buffered beyond ``buffer_bytes``, save
  one message of any size into an empty buffer, as a socket's write buffer takes any write).
  A ``send()`` cancelled while waiting has written nothing.
* **limits**: a message above the receiver's ``max_message_size`` fails the channel with 1009
  before it is buffered, as websockets does.
* **closing**: ``close(code, reason)`` queues a close behind what was sent; the peer, on reading
  it, answers with the same code (unless it sent its own close), and each side ends, once it has
  read the other's close, with a clean TransportError carrying the code and reason it received.
  ``abort()`` ends both sides at once with an unclean one (1006).

``memory://name:port`` URLs are served by :func:`listen` and reached by :func:`open` (the
registry's transport interface) within one process; the transport is not registered by default.
"""

from __future__ import annotations

import asyncio
import itertools
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from m2mwire.errors import TransportError
from m2mwire.schemas.codes import CloseCode
from m2mwire.transport.base import Channel, ChannelHandler, OnMessage, OutgoingMessage, TransportConfig
from m2mwire.transport.registry import Endpoint, Registration

__all__ = ["REGISTRATION", "MemoryChannel", "MemoryListener", "listen", "open", "pair"]

DEFAULT_BUFFER_BYTES = 64 * 1024
REGISTRATION = Registration("m2mwire.transport.memory", default_port=0)  # register under a scheme to use


@dataclass(frozen=True, slots=True)
class _Close:
    code: int
    reason: str


OnLost = Callable[[TransportError], None]
_Data = tuple[bytes, bool]  # a message as it travels: its bytes and whether it is text


class MemoryChannel:
    """One end of a :func:`pair`: Channel, PushChannel and DirectSendChannel."""

    def __init__(self, name: str, max_message_size: int, buffer_bytes: int) -> None:
        self._loop = asyncio.get_running_loop()
        self._name = name
        self._max = max_message_size
        self._capacity = buffer_bytes
        self.peer: MemoryChannel | None = None
        self._incoming: deque[_Data | _Close] = deque()
        self.buffered_bytes = 0  # bytes in _incoming: what the peer wrote and we have not read
        self._space: list[asyncio.Future[None]] = []  # the peer's send() calls waiting for room
        self._readable: asyncio.Future[None] | None = None  # our recv() waiting for a message
        self._on_message: OnMessage | None = None
        self._on_lost: OnLost | None = None
        self.reading_paused = False
        self._delivery: asyncio.Handle | None = None
        self._closing: _Close | None = None  # we sent a close and wait for the answer
        self._closed_event = asyncio.Event()
        self.lost: TransportError | None = None  # how the channel ended, once it has

    # -- Channel ---------------------------------------------------------------------------------

    @property
    def max_message_size(self) -> int:
        return self._max

    def set_max_message_size(self, size: int) -> None:
        self._max = size

    @property
    def remote_address(self) -> str:
        return f"memory:{self._name}"

    def send_now(self, message: OutgoingMessage, text: bool = False) -> bool:
        """Write ``message`` if the peer's buffer has room; False (nothing written) otherwise."""
        data = _whole(message, text)
        peer = self._writable_peer()
        if peer is None or not peer._has_room(len(data[0])):
            return False
        peer._receive(data)
        return True

    async def send(self, message: OutgoingMessage, text: bool = False) -> None:
        data = _whole(message, text)
        size = len(data[0])
        while True:
            peer = self._writable_peer()
            if peer is None:
                raise self._gone()
            if peer._has_room(size):
                peer._receive(data)
                return
            waiter = self._loop.create_future()
            peer._space.append(waiter)
            await waiter  # cancelled here: nothing was written

    async def recv(self) -> str | bytes:
        """The next message, text decoded to ``str`` (a test's view; the session's is start_push)."""
        while True:
            if self._incoming and not isinstance(self._incoming[0], _Close):
                message = self._incoming.popleft()
                assert not isinstance(message, _Close)
                self._taken(message)
                data, text = message
                return data.decode() if text else data
            if self._incoming:
                self._read_close()
            if self.lost is not None:
                raise self.lost
            self._readable = self._loop.create_future()
            await self._readable

    async def close(self, code: int = CloseCode.NORMAL, reason: str = "") -> None:
        """Send a close behind what was sent, wait for the peer's answer (it must read to give
        one: cancel or time out this call and abort, as with a real connection)."""
        if self.lost is None and self._closing is None:
            self._closing = _Close(code, reason)
            peer = self.peer
            assert peer is not None
            peer._incoming.append(self._closing)
            peer._schedule_delivery()
        await self._closed_event.wait()

    def abort(self) -> None:
        error = TransportError("in-memory connection aborted (1006)", code=CloseCode.ABNORMAL)
        peer = self.peer
        self._end(error)
        if peer is not None:
            peer._end(error)

    # -- PushChannel -----------------------------------------------------------------------------

    def start_push(self, on_message: OnMessage, on_lost: OnLost) -> None:
        self._on_message, self._on_lost = on_message, on_lost
        if self._incoming:
            self._deliver()  # what arrived before: synchronously, as the contract asks
        if self.lost is not None and self._on_lost is on_lost:
            self._on_lost = None  # called once
            on_lost(self.lost)

    def pause_reading(self) -> None:
        self.reading_paused = True

    def resume_reading(self) -> None:
        self.reading_paused = False
        self._schedule_delivery()

    # -- machinery -------------------------------------------------------------------------------

    def _writable_peer(self) -> MemoryChannel | None:
        peer = self.peer
        if peer is None or self.lost is not None or self._closing is not None or peer.lost is not None:
            return None
        return peer

    def _gone(self) -> TransportError:
        if self.lost is not None:
            return self.lost
        return TransportError("in-memory connection closing", code=CloseCode.NORMAL, clean=True)

    def _has_room(self, size: int) -> bool:
        return self.buffered_bytes == 0 or self.buffered_bytes + size <= self._capacity

    def _receive(self, message: _Data) -> None:
        """The peer wrote ``message``: check it against our limit first, then buffer it."""
        size = len(message[0])
        if self._max and size > self._max:
            reason = f"message of {size} bytes over the {self._max}-byte limit"
            error = TransportError(
                f"in-memory connection failed (1009 {reason})", code=CloseCode.TOO_BIG, reason=reason
            )
            peer = self.peer
            self._end(error)
            if peer is not None:
                peer._end(error)
            return
        self._incoming.append(message)
        self.buffered_bytes += size
        self._schedule_delivery()

    def _taken(self, message: _Data) -> None:
        self.buffered_bytes -= len(message[0])
        waiters, self._space = self._space, []
        for waiter in waiters:
            if not waiter.done():
                waiter.set_result(None)

    def _schedule_delivery(self) -> None:
        if self._readable is not None and not self._readable.done():
            self._readable.set_result(None)
        if self._on_message is not None and self._delivery is None and not self.reading_paused:
            self._delivery = self._loop.call_soon(self._deliver)

    def _deliver(self) -> None:
        self._delivery = None
        incoming = self._incoming
        while incoming and not self.reading_paused and self._on_message is not None:
            message = incoming.popleft()
            if isinstance(message, _Close):
                incoming.appendleft(message)
                self._read_close()
                return
            self._taken(message)
            self._on_message(*message)

    def _read_close(self) -> None:
        """The peer's close is next: we are closed, with its code and reason (the close we
        received, as websockets reports it); if we had not sent one, we answer with the same
        code, as a WebSocket endpoint does, and the peer is closed once it reads the answer."""
        close = self._incoming.popleft()
        assert isinstance(close, _Close)
        if self._closing is None and self.lost is None:
            self._closing = close
            peer = self.peer
            assert peer is not None
            peer._incoming.append(close)
            peer._schedule_delivery()
        detail = f"{close.code} {close.reason}".strip()
        self._end(
            TransportError(
                f"in-memory connection closed ({detail})", code=close.code, reason=close.reason, clean=True
            )
        )

    def _end(self, error: TransportError) -> None:
        if self.lost is not None:
            return
        self.lost = error
        self._closed_event.set()
        if self._delivery is not None:
            self._delivery.cancel()
            self._delivery = None
        if self._readable is not None and not self._readable.done():
            self._readable.set_result(None)
        # Our writes waiting for the peer's room, and the peer's for ours, fail now.
        for channel in (self, self.peer):
            if channel is not None:
                waiters, channel._space = channel._space, []
                for waiter in waiters:
                    if not waiter.done():
                        waiter.set_result(None)
        on_lost = self._on_lost
        self._on_lost = None
        if on_lost is not None:
            on_lost(error)


def _whole(message: OutgoingMessage, text: bool) -> _Data:
    if isinstance(message, str):
        return message.encode(), True
    if isinstance(message, bytes | bytearray | memoryview):
        return bytes(message), text
    return b"".join(message), text


def pair(
    name: str = "pair",
    *,
    max_message_size: int = 0,
    buffer_bytes: int = DEFAULT_BUFFER_BYTES,
) -> tuple[MemoryChannel, MemoryChannel]:
    """Two connected channels (client end, server end); ``max_message_size`` 0 means no limit."""
    # Each end's remote_address names the other end.
    client = MemoryChannel(f"{name}/server", max_message_size, buffer_bytes)
    server = MemoryChannel(f"{name}/client", max_message_size, buffer_bytes)
    client.peer, server.peer = server, client
    return client, server


# -- the registry's transport interface --------------------------------------------------------------

_listeners: dict[tuple[str, int], MemoryListener] = {}
_ports = itertools.count(1)


async def open(endpoint: Endpoint, config: TransportConfig) -> Channel:
    listener = _listeners.get((endpoint.host, endpoint.port))
    if listener is None:
        raise TransportError(f"nothing listens on {endpoint.url} (in-memory transport)")
    client, server = pair(f"{endpoint.host}:{endpoint.port}", buffer_bytes=listener.buffer_bytes)
    client.set_max_message_size(config.max_message_size)
    server.set_max_message_size(listener.max_message_size)
    listener.accept(server)
    return client


def listen(handler: ChannelHandler, endpoint: Endpoint, config: TransportConfig) -> MemoryListener:
    return MemoryListener(handler, endpoint, config)


class MemoryListener:
    """Accepts :func:`open` calls to its ``memory://host:port`` (port 0: the next free number)."""

    def __init__(self, handler: ChannelHandler, endpoint: Endpoint, config: TransportConfig) -> None:
        self._handler = handler
        self._endpoint = endpoint
        self.max_message_size = config.max_message_size
        self.buffer_bytes = DEFAULT_BUFFER_BYTES  # per direction; tests may set it after start()
        self.port = endpoint.port
        self.fingerprint: str | None = None
        self._tasks: set[asyncio.Task[None]] = set()

    @property
    def url(self) -> str:
        return f"{self._endpoint.scheme}://{self._endpoint.host}:{self.port}"

    async def start(self) -> None:
        if self.port == 0:
            self.port = next(p for p in _ports if (self._endpoint.host, p) not in _listeners)
        key = (self._endpoint.host, self.port)
        if key in _listeners:
            raise TransportError(f"{self.url} is in use (in-memory transport)")
        _listeners[key] = self

    def accept(self, channel: MemoryChannel) -> None:
        task = asyncio.get_running_loop().create_task(self._run(channel))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _run(self, channel: MemoryChannel) -> None:
        try:
            await self._handler(channel)
        finally:
            channel.abort()  # a no-op after an orderly close

    def close(self) -> None:
        if _listeners.get((self._endpoint.host, self.port)) is self:
            del _listeners[(self._endpoint.host, self.port)]

    async def wait_closed(self) -> None:
        self.close()
        if self._tasks:
            await asyncio.wait(list(self._tasks))
