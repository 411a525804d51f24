"""What a relay between a client and a server must see of the session it carries, sans I/O.

A relay (shell/gateway.py) carries whole messages end to end and runs no session itself; it routes
a connection by the client's HELLO, so it must act as a server would until then, and it keeps
track of the session's resume route and of its end. These are those protocol rules, apart from
the asyncio that moves the bytes:

- :func:`before_hello`: what to do with a client's message before its HELLO was relayed: answer
  a PING with a PONG as a server would, drop what a server takes silently (SILENT_BEFORE_HELLO),
  relay anything else (the HELLO, or what the worker will answer with a violation, end to end).
- :func:`resumed_session`: the session id a HELLO asks to resume, if any.
- :func:`server_answer`: the server's first answer but for keepalives (PONGs to PINGs the client
  sent after its HELLO): the ACCEPT's max_payload, and the session id when it grants resume.
- :func:`is_close`: whether a relayed message is a CLOSE (the session is over: no resume).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Final

from m2mwire.codecs.utf8 import check_utf8
from m2mwire.errors import M2MError
from m2mwire.schemas.messages import (
    Capabilities,
    Decoded,
    MessageType,
    ResumeCaps,
    decode_message,
    encode_message,
)
from m2mwire.session.config import CONTROL_MESSAGE_LIMIT
from m2mwire.session.states import SILENT_BEFORE_HELLO

__all__ = [
    "CLOSE_MAX",
    "Answer",
    "Opening",
    "before_hello",
    "is_close",
    "resumed_session",
    "server_answer",
]

_KEEPALIVE: Final = frozenset({MessageType.PING, MessageType.PONG})
#: Text messages longer than this are not looked at for a CLOSE: ours are under 1 KB (reasons are
#: cut to 200 characters), and a DATA message must not be parsed on the relay's hot path.
CLOSE_MAX: Final = 4096


class Opening(enum.Enum):
    """What a relay does with a client's message before the HELLO."""

    RELAY = "relay"  # the first message to relay: the HELLO, or what the server will refuse
    ANSWER = "answer"  # a PING: send the PONG that before_hello returned, and drop the PING
    DROP = "drop"  # what a server takes silently before a HELLO


@dataclass(frozen=True, slots=True)
class Answer:
    """The server's first answer: ``max_payload`` its ACCEPT announces (None: not an ACCEPT; 0:
    none announced), ``resumable``: the session id when the ACCEPT grants or honours resume."""

    max_payload: int | None
    resumable: str | None


def _parsed(message: bytes, text: bool) -> Decoded | None:
    """``message`` parsed, when it is valid UTF-8 text of at most a control message's size (a larger
    HELLO or ACCEPT is refused end to end anyway; anything else goes on to the far end, which
    answers it as a direct peer would)."""
    if not text or len(message) > CONTROL_MESSAGE_LIMIT:
        return None
    try:
        check_utf8(message)
        return decode_message(message)
    except M2MError:
        return None


def _resume_of(decoded: Decoded | None, kind: MessageType) -> ResumeCaps | None:
    """The ``resume`` capabilities of a ``kind`` message (a resuming HELLO; an ACCEPT granting or
    honouring resume), else None."""
    caps = decoded.payload if decoded is not None and decoded.type is kind else None
    return caps.resume if isinstance(caps, Capabilities) and isinstance(caps.resume, ResumeCaps) else None


def before_hello(message: bytes, text: bool) -> tuple[Opening, bytes | None]:
    """What to do with ``message``, a client's message before its HELLO was relayed; with
    ANSWER, the PONG to send it."""
    decoded = _parsed(message, text)
    if decoded is None:
        return Opening.RELAY, None
    if decoded.type is MessageType.PING:
        return Opening.ANSWER, encode_message(MessageType.PONG, session_id=decoded.session_id)
    if decoded.type in SILENT_BEFORE_HELLO:
        return Opening.DROP, None
    return Opening.RELAY, None


def resumed_session(hello: bytes, text: bool) -> str | None:
    """The session id that ``hello`` (the first message before_hello relays) asks to resume."""
    asked = _resume_of(_parsed(hello, text), MessageType.HELLO)
    return asked.session_id if asked is not None else None


def server_answer(message: bytes, text: bool) -> Answer | None:
    """``message`` is the server's first answer to a relayed HELLO: what the relay must know of
    it; None for a keepalive (PINGs and PONGs a server may send while admission runs): look at
    the next one."""
    decoded = _parsed(message, text)
    if decoded is None:
        return Answer(None, None)
    if decoded.type in _KEEPALIVE:
        return None
    limit: int | None = None
    if decoded.type is MessageType.ACCEPT:
        caps = decoded.payload
        limit = caps.compression.max_payload if isinstance(caps, Capabilities) else 0
    granted = _resume_of(decoded, MessageType.ACCEPT) is not None
    return Answer(limit, decoded.session_id if granted else None)


def is_close(message: bytes, text: bool) -> bool:
    """Whether ``message``, relayed either way, is a CLOSE. Only a text message of at most
    CLOSE_MAX bytes that holds ``"CLOSE"`` or a JSON escape is parsed: a CLOSE's type string is
    either written plainly or with a \\u escape, so nothing else can be one."""
    if not text or len(message) > CLOSE_MAX or (b'"CLOSE"' not in message and b"\\u" not in message):
        return False
    decoded = _parsed(message, text)
    return decoded is not None and decoded.type is MessageType.CLOSE
