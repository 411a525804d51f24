"""WebSocket transport: one session per WebSocket connection (websockets' asyncio API).

Text messages carry JSON envelopes; binary messages carry TokenNative binary and AVP frames. Both
reach the session as bytes plus a text flag: a text frame's payload is not decoded here (websockets'
sans-I/O layer does not decode data frames either; its asyncio layer would, but we take frames
before it), the session validates its UTF-8 as it parses it and, when it is not UTF-8, closes
with 1007 as websockets would. A text message is sent from the UTF-8 bytes the session encoded.
permessage-deflate is always off: we compress ourselves, and deflate on tensor frames was measured
60x slower. websockets' own keepalive pings are off too: the session's PING/PONG does that job.

Received messages are pushed to the session straight from the connection's ``data_received``
instead of going through websockets' message queue and a reader task: that saves an event-loop
hop per message. Backpressure then works at the socket: when the session's inbox is full we pause
reading. That, the copy-saving reader and the certificate pin need websockets internals, which
``websockets_compat`` holds and checks at import (this module touches none itself).

Resource bounds (docs/PROTOCOL.md, "Resource bounds"): a peer that sends PINGs (or anything else
websockets answers by itself) without reading the answers stops being read once those answers
queue up (``_MAX_REPLY_BACKLOG``); a fragmented message may have at most one frame per 64 bytes
of the message size limit (``_BYTES_PER_FRAGMENT``); a pinned certificate is checked before the
HTTP upgrade request (which carries the URL's path, query and headers) is written.
"""

from __future__ import annotations

import asyncio
import functools
import ssl as ssl_module
import sys
from collections import deque
from collections.abc import Awaitable, Callable
from typing import Any, cast

from websockets.asyncio.client import ClientConnection
from websockets.asyncio.client import connect as ws_connect
from websockets.asyncio.server import Server, ServerConnection
from websockets.asyncio.server import serve as ws_serve
from websockets.exceptions import ConnectionClosed, ConnectionClosedOK, InvalidHandshake, InvalidURI
from websockets.frames import CloseCode, Frame, Opcode
from websockets.protocol import State

from m2mwire.errors import TransportError
from m2mwire.transport import websockets_compat as compat
from m2mwire.transport.base import Buffer, Message, OnMessage, OutgoingMessage
from m2mwire.transport.chunkreader import ChunkReader

__all__ = ["WebSocketChannel", "connect_websocket", "serve_websocket"]

_WRITE_LIMIT = 32 * 1024
# asyncio's selector transport reads up to 256 KiB per turn of the loop. A read that fills it means
# the peer sends faster than we read; if it also sends large messages (a frame of 16 KiB or more),
# the connection reads 1 MiB at a time from then on: a quarter of the reads and loop turns, and
# fewer frames split between chunks (+20-30% server throughput on 64 KiB frames). Request/response
# traffic never fills a read, and a flood of small messages keeps 256 KiB: one read's worth of
# them is what the loop handles in one go, and what the inbox can overshoot its bound by.
_FULL_READ = 256 * 1024
_LARGE_FRAME = 16 * 1024
_BULK_READ = 1024 * 1024
# Binary messages handed over in parts are joined below this size (a copy is cheaper than a frame,
# a mask and a syscall per part); larger ones go out as fragments of one message.
_JOIN_BELOW = 256 * 1024


def _one_frame(message: OutgoingMessage, text: bool) -> tuple[Buffer | list[Buffer], bool]:
    """``message`` as one frame's payload, or as a list of fragments (a large message in parts:
    no concatenation), with its text flag (a ``str`` is text, sent as its UTF-8)."""
    if isinstance(message, str):
        return message.encode(), True
    if isinstance(message, bytes | bytearray | memoryview):
        return message, text
    if len(message) == 1:
        return message[0], text
    if sum(memoryview(part).nbytes for part in message) <= _JOIN_BELOW:
        return b"".join(message), text  # one frame beats several for small messages
    return list(message), text


# Frames written without the loop turning in between go out together once this many bytes wait
# (see m2m_write_soon): large enough that a syscall per batch is cheap, small next to the socket's
# buffers, so a batch still leaves at once.
_COALESCE = 64 * 1024

# Automatic replies (PONGs to the peer's PINGs, a close frame) that may queue while the peer does
# not read what we write: beyond this, we stop reading until our writes drain (see data_received).
_MAX_REPLY_BACKLOG = 64 * 1024
# A fragmented message may have one frame per this many bytes of max_message_size (and at least
# _MIN_FRAGMENTS): empty or tiny fragments otherwise cost memory and CPU without counting against
# any size limit. 64 bytes per frame is the smallest fragment size of the Autobahn suite's
# fragmentation cases (4 MiB in 65,536 frames), which therefore pass at a limit of 4 MiB.
_BYTES_PER_FRAGMENT = 64
_MIN_FRAGMENTS = 1024

# Enum member reads cost ~0.12 us on Python 3.11: these run for every frame.
_TEXT, _CONT = Opcode.TEXT, Opcode.CONT
_OPEN = State.OPEN

OnLost = Callable[[TransportError], None]


class _PushMixin(compat.DataFrameHook, compat.QuietAfterAbort):
    """Assemble data frames into messages and hand each to a callback (or buffer until one is set)."""

    protocol: Any
    transport: Any

    def _m2m_init(self) -> None:
        self.m2m_on_message: OnMessage | None = None
        self.m2m_on_lost: OnLost | None = None
        self.m2m_early: deque[tuple[Message, bool]] = deque()  # (message, text) before start_push
        self.m2m_lost: TransportError | None = None
        self._m2m_frags: list[bytes] | None = None
        self._m2m_frames_left = 0  # frames the fragmented message in progress may still have
        self._m2m_text = False
        # Reading is paused while the session asks for it (its inbox is full) or while automatic
        # replies pile up unread by the peer; the socket is read only when neither holds.
        self._m2m_session_paused = False
        self._m2m_replies_paused = False
        self._m2m_reading_paused = False
        self.m2m_writing_paused = False
        self._m2m_reply_backlog = 0  # bytes of automatic replies queued since writing paused
        self.m2m_connection_lost = False
        self._m2m_loop = asyncio.get_running_loop()
        # A write went out at once since the last sign of a new loop turn (see m2m_write_soon).
        self._m2m_turn_marked = False
        self._m2m_end_scheduled = False  # _m2m_end_turn is due at the end of this turn
        self._m2m_unflushed = 0  # bytes of frames queued in the protocol since the last flush
        self.m2m_waiter: asyncio.Future[None] | None = None
        # Swap in the copy-saving reader before any byte arrives.
        compat.install_reader(
            self.protocol,
            ChunkReader(bulk_chunk=_FULL_READ, bulk_read=_LARGE_FRAME, on_bulk=self._m2m_read_in_bulk),
        )

    def _m2m_read_in_bulk(self) -> None:
        # max_size is the selector transport's read size (an instance attribute overrides the
        # class's); other transports (TLS, uvloop) read their own way and are left alone.
        if getattr(self.transport, "max_size", None) == _FULL_READ:
            self.transport.max_size = _BULK_READ

    # -- reading gate ------------------------------------------------------------------------------

    def m2m_pause_reading(self, paused: bool) -> None:
        """The session's backpressure: stop (True) or restart (False) reading the socket."""
        self._m2m_session_paused = paused
        self._m2m_update_reading()

    def _m2m_update_reading(self) -> None:
        pause = self._m2m_session_paused or self._m2m_replies_paused
        transport = self.transport
        if pause == self._m2m_reading_paused or transport is None or transport.is_closing():
            return
        self._m2m_reading_paused = pause
        if pause:
            transport.pause_reading()
        else:
            transport.resume_reading()

    def data_received(self, data: bytes) -> None:
        # Input arrived: what is written in answer goes out at once (see m2m_write_soon).
        self._m2m_turn_marked = False
        if not self.m2m_writing_paused:
            super().data_received(data)
            return
        # The peer does not read what we write. websockets answers PINGs (and a close) on its
        # own, straight into the write buffer, so a peer flooding PINGs would make that buffer
        # grow without bound. Nothing else writes synchronously from here (the session's
        # replies go through its writer task, which waits for drain), so the growth across
        # this call is those automatic replies: past _MAX_REPLY_BACKLOG, stop reading until
        # the peer has read our output (resume_writing). The buffer then holds at most the
        # write limit, the application's messages in progress, _MAX_REPLY_BACKLOG and the
        # replies to one read.
        transport = self.transport
        before = transport.get_write_buffer_size()
        super().data_received(data)
        self._m2m_reply_backlog += transport.get_write_buffer_size() - before
        if self._m2m_reply_backlog > _MAX_REPLY_BACKLOG and not self._m2m_replies_paused:
            self._m2m_replies_paused = True
            self._m2m_update_reading()

    def pause_writing(self) -> None:
        super().pause_writing()  # type: ignore[misc]
        self.m2m_writing_paused = True
        self._m2m_reply_backlog = 0

    def resume_writing(self) -> None:
        super().resume_writing()  # type: ignore[misc]
        self.m2m_writing_paused = False
        if self._m2m_replies_paused:
            self._m2m_replies_paused = False
            self._m2m_update_reading()

    # -- writing -----------------------------------------------------------------------------------

    def m2m_write_soon(self, size: int) -> None:
        """Put out the frame of ``size`` bytes just queued in the protocol: at once if it is the
        first one since input arrived or a loop turn ended (a request, an answer wait for no
        one), else with the others, when the turn ends or _COALESCE bytes are waiting. A sender
        that writes many messages without yielding then costs one write() system call per
        _COALESCE bytes instead of one per message (-3-4 us a 1 KB message), while what is
        held back is bounded by _COALESCE plus one message and waits at most one loop turn.

        The end of a turn is only watched (a call_soon) once a write was held back: a request
        and its answer, each written at once after the other's arrival, cost no callback and no
        extra loop iteration (~2-3 us a round trip on each side). A sender that only writes is
        told a new turn apart by the end-of-turn callback its held-back writes scheduled; its
        first write after a quiet spell may wait for the end of that turn (one loop turn)."""
        if not self._m2m_turn_marked:
            self._m2m_turn_marked = True
            self._m2m_flush()
            return
        self._m2m_unflushed += size
        if not self._m2m_end_scheduled:
            self._m2m_end_scheduled = True
            self._m2m_loop.call_soon(self._m2m_end_turn)
        if self._m2m_unflushed >= _COALESCE:
            self._m2m_flush()

    def _m2m_end_turn(self) -> None:
        self._m2m_turn_marked = self._m2m_end_scheduled = False
        if self._m2m_unflushed:
            self._m2m_flush()

    def _m2m_flush(self) -> None:
        self._m2m_unflushed = 0
        protocol = self.protocol
        if protocol.state is _OPEN:
            # While OPEN the protocol's output is frames only (the end of stream, b"", comes
            # after a close), so one writelines() is one system call for all of them, where
            # websockets' send_data() makes one write() (a send() each) per frame.
            data = protocol.data_to_send()
            if data and not self.transport.is_closing():  # else dropped: see QuietAfterAbort
                self.transport.writelines(data)
        else:
            compat.flush(self)

    # -- messages ----------------------------------------------------------------------------------

    def _m2m_too_many_fragments(self) -> None:
        self._m2m_frags = None
        limit = compat.get_max_message_size(self.protocol)
        self.protocol.fail(
            CloseCode.MESSAGE_TOO_BIG,
            f"fragmented message of more than {_fragment_budget(limit)} frames "
            f"(one per {_BYTES_PER_FRAGMENT} bytes of the {limit}-byte message limit)",
        )
        compat.flush(self)  # data_received flushed before processing events: flush the close

    def m2m_data_frame(self, event: Frame) -> None:
        opcode = event.opcode
        if opcode is _CONT:
            frags = self._m2m_frags
            if frags is None:
                return  # the protocol layer already failed the connection for this
            # websockets bounds the payload bytes of all fragments by max_message_size; this
            # bounds their number, so per-frame costs (objects, CPU) are bounded by it too.
            self._m2m_frames_left -= 1
            if self._m2m_frames_left < 0:
                self._m2m_too_many_fragments()
                return
            if event.data:  # empty fragments are counted, never stored
                frags.append(bytes(event.data))
            if not event.fin:
                return
            data: bytes | bytearray | memoryview = b"".join(frags)
            self._m2m_frags, is_text = None, self._m2m_text
        elif not event.fin:
            self._m2m_frags, self._m2m_text = [bytes(event.data)], opcode is _TEXT
            self._m2m_frames_left = _fragment_budget(compat.get_max_message_size(self.protocol)) - 1
            return
        else:
            data, is_text = event.data, opcode is _TEXT
        # Text too stays bytes (the session validates the UTF-8 as it parses): the same object
        # when it is bytes already (a server's unmasked payload), one copy of a view otherwise.
        self.m2m_deliver(bytes(data), is_text)

    def m2m_deliver(self, message: bytes, text: bool) -> None:
        # Also called straight from compat.DataFrameHook.data_received for whole frames.
        if self.m2m_on_message is not None:
            self.m2m_on_message(message, text)
        else:
            self.m2m_early.append((message, text))
            if self.m2m_waiter is not None and not self.m2m_waiter.done():
                self.m2m_waiter.set_result(None)

    def connection_lost(self, exc: Exception | None) -> None:
        super().connection_lost(exc)  # type: ignore[misc]
        self.m2m_connection_lost = True
        err = _closed(self.protocol.close_exc)
        if self.m2m_on_lost is not None:
            self.m2m_on_lost(err)
        else:
            self.m2m_lost = err
            if self.m2m_waiter is not None and not self.m2m_waiter.done():
                self.m2m_waiter.set_result(None)


def _fragment_budget(max_message_size: int | None) -> int:
    """Frames a fragmented message may have under this limit (no limit: no bound)."""
    if not max_message_size:
        return sys.maxsize
    return max(_MIN_FRAGMENTS, max_message_size // _BYTES_PER_FRAGMENT)


class _ClientConnection(_PushMixin, compat.PinBeforeHandshake, ClientConnection):
    def __init__(self, *args: Any, m2m_fingerprint: str | None = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._m2m_init()
        self._m2m_fingerprint = m2m_fingerprint
        self.m2m_pin_checked = False

    def m2m_before_handshake(self) -> None:
        # The upgrade request carries the URL's path and query (often a token), Host and
        # User-Agent: a pinned certificate is checked first, so an impostor receives none of
        # it. websockets' connect() aborts the connection on this exception and re-raises it.
        if self._m2m_fingerprint is not None:
            _verify_pin(self.transport, self._m2m_fingerprint)
            self.m2m_pin_checked = True


class _ServerConnection(_PushMixin, ServerConnection):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._m2m_init()


_Connection = _ClientConnection | _ServerConnection


class WebSocketChannel:
    """A :class:`~m2mwire.transport.base.Channel` over one websockets connection.

    It also offers the push interface (``start_push``/``pause_reading``/``resume_reading``) that
    the session uses to receive without a reader task; ``recv()`` works until push starts.
    """

    def __init__(self, connection: _Connection) -> None:
        self._ws = connection

    @property
    def max_message_size(self) -> int:
        return compat.get_max_message_size(self._ws.protocol) or 0

    def set_max_message_size(self, size: int) -> None:
        compat.set_max_message_size(self._ws.protocol, size if size > 0 else None)

    @property
    def remote_address(self) -> str:
        addr = self._ws.remote_address
        if isinstance(addr, tuple) and len(addr) >= 2:
            return f"{addr[0]}:{addr[1]}"
        return str(addr)

    def send_now(self, message: OutgoingMessage, text: bool = False) -> bool:
        """Write ``message`` now through websockets' Sans-I/O protocol, or return False untouched.

        This is what ``Connection.send()`` does for a message that needs no waiting, without its
        coroutine and async context manager (a third of a small message's cost). Anything that
        could wait or fail (writing paused by flow control, a closing connection, a message sent
        as fragments) returns False, and the caller goes through :meth:`send`.
        """
        ws = self._ws
        protocol = ws.protocol
        if ws.m2m_writing_paused or protocol.state is not _OPEN:
            return False
        frame, text = _one_frame(message, text)
        if isinstance(frame, list):
            return False  # fragments: send()'s job
        # A text message's UTF-8 as it is: no decode, no re-encode.
        compat.send_data_frame(protocol, frame, text)
        ws.m2m_write_soon(len(frame) if type(frame) is bytes else memoryview(frame).nbytes)
        return True

    async def send(self, message: OutgoingMessage, text: bool = False) -> None:
        frame, text = _one_frame(message, text)
        try:
            await self._ws.send(frame, text=text)  # bytes with text=True: a text frame
        except ConnectionClosed as exc:
            raise _closed(exc) from exc

    async def recv(self) -> str | bytes:
        """The next message, text decoded to ``str``: for a channel used without a session
        (the session takes messages with start_push, as bytes and a text flag)."""
        ws = self._ws
        while not ws.m2m_early:
            if ws.m2m_lost is not None:
                raise ws.m2m_lost
            ws.m2m_waiter = asyncio.get_running_loop().create_future()
            await ws.m2m_waiter
        data, text = ws.m2m_early.popleft()
        if not text:
            return data
        try:
            return str(data, "utf-8")
        except UnicodeDecodeError as exc:
            reason = f"{exc.reason} at position {exc.start}"
            ws.protocol.fail(CloseCode.INVALID_DATA, reason)
            compat.flush(ws)
            raise TransportError(
                f"WebSocket text message is not UTF-8 ({reason}): closed with 1007",
                code=CloseCode.INVALID_DATA,
                reason=reason,
            ) from None

    def start_push(self, on_message: OnMessage, on_lost: OnLost) -> None:
        """Deliver every message (including any already received) to ``on_message``, in order."""
        ws = self._ws
        while ws.m2m_early:
            on_message(*ws.m2m_early.popleft())
        ws.m2m_on_message = on_message
        if ws.m2m_lost is not None:
            on_lost(ws.m2m_lost)
        else:
            ws.m2m_on_lost = on_lost

    def pause_reading(self) -> None:
        self._ws.m2m_pause_reading(True)

    def resume_reading(self) -> None:
        self._ws.m2m_pause_reading(False)

    async def close(self, code: int = CloseCode.NORMAL_CLOSURE, reason: str = "") -> None:
        try:
            await self._ws.close(code, reason)
        finally:
            # Cancelled or timed out before the peer finished the closing handshake: websockets
            # would only drop the TCP connection after its own close_timeout, so do it now.
            if not self._ws.m2m_connection_lost:
                self.abort()

    def abort(self) -> None:
        transport = self._ws.transport
        if transport is not None:
            transport.abort()


def _closed(exc: ConnectionClosed) -> TransportError:
    frame = exc.rcvd or exc.sent
    code = frame.code if frame is not None else CloseCode.ABNORMAL_CLOSURE
    reason = frame.reason if frame is not None else ""
    clean = isinstance(exc, ConnectionClosedOK)
    detail = f"{code} {reason}".strip()
    return TransportError(f"WebSocket closed ({detail})", code=code, reason=reason, clean=clean)


def _verify_pin(transport: asyncio.BaseTransport, fingerprint: str) -> None:
    from m2mwire.transport.tls import verify_fingerprint

    ssl_object = transport.get_extra_info("ssl_object")
    if ssl_object is None:
        raise TransportError("a certificate fingerprint was pinned, but the connection has no TLS")
    verify_fingerprint(ssl_object, fingerprint)


def _max_size(max_message_size: int) -> int | None:
    return max_message_size if max_message_size > 0 else None


async def connect_websocket(
    url: str,
    *,
    max_message_size: int,
    ssl: ssl_module.SSLContext | None = None,
    fingerprint: str | None = None,
    open_timeout: float = 10.0,
    **extra: Any,
) -> WebSocketChannel:
    """Open a WebSocket connection and wrap it as a channel.

    With ``fingerprint`` (wss:// only), the server certificate's SHA-256 must match it; it is
    checked right after the TLS handshake, and on a mismatch the connection is dropped before
    the HTTP upgrade request (or anything else) is sent.
    """
    factory = functools.partial(_ClientConnection, m2m_fingerprint=fingerprint)
    try:
        conn = await ws_connect(
            url,
            compression=None,
            max_size=_max_size(max_message_size),
            ping_interval=None,
            write_limit=_WRITE_LIMIT,
            ssl=ssl,
            open_timeout=open_timeout,
            # A factory with the class's signature: websockets only calls it.
            create_connection=cast(type[ClientConnection], factory),
            **extra,
        )
    except (OSError, InvalidHandshake, InvalidURI, TimeoutError) as exc:
        raise TransportError(f"could not open WebSocket {url}: {_open_failure(url, exc)}") from exc
    assert isinstance(conn, _ClientConnection)
    if fingerprint is not None and not conn.m2m_pin_checked:
        # Only if a websockets release stopped opening through handshake(): the pin is then
        # checked late (after the upgrade) rather than never.
        try:
            _verify_pin(conn.transport, fingerprint)
        except TransportError:
            conn.transport.abort()
            raise
    return WebSocketChannel(conn)


def _open_failure(url: str, exc: BaseException) -> str:
    """Why opening ``url`` failed, with what to do where there is something to do.

    Some failures carry no text of their own (a plain ws:// server resets a TLS ClientHello: an
    empty ConnectionResetError), so the exception's type is always named.
    """
    reason = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
    if isinstance(exc, ssl_module.SSLCertVerificationError):
        return (
            f"the server's certificate is not trusted ({exc.verify_message}). For a server with a "
            "self-signed certificate, pin the SHA-256 fingerprint it printed with fingerprint=<sha256>, "
            "or pass its certificate as cafile="
        )
    if url.lower().startswith("wss://") and isinstance(exc, ssl_module.SSLError | ConnectionResetError):
        return (
            f"the TLS handshake failed ({reason}); is this a plain ws:// server? "
            "Then connect with ws:// instead of wss://"
        )
    if isinstance(exc, TimeoutError):
        return f"no WebSocket handshake within the open timeout ({reason}); is an m2mwire server there?"
    return reason


async def serve_websocket(
    handler: Callable[[WebSocketChannel], Awaitable[None]],
    host: str,
    port: int,
    *,
    max_message_size: int,
    ssl: ssl_module.SSLContext | None = None,
    **extra: Any,
) -> Server:
    """Start a WebSocket server calling ``handler(channel)`` once per connection."""

    async def on_connection(connection: ServerConnection) -> None:
        assert isinstance(connection, _ServerConnection)
        await handler(WebSocketChannel(connection))

    return await ws_serve(
        on_connection,
        host,
        port,
        compression=None,
        max_size=_max_size(max_message_size),
        ping_interval=None,
        write_limit=_WRITE_LIMIT,
        ssl=ssl,
        create_connection=_ServerConnection,
        **extra,
    )
