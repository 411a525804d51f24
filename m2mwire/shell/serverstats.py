"""``ServerStats``: a server's session counts and the sums of its sessions' :class:`Stats`."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from m2mwire.session.core import Stats

__all__ = ["ServerStats", "add_stats"]

_SUMMED_STATS = (
    "messages_sent",
    "messages_received",
    "original_bytes_sent",
    "wire_bytes_sent",
    "original_bytes_received",
    "wire_bytes_received",
    "original_tokens_sent",
    "wire_tokens_sent",
    "original_tokens_received",
    "wire_tokens_received",
)


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
