"""``ServerStats``: a server's session counts and the sums of its sessions' :class:`Stats`."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from m2mwire.session.events import Stats

__all__ = ["ServerStats", "add_stats"]

# Every counter of Stats (its int fields), taken from the class: a hand-written list had left out
# reconnects and retransmitted, which stayed 0 in a server's totals.
_SUMMED_STATS = tuple(f.name for f in dataclasses.fields(Stats) if isinstance(f.default, int))


@dataclass(slots=True)
class ServerStats:
    """A server's sessions, live and ended: counts and the sums of their :class:`Stats`."""

    sessions_active: int = 0
    sessions_opened: int = 0  # established since the server started
    sessions_refused: int = 0  # HELLOs answered with REJECT (negotiation or admission)
    totals: Stats = dataclasses.field(default_factory=Stats)  # every session's Stats, summed

    @property
    def saving(self) -> float:
        return self.totals.saving


def add_stats(into: Stats, other: Stats) -> None:
    for name in _SUMMED_STATS:
        setattr(into, name, getattr(into, name) + getattr(other, name))
    for key, count in other.by_algorithm.items():
        into.by_algorithm[key] = into.by_algorithm.get(key, 0) + count
