"""A server's answers to resuming HELLOs (sans-I/O, pure; docs/PROTOCOL.md §9 "Resuming").

The shell's ``Server`` holds the sessions and moves connections; what each resuming HELLO gets,
in what order the checks go, and how long a replay may make it wait are decided here, so they can
be tested without a connection. The answers tell a live id (``RESUME_REFUSED``), an ended one
(how it ended) and an unknown one (``RESUME_UNKNOWN``) apart, as §9 lists them: ids are random
UUIDs, so this confirms only ids one already knows, and a token (256 bits) is still needed to
resume.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Final

from m2mwire.schemas.codes import SessionCode

__all__ = [
    "ENDED_IDS_KEPT",
    "ENDED_WHILE_WAITING",
    "SUPERSEDED",
    "EndedSessions",
    "replay_delay",
    "resume_refusal",
]

#: Ids of ended resumable sessions a server remembers, to answer RESUME_EXPIRED rather than
#: RESUME_UNKNOWN (and say how a session ended); the oldest are forgotten past it.
ENDED_IDS_KEPT: Final = 10_000


class EndedSessions:
    """How each recently ended resumable session ended (its close code), at most ENDED_IDS_KEPT."""

    __slots__ = ("_codes",)

    def __init__(self) -> None:
        self._codes: OrderedDict[str, str] = OrderedDict()

    def record(self, session_id: str, code: str) -> None:
        self._codes[session_id] = code
        while len(self._codes) > ENDED_IDS_KEPT:  # bounded: one entry added at a time
            self._codes.popitem(last=False)

    def get(self, session_id: str) -> str | None:
        return self._codes.get(session_id)


def resume_refusal(
    *, live: bool, ended: str | None, token_ok: bool, accepts: bool, resume_window: float
) -> tuple[str, str] | None:
    """(code, message) to REJECT a resuming HELLO with, or None when it may resume.

    ``live``: the server holds the session (established, not closed); ``ended``: how it ended if
    it did recently (:class:`EndedSessions`); ``token_ok``: the HELLO's token is the session's
    (compared in constant time); ``accepts``: the session can take a connection now (no CLOSE
    sent or received). The token is checked before the state, so a wrong token learns nothing
    of the session's state."""
    if not live:
        if ended == SessionCode.RESUME_EXPIRED:
            why = f"the session waited {resume_window:g} s (resume_window) and ended"
            return SessionCode.RESUME_EXPIRED, why
        if ended is not None:
            return SessionCode.RESUME_UNKNOWN, f"the session has ended ({ended})"
        return SessionCode.RESUME_UNKNOWN, "this server does not know the session (it may have restarted)"
    if not token_ok:
        return SessionCode.RESUME_REFUSED, "wrong resume token for this session"
    if not accepts:
        # A CLOSE was sent or received: taking the session over now would hand the connection to
        # a session that cannot attach it.
        return SessionCode.RESUME_UNKNOWN, "the session is closing; open a new session"
    return None


#: The REJECT a connection still waiting to resume gets when a newer one resumes the session (the
#: client gave up on it: only the newest counts), and the one it gets if the session ended while it
#: waited.
SUPERSEDED: Final = (SessionCode.RESUME_REFUSED, "superseded by a newer connection resuming the session")
ENDED_WHILE_WAITING: Final = (
    SessionCode.RESUME_UNKNOWN,
    "the session ended while this connection waited to resume",
)


def replay_delay(replay_wait: float, hello_timeout: float) -> float:
    """How long a resuming connection waits before its replay (0: at once). The replay budget
    (resume.REPLAY_REFILL) asks for ``replay_wait``; the connection waits within its own
    handshake time, at most half of hello_timeout, so its HELLO is still answered in time."""
    return min(replay_wait, hello_timeout / 2) if replay_wait > 0 else 0.0
