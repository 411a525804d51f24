"""The websockets internals the WebSocket transport relies on, in one place, checked at import.

The transport uses websockets' documented API where there is one: ``connect``/``serve`` with the
``create_connection`` hook (our connection subclasses), the Sans-I/O protocol's ``send_text``,
``send_binary``, ``fail``, ``state`` and ``close_exc``, and asyncio's protocol callbacks
(``data_received``, ``pause_writing``, ...). Five things have no documented API, and are done here
and nowhere else:

- data frames are taken from the connection's ``process_event`` (a private method) and handed to
  the session, instead of going through websockets' message queue and a reader task: that saves
  an event-loop hop per message (:class:`DataFrameHook`);
- the protocol's stream reader is replaced by our copy-saving ``ChunkReader`` before any byte
  arrives, which means restarting the parser generator on it (:func:`install_reader`);
- frames the protocol has queued are written out with the connection's ``send_data`` (private),
  and the incoming size limit is the protocol's ``max_message_size`` attribute (undocumented);
- a pinned certificate is checked in an override of the client's ``handshake`` (private), the one
  moment between the TLS handshake and the HTTP upgrade request (:class:`PinBeforeHandshake`);
- whole final data frames are read and written by ``wsframes`` instead of websockets' frame
  parser and serializer when the protocol's state (open, parser between frames, no fragmented
  message either way, no debug logging) makes that exact: received ones in
  ``DataFrameHook.data_received``, sent ones queued in the protocol's ``writes`` by
  :func:`send_data_frame`.

Each was read against websockets :data:`VERIFIED_MINOR`. Importing this module with another
version, or with one of these names missing, raises :class:`m2mwire.errors.UnsupportedDependency`
naming the supported versions: an upgrade fails loudly instead of silently losing a bound (the
fragment budget, the reply backlog) or a fast path.
"""

from __future__ import annotations

import asyncio
from typing import Any, cast

import websockets.utils
from websockets.asyncio.client import ClientConnection
from websockets.asyncio.connection import Connection
from websockets.frames import Frame, Opcode
from websockets.protocol import Protocol, Side, State
from websockets.server import ServerProtocol
from websockets.streams import StreamReader

from m2mwire.transport.pinned import Pinned
from m2mwire.transport.wsframes import data_frame, parse_data_frames

__all__ = [
    "VERIFIED_MINOR",
    "DataFrameHook",
    "PinBeforeHandshake",
    "StreamReader",
    "check_attributes",
    "check_version",
    "flush",
    "get_max_message_size",
    "install_reader",
    "required_attributes",
    "send_data_frame",
    "set_max_message_size",
]

# The websockets minor version this module was read against and the test suite run with; pyproject
# pins the same range.
VERIFIED_MINOR = (17, 4)
PIN = Pinned("websockets", VERIFIED_MINOR, "WebSocket")
check_version = PIN.check_version


def required_attributes() -> list[tuple[str, object, tuple[str, ...]]]:
    """(what, object, names it must have) for every websockets name used here or in the transport
    without documentation. Instance attributes are looked up on fresh instances (made without a
    connection or an event loop)."""
    return [
        (
            "websockets.asyncio.connection.Connection",
            Connection,
            ("process_event", "send_data", "data_received", "pause_writing", "resume_writing"),
        ),
        ("websockets.asyncio.client.ClientConnection", ClientConnection, ("handshake",)),
        ("websockets.protocol.Protocol", Protocol, ("parse", "send_frame")),
        # Set in Protocol.__init__: only an instance has them.
        (
            "a websockets.server.ServerProtocol",
            ServerProtocol(),
            (
                "reader",
                "parser",
                "max_message_size",
                "max_fragment_size",
                "current_size",
                "expect_continuation_frame",
                "writes",
                "debug",
                "side",
                "extensions",
            ),
        ),
        # wsframes masks with websockets' own function (C where built)
        ("websockets.utils", websockets.utils, ("apply_mask",)),
        (
            "websockets.streams.StreamReader",
            StreamReader,
            ("read_line", "read_exact", "read_to_eof", "at_eof", "feed_data", "feed_eof", "discard"),
        ),
        ("a websockets.streams.StreamReader", StreamReader(), ("eof",)),
    ]


check_attributes = PIN.check_attributes


check_version()
check_attributes(required_attributes())

# Enum member reads cost ~0.12 us on Python 3.11: these run for every frame.
_DATA_OPCODES = frozenset((Opcode.TEXT, Opcode.BINARY, Opcode.CONT))
_OPEN = State.OPEN
_SERVER, _CLIENT = Side.SERVER, Side.CLIENT


class DataFrameHook:
    """Mixin (before a websockets asyncio ``Connection`` in the bases): data frames go to
    ``m2m_data_frame`` instead of websockets' message queue; every other event (the handshake,
    PINGs, PONGs, close frames) is websockets' own business.

    Received bytes that start with whole, final text or binary frames, arriving while the protocol
    is open and its parser waits between frames (the common case: each read holds whole small
    messages), skip websockets' parser altogether: ``wsframes.parse_data_frames`` hands their
    payloads to ``m2m_deliver`` (~60 bytecodes a message instead of ~550), and websockets parses
    the rest. That is exact because such frames change no protocol state (no fragment in progress,
    no extension, nothing to answer) and websockets' parser is left where it was, between frames.
    """

    protocol: Protocol

    def m2m_data_frame(self, frame: Frame) -> None:
        raise NotImplementedError

    def m2m_deliver(self, data: bytes, text: bool) -> None:
        """One whole received message: its payload and whether it is text."""
        raise NotImplementedError

    def process_event(self, event: Any) -> None:
        if type(event) is Frame and event.opcode in _DATA_OPCODES:
            self.m2m_data_frame(event)
        else:
            super().process_event(event)  # type: ignore[misc]

    def data_received(self, data: bytes) -> None:
        protocol = self.protocol
        if (
            cast(Any, protocol.reader).waiting_for_frame  # a ChunkReader: see install_reader
            and protocol.state is _OPEN
            and protocol.current_size is None
            and not protocol.debug
            and protocol.max_fragment_size is None
            and type(data) is bytes
        ):
            done = parse_data_frames(
                data, protocol.side is _SERVER, protocol.max_message_size, self.m2m_deliver
            )
            if done:
                if done == len(data):
                    return
                data = data[done:]
        super().data_received(data)  # type: ignore[misc]


def send_data_frame(protocol: Protocol, data: bytes | bytearray | memoryview, text: bool) -> None:
    """``protocol.send_text(data)`` (``text``) or ``send_binary(data)`` on an open protocol: the
    frame is queued for ``data_to_send()`` alike, built by ``wsframes.data_frame`` when websockets'
    own path would do nothing more (no fragmented message in progress, no debug logging; we never
    negotiate extensions), which is ~40 bytecodes instead of ~200."""
    if protocol.expect_continuation_frame or protocol.debug:
        if text:
            protocol.send_text(data)
        else:
            protocol.send_binary(data)
        return
    protocol.writes.append(data_frame(data, text, protocol.side is _CLIENT))


class QuietAfterAbort:
    """Mixin (before a websockets asyncio ``Connection``): output queued once the transport is
    closing is dropped instead of written. Resume aborts a connection from inside the session's
    message callback; websockets then still answers the frames left in the same read (PINGs, a
    close) and our batched frames are flushed at the end of the loop turn, and asyncio drops each
    of those writes, logging the WARNING "socket.send() raised exception." from the fifth on:
    noise on every reconnect, for bytes that could never arrive."""

    transport: asyncio.Transport
    protocol: Protocol

    def send_data(self) -> None:
        if self.transport.is_closing():
            self.protocol.data_to_send()  # discarded: the connection is gone or going
            return
        super().send_data()  # type: ignore[misc]


class PinBeforeHandshake:
    """Mixin (before ``ClientConnection``): ``m2m_before_handshake`` runs after the TLS handshake
    and before the HTTP upgrade request is written. websockets' ``connect()`` aborts the connection
    on an exception from it and re-raises that exception."""

    def m2m_before_handshake(self) -> None:
        raise NotImplementedError

    async def handshake(self, *args: Any, **kwargs: Any) -> None:
        self.m2m_before_handshake()
        await super().handshake(*args, **kwargs)  # type: ignore[misc]


def install_reader(protocol: Protocol, reader: StreamReader) -> None:
    """Make ``protocol`` read through ``reader``; only before any byte was received. The parser
    websockets primed holds the old reader's methods, so it is restarted on the new one."""
    protocol.reader = reader
    protocol.parser = protocol.parse()
    next(protocol.parser)


def flush(connection: Connection | DataFrameHook) -> None:
    """Write what the protocol has queued (frames, a close) to the connection's transport."""
    cast(Connection, connection).send_data()


def get_max_message_size(protocol: Protocol) -> int | None:
    """The incoming message size limit (None: none)."""
    return protocol.max_message_size


def set_max_message_size(protocol: Protocol, size: int | None) -> None:
    """Change the incoming message size limit; it applies from the next frame on."""
    protocol.max_message_size = size
