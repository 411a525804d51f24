"""What a session tells its shell and its application: the negotiated :class:`SessionInfo`, the
:class:`Stats` counters, and the events :meth:`SessionProtocol.next_event` returns (h11's
``_events``, here for the session protocol of :mod:`m2mwire.session.core`)."""

from __future__ import annotations

from dataclasses import dataclass, field

from m2mwire.codecs import Algorithm, Encoding
from m2mwire.errors import M2MError, SessionClosed
from m2mwire.schemas.messages import Capabilities
from m2mwire.session.states import Role

__all__ = [
    "Closed",
    "Detached",
    "Established",
    "Event",
    "HelloReceived",
    "ResumeRequested",
    "Resumed",
    "SessionInfo",
    "Stats",
    "closed_error",
]


@dataclass(frozen=True, slots=True)
class SessionInfo:
    """The negotiated session, as both ends agreed on it."""

    session_id: str
    role: Role
    algorithms: tuple[Algorithm, ...]
    encoding: Encoding
    mode: str  # "LATENT" or "JSON"
    mode_reason: str
    avp_map_id: str
    max_payload: int
    peer_agent_id: str
    peer_agent_type: str
    peer_version: str
    zstd_window: int = 0  # the agreed zstd window in bytes; 0 when zstd was not negotiated
    zstd_dictionary: str = ""  # SHA-256 (hex) of the shared zstd dictionary in use, if any
    zstd_history: bool = False  # zstd shares history across directions (binary kind 0x48)
    binary_text: bool = False  # large text DATA may travel in binary form (kind 'T'), both ways


@dataclass(slots=True)
class Stats:
    """Counters for one session; token counts are filled only with ``token_stats=True``."""

    messages_sent: int = 0
    messages_received: int = 0
    original_bytes_sent: int = 0
    wire_bytes_sent: int = 0
    original_bytes_received: int = 0
    wire_bytes_received: int = 0
    original_tokens_sent: int = 0
    wire_tokens_sent: int = 0
    original_tokens_received: int = 0  # text DATA received (token_stats=True)
    wire_tokens_received: int = 0  # their wire strings (token_stats=True; binary zstd: as #ZS| text)
    by_algorithm: dict[str, int] = field(default_factory=dict)
    reconnects: int = 0  # connections this session resumed on (reconnect/resume)
    retransmitted: int = 0  # DATA sent again after a resume (not DATA first sent by the replay)
    ping_rtt: float | None = None  # seconds from our last answered PING to its PONG

    @property
    def saving(self) -> float:
        """Share of the bytes saved on the wire, both directions: 1 - wire / original (0 when
        nothing was sent; negative when the wire forms were larger)."""
        original = self.original_bytes_sent + self.original_bytes_received
        wire = self.wire_bytes_sent + self.wire_bytes_received
        return 1.0 - wire / original if original else 0.0


# Events returned by next_event()


@dataclass(frozen=True, slots=True)
class Established:
    info: SessionInfo


@dataclass(frozen=True, slots=True)
class Closed:
    """The session is over. ``error`` is None for an orderly close."""

    code: str
    reason: str
    by_peer: bool
    error: M2MError | None = None


@dataclass(frozen=True, slots=True)
class HelloReceived:
    """Server side, with admission on: a HELLO that negotiation accepted waits for the shell's
    verdict, :meth:`SessionProtocol.admit` or :meth:`SessionProtocol.refuse`. ``hello`` is the
    client's capabilities (its ``token``, agent id and type, offers)."""

    hello: Capabilities


@dataclass(frozen=True, slots=True)
class Detached:
    """The connection is gone (or dead: PONGs missed) but the session can still be resumed: the
    shell drops the channel; a client reconnects and calls :meth:`SessionProtocol.begin_resume`,
    a server waits (``resume_window``) for the client to come back."""

    reason: str


@dataclass(frozen=True, slots=True)
class ResumeRequested:
    """Server, on a fresh connection: its HELLO resumes ``session_id``. The shell finds that
    session, checks ``token`` against it (:meth:`SessionProtocol.resume_token_matches`) and moves
    this connection to it (:meth:`SessionProtocol.attach`), or answers
    :meth:`SessionProtocol.refuse_resume` here."""

    session_id: str
    token: str
    received: int


@dataclass(frozen=True, slots=True)
class Resumed:
    """The session runs on a new connection; ``retransmitted`` DATA messages are to be sent again
    (the replay sends them as the connection takes them: ``Stats.retransmitted`` counts those sent)."""

    retransmitted: int


Event = Established | Closed | HelloReceived | Detached | ResumeRequested | Resumed


def closed_error(event: Closed, *, handshake: bool = False) -> M2MError:
    """The exception that send() and recv() raise once the session is over (the same for both).

    A fresh copy each time: raising attaches a traceback, whose frames would keep the session
    alive through the stored error (a reference cycle only the garbage collector breaks).
    """
    error = event.error
    if error is not None and (handshake or not isinstance(error, SessionClosed)):
        fresh = type(error).__new__(type(error), *error.args)  # no __init__: kw-only fields vary
        fresh.__dict__.update(error.__dict__)
        fresh.__cause__ = error.__cause__
        return fresh
    closed = SessionClosed(
        f"session closed ({event.code}{': ' + event.reason if event.reason else ''})",
        code=event.code,
        reason=event.reason,
    )
    if error is not None:
        closed.__cause__ = error.__cause__
    return closed
