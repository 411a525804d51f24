"""The contract between the session layer and a transport.

A transport only moves whole messages of two kinds: text (JSON envelopes) and binary (TokenNative
binary, AVP frames, ...). Both travel as bytes plus a kind flag: a text message is its UTF-8 bytes,
handed over as received (the session validates them, once, as it parses: a transport does not
decode them to ``str`` and back). It knows nothing about sessions.
Each transport (WebSocket, QUIC, NATS, in-memory) provides a :class:`Channel` per session and a
:class:`Listener` per server, through the functions the transport registry calls.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from m2mwire.codecs.buffers import Buffer  # defined in codecs (the session retains it too); re-exported
from m2mwire.errors import TransportError

__all__ = [
    "Buffer",
    "Channel",
    "ChannelHandler",
    "DirectSendChannel",
    "Listener",
    "Message",
    "OnMessage",
    "OutgoingMessage",
    "PushChannel",
    "RoutedChannel",
    "TransportConfig",
    "relayable_close_code",
]

# A received message: one ``bytes``, with a flag saying whether it is text (UTF-8, not yet
# validated) or binary.
Message = bytes
OnMessage = Callable[[bytes, bool], None]  # (message, text)
# A message to send: its bytes, as one buffer or a list of them (e.g. header, metadata, tensor
# view, so the sender never concatenates large payloads), sent as text when ``text=True`` (then
# UTF-8, written as they are). A ``str`` is a text message too, encoded by the transport: for
# callers that hold text; the session hands bytes.
OutgoingMessage = str | Buffer | Sequence[Buffer]


@runtime_checkable
class Channel(Protocol):
    """One ordered, reliable, bidirectional message channel for one session.

    One interface, implemented by every transport: received messages are pushed to the session
    (``start_push``: no reader task, no extra loop hop), ``send_now`` writes without awaiting when
    the transport has room, and ``pause_reading``/``resume_reading`` is the one backpressure gate
    on what the peer can make us hold.
    """

    @property
    def max_message_size(self) -> int:
        """Largest incoming message accepted, in bytes; larger ones fail the channel (before the
        message is buffered)."""
        ...

    def set_max_message_size(self, size: int) -> None:
        """Change the incoming limit: the session sets it from the negotiated max_payload once it
        is established (and on each connection it resumes on), which is also how a channel knows
        its session exists (the NATS worker bounds the channels still waiting for one)."""
        ...

    @property
    def remote_address(self) -> str:
        """Printable peer address, for logs."""
        ...

    def start_push(self, on_message: OnMessage, on_lost: Callable[[TransportError], None]) -> None:
        """Deliver every received message to ``on_message(data, text)``, in order, including any
        received before the call (those synchronously, within the call); ``on_lost`` is called once
        when the channel is gone (``clean=True`` for an orderly close, with the close code and reason).
        Calling it again replaces the callbacks."""
        ...

    def pause_reading(self) -> None:
        """Stop reading from the network: what the peer sends then waits in its own flow control."""
        ...

    def resume_reading(self) -> None: ...

    def send_now(self, message: OutgoingMessage, text: bool = False) -> bool:
        """Write the whole message now and return True, or write nothing and return False
        (writing is paused by flow control, the channel is closing, ...): the caller then uses
        :meth:`send`, which waits or raises. ``text``: the bytes are a text message's UTF-8.

        Order is the caller's to keep: a channel need not refuse while a :meth:`send` of an earlier
        message still waits (the in-memory one does not), so the session calls this only when no
        send of its is in flight."""
        ...

    async def send(self, message: OutgoingMessage, text: bool = False) -> None:
        """Send one message (``text`` as for :meth:`send_now`). Waits while the peer or the
        network is slow (backpressure); cancelled while waiting, it has written nothing or the
        whole message, never part of it.

        Raises :class:`m2mwire.errors.TransportError` when the channel is closed.
        """
        ...

    async def close(self, code: int = 1000, reason: str = "") -> None:
        """Close the channel (idempotent). Other channels of the same connection are unaffected."""
        ...

    def abort(self) -> None:
        """Drop the channel at once, without a closing handshake (idempotent). ``on_lost`` may
        be called before this returns (NATS does) or on a later loop turn (QUIC, WebSocket)."""
        ...


@runtime_checkable
class RoutedChannel(Protocol):
    """A client channel whose URL does not name one server (NATS: the URL names a service, and
    its queue group hands each new channel to any worker), so a reconnecting session must be told
    how to reach the server that holds it again. ``resume_route`` (None: the URL suffices) goes,
    unread by the session, into the next ``open()``'s :attr:`TransportConfig.resume_route`;
    that ``open()`` raises :class:`m2mwire.errors.ResumeImpossible` when the route leads nowhere
    any more (the server is gone), so the session ends at once instead of retrying."""

    @property
    def resume_route(self) -> str | None: ...


# The names of the two optional halves of the interface before they became part of Channel.
PushChannel = Channel
DirectSendChannel = Channel


ChannelHandler = Callable[[Channel], Awaitable[None]]


@dataclass(frozen=True, slots=True)
class TransportConfig:
    """What a transport's ``open()`` and ``listen()`` get besides the URL.

    ``max_message_size`` is the incoming limit a new channel starts with (until a session is
    established only control messages arrive: the session raises it afterwards); ``options`` are
    the call's transport options, already checked against what the transport's registration
    accepts (m2mwire.transport.registry); ``token`` is the client's credential, for transports
    that can also present it to the infrastructure in front (WebSocket: on the HTTP upgrade);
    ``resume_route`` is set when a client reconnects to resume a session: the previous channel's
    :attr:`RoutedChannel.resume_route`.
    """

    max_message_size: int
    options: Mapping[str, Any] = field(default_factory=dict)
    token: str | None = None
    resume_route: str | None = None


class Listener(Protocol):
    """A transport's server side: ``start()`` binds and accepts, each new channel goes to the
    handler given to the transport's ``listen()`` (in a task of its own); ``close()`` stops
    accepting, ``wait_closed()`` waits for the handlers still running."""

    @property
    def url(self) -> str:
        """The URL clients connect to (with the bound port once started)."""
        ...

    @property
    def port(self) -> int:
        """The bound port (0 where the transport has none, e.g. NATS)."""
        ...

    @property
    def fingerprint(self) -> str | None:
        """SHA-256 of a generated TLS certificate, for clients to pin; None otherwise."""
        ...

    async def start(self) -> None: ...

    def close(self) -> None: ...

    async def wait_closed(self) -> None: ...


def relayable_close_code(code: int | None) -> bool:
    """Whether ``code``, from a peer's close, may be passed on in a close of the same meaning
    (a relay ends its other side as the first ended): RFC 6455 section 7.4 reserves 1004-1006
    and 1015 for reporting (1006 is how a lost connection is told), and 1000-2999 beyond the
    defined ones; 3000-4999 are applications'. The session's close codes follow RFC 6455 on
    every transport (schemas/codes.py CloseCode)."""
    return code is not None and (
        (1000 <= code <= 1014 and code not in (1004, 1005, 1006)) or 3000 <= code <= 4999
    )
