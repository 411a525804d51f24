"""The INFO lines a session logs when it opens and when it closes (logger ``m2mwire.session``)."""

from __future__ import annotations

import logging

from m2mwire.session.events import Closed, SessionInfo, Stats

__all__ = ["log", "log_closed", "log_opened"]

log = logging.getLogger("m2mwire.session")


def log_opened(info: SessionInfo, remote: str) -> None:
    if log.isEnabledFor(logging.INFO):
        log.info(
            "session %s opened (%s, peer %s %s at %s): algorithms %s, encoding %s, mode %s",
            info.session_id,
            info.role.value,
            info.peer_agent_type[:64],
            info.peer_agent_id[:64],
            remote,
            ",".join(a.value for a in info.algorithms),
            info.encoding.value,
            info.mode,
        )


def log_closed(info: SessionInfo, event: Closed, stats: Stats, duration: float) -> None:
    if log.isEnabledFor(logging.INFO):
        log.info(
            "session %s closed: %s%s%s after %.1f s; sent %d messages (%d -> %d bytes), "
            "received %d (%d -> %d bytes), saving %.0f%%",
            info.session_id,
            event.code,
            " by peer" if event.by_peer else "",
            f" ({event.reason[:200]})" if event.reason else "",
            duration,
            stats.messages_sent,
            stats.original_bytes_sent,
            stats.wire_bytes_sent,
            stats.messages_received,
            stats.wire_bytes_received,
            stats.original_bytes_received,
            100 * stats.saving,
        )
