"""What a :class:`~m2mwire.shell.server.Server` needs of a session it hosts, and nothing more.

The server starts the handshake, runs the application's handler on the public ``Session``, moves a
resuming client's connection to the session it resumes, and ends and forgets sessions. Everything
else of the session (its protocol core, channel, tasks) stays private to
:mod:`m2mwire.shell.session`, whose ``ServerSide`` implements this interface.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

from m2mwire.schemas.codes import SessionCode

if TYPE_CHECKING:
    from m2mwire.session.events import Closed, SessionInfo, Stats
    from m2mwire.shell.session import Session

__all__ = ["HostedSession"]


class HostedSession(Protocol):
    @property
    def session(self) -> Session:
        """The public session the application's handler gets."""
        ...

    @property
    def session_id(self) -> str | None:
        """Set once the server has assigned it (at ACCEPT); None before."""
        ...

    @property
    def resumable(self) -> bool:
        """The session negotiated resume: a client may come back to it on a new connection."""
        ...

    @property
    def closed(self) -> Closed | None:
        """How the session ended, once it has."""
        ...

    @property
    def stats(self) -> Stats: ...

    @property
    def span(self) -> Any:
        """The session's tracing span (None unless tracing is on), for the handler's own spans."""
        ...

    async def handshake(self) -> SessionInfo:
        """Run the handshake. Raises SessionRejected, another M2MError, or ``HandedOver`` (the
        connection resumed another session: see :meth:`wait_channel_released`)."""
        ...

    async def wait_channel_released(self) -> None:
        """After ``HandedOver``: until the resumed session stops using this connection."""
        ...

    async def close(self, reason: str, code: str = SessionCode.NORMAL, *, wait_resume: bool = True) -> None:
        """CLOSE with ``code`` (e.g. INTERNAL_ERROR when the handler failed), bounded in time."""
        ...

    async def shutdown(self) -> None:
        """Release everything: channel, tasks, timers, and the session's admission slot."""
        ...

    @property
    def accepts_resume(self) -> bool:
        """A resuming client may take this session over now (established: not closing)."""
        ...

    @property
    def awaiting_resume(self) -> bool:
        """This fresh connection still waits for the answer to its resuming HELLO."""
        ...

    def replay_wait(self, peer_received: int) -> float:
        """Seconds a resume at ``peer_received`` should wait for its replay (0: at once)."""
        ...

    def refuse_resume(self, code: str, message: str) -> None:
        """Answer this fresh connection's resuming HELLO with REJECT ``code``."""
        ...

    def resume_token_matches(self, token: str) -> bool: ...

    def take_over(self, fresh: Session, peer_received: int) -> None:
        """Continue this session on ``fresh``'s connection (its HELLO resumed this session)."""
        ...
