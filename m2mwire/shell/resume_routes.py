"""Which NATS worker holds each session a gateway relays, so that a client resuming a session
through the gateway reaches that worker (docs/PROTOCOL.md §5a "Gateway"). Kept apart from
:mod:`m2mwire.shell.gateway`, which relays the messages."""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable

__all__ = ["DETACHED_ROUTES_KEPT", "ResumeRoutes"]

# Detached sessions whose worker a gateway remembers at most (~300 bytes each: ~20 MB), whatever
# the clients do; beyond it the oldest are forgotten (their resume goes to the queue group).
DETACHED_ROUTES_KEPT = 65_536


class ResumeRoutes:
    """Which worker (its NATS resume route) holds each resumable session this gateway relays.

    An entry is made only from a worker's ACCEPT on a NATS channel the gateway opened itself, for
    the route that channel's OPEN_OK named: a client can neither add an entry nor choose a route,
    only name a session id in its resuming HELLO (and the worker checks the token). *Live*
    entries belong to a running relay (one per relay, so as many as the relays); when a relay ends
    before a CLOSE passed its entry becomes *detached* for ``window`` seconds (the workers'
    ``resume_window``), at most ``limit`` of them, the oldest forgotten first.
    """

    def __init__(
        self, window: float, limit: int = DETACHED_ROUTES_KEPT, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.window = window
        self.limit = limit
        self._clock = clock
        self._live: dict[str, tuple[str, object]] = {}  # session id -> (route, the relay holding it)
        self._detached: OrderedDict[str, tuple[str, float]] = OrderedDict()  # id -> (route, expiry)

    def __len__(self) -> int:
        self._expire()
        return len(self._live) + len(self._detached)

    def find(self, session_id: str) -> str | None:
        live = self._live.get(session_id)
        if live is not None:  # its old connection not noticed lost yet (e.g. a blackholed path)
            return live[0]
        self._expire()
        detached = self._detached.get(session_id)
        return detached[0] if detached is not None else None

    def lost(self, session_id: str) -> bool:
        """The session's relay ended without its CLOSE: its route is kept for a resume."""
        return session_id not in self._live and self.find(session_id) is not None

    def attach(self, session_id: str, route: str, relay: object) -> None:
        """``relay`` carries the session now (a resumed session's new relay takes over)."""
        self._live[session_id] = (route, relay)
        self._detached.pop(session_id, None)

    def detach(self, session_id: str, relay: object, *, ended: bool) -> None:
        """``relay`` stopped carrying the session: lost (kept ``window`` seconds for a resume) or
        ``ended`` (a CLOSE passed: forgotten)."""
        live = self._live.get(session_id)
        if live is not None and live[1] is relay:
            del self._live[session_id]
            if not ended and self.window > 0:
                self._detached[session_id] = (live[0], self._clock() + self.window)
                self._detached.move_to_end(session_id)
                while len(self._detached) > self.limit:
                    self._detached.popitem(last=False)
        if ended:
            self._detached.pop(session_id, None)

    def _expire(self) -> None:
        # One window for all, entries appended in time order: the oldest expire first.
        now = self._clock()
        while self._detached:
            session_id, (_route, expiry) = next(iter(self._detached.items()))
            if expiry > now:
                return
            del self._detached[session_id]
