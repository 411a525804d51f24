"""The contract between the session layer and a transport.

A transport only moves whole messages of two kinds: text (``str``, carrying JSON envelopes) and
binary (``bytes``, carrying TokenNative binary and AVP frames). It knows nothing about sessions.
Each transport (WebSocket, QUIC) provides a :class:`Channel` per session.
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
    "OutgoingMessage",
    "PushChannel",
    "TransportConfig",
]

Message = str | bytes
# A binary message may be handed over as a list of buffers (e.g. header, metadata, tensor view) so
# the sender never concatenates large payloads; the receiver always gets one ``bytes``.
OutgoingMessage = str | Buffer | Sequence[Buffer]


@runtime_checkable
class Channel(Protocol):
    """One ordered, reliable, bidirectional message channel for one session."""

    @property
    def max_message_size(self) -> int:
        """Largest incoming message accepted, in bytes; larger ones fail the channel."""
        ...

    def set_max_message_size(self, size: int) -> None:
        """Change the incoming limit (the session sets it from the negotiated max_payload)."""
        ...

    @property
    def remote_address(self) -> str:
        """Printable peer address, for logs."""
        ...

    async def send(self, message: OutgoingMessage) -> None:
        """Send one message. Waits while the peer or the network is slow (backpressure).

        Raises :class:`m2mwire.errors.TransportError` when the channel is closed.
        """
        ...

    async def recv(self) -> Message:
        """Receive the next message, in order.

        Raises :class:`m2mwire.errors.TransportError` when the channel is closed (``clean=True`` for
        an orderly close by the peer).
        """
        ...

    async def close(self, code: int = 1000, reason: str = "") -> None:
        """Close the channel (idempotent). Other channels of the same connection are unaffected."""
        ...

    def abort(self) -> None:
        """Drop the channel at once, without a closing handshake (idempotent)."""
        ...


@runtime_checkable
class PushChannel(Channel, Protocol):
    """A channel that can hand received messages to a callback, saving a reader task.

    ``start_push`` delivers every message, in order, including any received before the call;
    ``on_lost`` is called once when the channel is gone. ``pause_reading``/``resume_reading``
    stop and restart reading from the network (the session's backpressure).
    """

    def start_push(
        self, on_message: Callable[[Message], None], on_lost: Callable[[TransportError], None]
    ) -> None: ...

    def pause_reading(self) -> None: ...

    def resume_reading(self) -> None: ...


@runtime_checkable
class DirectSendChannel(Channel, Protocol):
    """A channel that can write a message synchronously when nothing would make it wait.

    ``send_now`` writes the whole message and returns True, or writes nothing and returns False
    (writing is paused by flow control, the channel is closing, ...): the caller then uses
    ``send()``, which waits or raises. It saves the session a coroutine chain per message.
    """

    def send_now(self, message: OutgoingMessage) -> bool: ...


ChannelHandler = Callable[[Channel], Awaitable[None]]


@dataclass(frozen=True, slots=True)
class TransportConfig:
    """What a transport's ``open()`` and ``listen()`` get besides the URL.

    ``max_message_size`` is the incoming limit a new channel starts with (until a session is
    established only control messages arrive: the session raises it afterwards); ``options`` are
    the call's transport options, already checked against what the transport's registration
    accepts (m2mwire.transport.registry); ``token`` is the client's credential, for transports
    that can also present it to the infrastructure in front (WebSocket: on the HTTP upgrade).
    """

    max_message_size: int
    options: Mapping[str, Any] = field(default_factory=dict)
    token: str | None = None


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
