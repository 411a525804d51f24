"""Session states and the one table of which messages each (role, state) expects.

Like h11's ``EVENT_TRIGGERED_TRANSITIONS``, the rules about *when* a message may arrive live here
in one place, apart from what each message does (the handlers of :mod:`m2mwire.session.core`).
A message that the table does not expect never reaches its handler: :func:`unexpected` names the
violation (docs/PROTOCOL.md §3) or, for ACK, says to ignore it.
"""

from __future__ import annotations

from collections.abc import Mapping
from enum import Enum
from itertools import product
from typing import Final, Literal

from m2mwire.schemas.codes import SessionCode, Violation
from m2mwire.schemas.messages import MessageType

__all__ = ["BINARY", "Inbound", "Role", "State", "expected", "unexpected"]


class State(Enum):
    INITIAL = "INITIAL"
    HELLO_SENT = "HELLO_SENT"
    ESTABLISHED = "ESTABLISHED"
    CLOSE_RECEIVED = "CLOSE_RECEIVED"  # the peer closed; our acknowledgement waits for the application
    CLOSING = "CLOSING"
    CLOSED = "CLOSED"


class Role(Enum):
    CLIENT = "client"
    SERVER = "server"


# A binary frame (DATA in binary form: TokenNative, M2M v1, AVP, zstd): it has no message type.
BINARY: Final = "binary frame"
Inbound = MessageType | Literal["binary frame"]

_HELLO, _ACCEPT, _REJECT = MessageType.HELLO, MessageType.ACCEPT, MessageType.REJECT
_DATA, _ACK = MessageType.DATA, MessageType.ACK
# PING is answered and CLOSE acknowledged in every state; a PONG is welcome at any time.
_ALWAYS: frozenset[Inbound] = frozenset({MessageType.PING, MessageType.PONG, MessageType.CLOSE})
# Once the session exists, until the peer's CLOSE: DATA arriving after we sent CLOSE is delivered.
_SESSION: frozenset[Inbound] = _ALWAYS | {_DATA, _ACK, BINARY}

# (role, state) -> the messages expected there. CLOSED expects nothing: input is then ignored.
_TABLE: Mapping[tuple[Role, State], frozenset[Inbound]] = {
    (Role.SERVER, State.INITIAL): _ALWAYS | {_HELLO},
    (Role.CLIENT, State.INITIAL): _ALWAYS,
    (Role.CLIENT, State.HELLO_SENT): _ALWAYS | {_ACCEPT, _REJECT},
    (Role.SERVER, State.ESTABLISHED): _SESSION,
    (Role.CLIENT, State.ESTABLISHED): _SESSION,
    (Role.SERVER, State.CLOSING): _SESSION,
    (Role.CLIENT, State.CLOSING): _SESSION,
    (Role.SERVER, State.CLOSE_RECEIVED): _ALWAYS,
    (Role.CLIENT, State.CLOSE_RECEIVED): _ALWAYS,
}

# Two handshakes run inside a state rather than as states of their own (the shell and the
# application see only the states above): a server holding a HELLO for its admission verdict
# expects no second HELLO, and a client whose resuming HELLO awaits an answer expects ACCEPT or
# REJECT whatever state the session reached meanwhile.


def _with_handshakes() -> dict[tuple[Role, State, bool, bool], frozenset[Inbound]]:
    table: dict[tuple[Role, State, bool, bool], frozenset[Inbound]] = {}
    for role, state, verdict_pending, resuming in product(Role, State, (False, True), (False, True)):
        kinds = _TABLE.get((role, state), frozenset())  # CLOSED, and HELLO_SENT for a server
        if verdict_pending:
            kinds -= {_HELLO}
        if resuming and state is not State.CLOSED:
            kinds |= {_ACCEPT, _REJECT}
        table[(role, state, verdict_pending, resuming)] = kinds
    return table


_EXPECTED = _with_handshakes()

# The core's per-message path takes DATA and binary frames in ESTABLISHED without looking here.
assert all(_DATA in _TABLE[(r, State.ESTABLISHED)] and BINARY in _TABLE[(r, State.ESTABLISHED)] for r in Role)


def expected(role: Role, state: State, *, verdict_pending: bool, resuming: bool) -> frozenset[Inbound]:
    """The messages a session in ``state`` expects (one dict lookup)."""
    return _EXPECTED[(role, state, verdict_pending, resuming)]


# What a server takes before a HELLO without a word or a violation (docs/PROTOCOL.md §3): a PONG
# (welcome at any time), an ACK (unexpected() ignores it) and a message of a type it does not know
# (None: ignored in every state). A PING it answers; anything else ends the connection. A gateway
# that routes a connection by its HELLO looks past these (session/relay.py);
# tests/session/test_states.py checks the set against the core.
SILENT_BEFORE_HELLO: Final[frozenset[MessageType | None]] = frozenset({MessageType.PONG, _ACK, None})


def unexpected(role: Role, state: State, kind: Inbound) -> Violation | None:
    """What a message that ``expected()`` does not list is: the violation that closes the session
    (docs/PROTOCOL.md §3), or None for an ACK, which is ignored (resume may be off on this end)."""
    if state is State.CLOSE_RECEIVED and (kind == BINARY or kind is _DATA):
        # The session existed: "before HELLO/ACCEPT" would misname it.
        return Violation(SessionCode.UNEXPECTED_MESSAGE, f"{kind} after the peer's CLOSE")
    if kind == BINARY:
        return Violation(SessionCode.BINARY_BEFORE_ACCEPT, "binary frame before the session was established")
    if kind is _DATA:
        if role is Role.SERVER:
            return Violation(
                SessionCode.DATA_BEFORE_HELLO, "DATA before HELLO: no session is established yet"
            )
        return Violation(SessionCode.DATA_BEFORE_ACCEPT, "DATA before ACCEPT: no session is established yet")
    if kind is _ACK:
        return None
    return Violation(SessionCode.UNEXPECTED_MESSAGE, f"unexpected {kind} in state {state.value}")
