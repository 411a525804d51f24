"""``serve()`` and ``Server``: accept connections, run a session and the application's handler on each.

The server drives its sessions only through :class:`~m2mwire.shell.hosting.HostedSession`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import uuid
from collections.abc import Awaitable, Callable
from typing import Any, Unpack

from m2mwire import tracing
from m2mwire.admission import Admission
from m2mwire.errors import ConfigError, M2MError, SessionRejected
from m2mwire.lifecycle import Listening
from m2mwire.options import ServeOptions, parse_url, split_options
from m2mwire.schemas.codes import SessionCode
from m2mwire.session.budget import DecodeBudgets, peer_key
from m2mwire.session.config import CONTROL_MESSAGE_LIMIT
from m2mwire.session.core import SessionProtocol
from m2mwire.session.events import ResumeRequested, Stats
from m2mwire.session.resumption import (
    ENDED_WHILE_WAITING,
    SUPERSEDED,
    EndedSessions,
    replay_delay,
    resume_refusal,
)
from m2mwire.session.states import Role
from m2mwire.shell.hosting import HostedSession
from m2mwire.shell.serverstats import ServerStats, add_stats
from m2mwire.shell.session import HandedOver, ServerSide, Session
from m2mwire.shell.warmup import warm_tokenizers
from m2mwire.transport.base import Channel, TransportConfig

__all__ = ["Handler", "Server", "ServerStats", "serve"]

log = logging.getLogger("m2mwire.session")

Handler = Callable[[Session], Awaitable[None]]


class Server(Listening):
    """A running m2mwire server (WebSocket or QUIC). Use as ``async with serve(...) as server``."""

    def __init__(self, handler: Handler, url: str, options: dict[str, Any]) -> None:
        self._handler = handler
        super().__init__(parse_url(url))
        options = dict(options)
        if "token" in options:
            raise ConfigError(
                "token= is a connect() option (the client's credential); serve() checks it with on_hello="
            )
        self._admission = Admission(
            options.pop("on_hello", None),
            max_sessions=options.pop("max_sessions", None),
            max_sessions_per_peer=options.pop("max_sessions_per_peer", None),
        )
        self._config, self._topts = split_options(options, "serve", self._endpoint)
        self._active: set[str] = set()
        self._sessions: set[HostedSession] = set()
        self._resumable: dict[str, HostedSession] = {}  # established sessions that negotiated resume
        self._ended_ids = EndedSessions()  # recently ended resumable sessions: id -> how
        # The decode time each peer address may take beyond the free allowance, shared by its
        # sessions (session/budget.py). Over NATS the address is what the client says it is, so
        # all NATS sessions share one: NATS credentials are the trust boundary there.
        self._budgets = DecodeBudgets()
        self._ended = Stats()  # sums over sessions that have ended
        self._opened = self._refused = 0
        self._handler_tasks: set[asyncio.Task[Any]] = set()
        # Resuming connections waiting for their session's replay budget (see _resume).
        self._waiting_resumes: dict[str, tuple[HostedSession, asyncio.TimerHandle]] = {}

    @property
    def active_sessions(self) -> int:
        return len(self._sessions)

    @property
    def stats(self) -> ServerStats:
        """Counts and byte/message sums over this server's sessions (a snapshot)."""
        totals = Stats()
        add_stats(totals, self._ended)
        for session in self._sessions:
            add_stats(totals, session.stats)
        return ServerStats(len(self._sessions), self._opened, self._refused, totals)

    def _new_session_id(self) -> str:
        # Unique among this server's live sessions (uuid4 collisions are only theoretical).
        while True:
            sid = str(uuid.uuid4())
            if sid not in self._active:
                self._active.add(sid)
                return sid

    async def _run_session(self, channel: Channel) -> None:
        address, network = (
            ("nats", None) if self._endpoint.scheme == "nats" else peer_key(channel.remote_address)
        )
        budget = self._budgets.for_peer(address, asyncio.get_running_loop().time(), network)
        admission = self._admission
        protocol = SessionProtocol(
            Role.SERVER, self._config, session_id_factory=self._new_session_id, admission=admission.active
        )
        session: HostedSession = ServerSide(channel, protocol, admission, self._resume, budget)
        self._sessions.add(session)
        task = asyncio.current_task()
        if task is not None:
            self._handler_tasks.add(task)  # aclose() cancels a handler that ignores the shutdown
        try:
            try:
                info = await session.handshake()
            except HandedOver:
                # The connection now carries the resumed session, which is counted and closed
                # as itself: this handle only waits for the connection's end.
                self._sessions.discard(session)
                await session.wait_channel_released()
                return
            except M2MError as exc:
                if isinstance(exc, SessionRejected):
                    self._refused += 1
                log.info("session from %s not established: %s", channel.remote_address, exc)
                return
            self._opened += 1
            if session.resumable:
                self._resumable[info.session_id] = session
            await warm_tokenizers(info, self._config)
            try:
                with tracing.use(session.span):  # the handler's own spans join the session's trace
                    await self._handler(session.session)
            except M2MError as exc:
                if session.closed is None:
                    raise  # not the session's end: the handler's own failure
                # The session ended under the handler (peer gone, timeout, ...): not a server bug.
                log.info("session %s ended in handler: %s", info.session_id, exc)
            await session.close("")
        except Exception as exc:
            log.exception("session handler failed for session %s", session.session_id or "-")
            # Tell the peer the session failed (not a clean end): CLOSE INTERNAL_ERROR, then 1011.
            await session.close(
                f"the server's handler failed ({type(exc).__name__})", SessionCode.INTERNAL_ERROR
            )
        finally:
            self._forget_resumable(session)
            if task is not None:
                self._handler_tasks.discard(task)
            self._sessions.discard(session)
            add_stats(self._ended, session.stats)
            if session.session_id is not None:
                self._active.discard(session.session_id)
            await session.shutdown()

    def _forget_resumable(self, session: HostedSession) -> None:
        sid = session.session_id
        if sid is None or self._resumable.get(sid) is not session:
            return
        del self._resumable[sid]
        closed = session.closed
        self._ended_ids.record(sid, closed.code if closed is not None else SessionCode.NORMAL)

    def _resume(self, fresh: HostedSession, request: ResumeRequested) -> None:
        """A fresh connection's HELLO resumes ``request.session_id``: move the connection to that
        session, or answer REJECT with why not (session/resumption.py decides which)."""
        target = self._resumable.get(request.session_id)
        live = target is not None and target.closed is None
        refusal = resume_refusal(
            live=live,
            ended=None if live else self._ended_ids.get(request.session_id),
            token_ok=target is not None and live and target.resume_token_matches(request.token),
            accepts=target is not None and live and target.accepts_resume,
            resume_window=self._config.resume_window,
        )
        if refusal is not None:
            fresh.refuse_resume(*refusal)
            return
        assert target is not None
        waiting = self._waiting_resumes.pop(request.session_id, None)
        if waiting is not None:  # the client gave up on that connection: only the newest counts
            older, handle = waiting
            handle.cancel()
            older.refuse_resume(*SUPERSEDED)
        # After the token check: the resume's count acknowledges (and releases) retained messages.
        delay = replay_delay(target.replay_wait(request.received), self._config.timers.hello_timeout)
        if delay <= 0:
            target.take_over(fresh.session, request.received)
            return
        handle = asyncio.get_running_loop().call_later(delay, self._resume_after_wait, fresh, request)
        self._waiting_resumes[request.session_id] = (fresh, handle)

    def _resume_after_wait(self, fresh: HostedSession, request: ResumeRequested) -> None:
        self._waiting_resumes.pop(request.session_id, None)
        if not fresh.awaiting_resume:  # its connection ended meanwhile
            return
        target = self._resumable.get(request.session_id)
        if target is None or not target.accepts_resume:
            fresh.refuse_resume(*ENDED_WHILE_WAITING)
            return
        target.take_over(fresh.session, request.received)

    def close(self) -> None:
        """Stop taking new sessions (what is running goes on, and can still resume; see ``aclose()``)."""
        self._admission.closing = True
        super().close()

    async def start(self) -> Server:
        # Until a session is established only control messages arrive (see transport_limit).
        await self._listen(self._run_session, TransportConfig(CONTROL_MESSAGE_LIMIT, self._topts))
        return self

    async def aclose(self) -> None:
        """Close every live session (CLOSE handshake), then stop the listener and wait for it.

        Takes at most about ``close_timeout`` + 1.6 s: sessions close concurrently (each within
        close_timeout, + 0.5 s), handlers get 0.1 s to return, then one still running on its
        closed session is cancelled (and awaited up to 1 s).
        Sessions go first: a QUIC server's close ends its connections at once, which would cut
        the CLOSE exchange short.
        """
        timeout = self._config.timers.close_timeout
        for _, handle in self._waiting_resumes.values():
            handle.cancel()  # their connections close with the listener
        self._waiting_resumes.clear()
        closing = [s.close("server shutting down", wait_resume=False) for s in list(self._sessions)]
        if closing:
            # Session.close() bounds itself; this only guards the sum of its steps.
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(timeout + 0.5):
                    await asyncio.gather(*closing, return_exceptions=True)
        # Handlers get a moment to notice their session ended; one that ignores it is cancelled,
        # otherwise the listener's wait_closed() would wait for it forever.
        handlers = [t for t in self._handler_tasks if not t.done()]
        if handlers:
            _, pending = await asyncio.wait(handlers, timeout=0.1)
            for task in pending:
                task.cancel()
            if pending:
                await asyncio.wait(pending, timeout=1.0)
        self.close()
        await self.wait_closed()


def serve(handler: Handler, url: str, **options: Unpack[ServeOptions]) -> Server:
    """Serve sessions: ``async with m2mwire.serve(handler, "ws://127.0.0.1:0") as server: ...``.

    ``handler(session)`` runs once per established session; when it returns, the session is closed.
    Same session options as :func:`connect`; transport options: ssl (wss://), certfile/keyfile (TLS
    for wss:// and quic://; without them a self-signed certificate is generated and its
    fingerprint logged and exposed as ``server.fingerprint``), cert_dir (wss:// and quic://: where
    that generated certificate is kept, so its fingerprint survives restarts; by default in the
    per-user state directory, ``$M2MWIRE_STATE_DIR``, else ``$XDG_STATE_HOME/m2mwire``, else
    ``~/.local/state/m2mwire``, under ``certs/<host>/``; ``cert_dir=False``: in memory only, a new
    fingerprint at every start), idle_timeout (QUIC, default 20 s).

    Resume (docs/PROTOCOL.md "Resume"): a client that connected with ``reconnect=`` and lost its
    connection may come back within ``resume_window`` seconds (default 60; 0 turns resume off);
    meanwhile the handler's ``recv()`` waits and its ``send()`` retains up to
    ``resume_buffer_bytes`` (default 16 MiB), then waits. After the window ``recv()`` raises
    ``SessionClosed(code="RESUME_EXPIRED")``.
    """
    return Server(handler, url, dict(options))
