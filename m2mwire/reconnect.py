"""The client's reconnect policy: ``connect(url, reconnect=True | dict | Reconnect(...))``.

Exponential backoff with jitter (the "equal jitter" of the AWS architecture blog, as websockets'
own reconnecting client does): the n-th wait is drawn from [d/2, d] with d = initial_delay * 2**n
capped at max_delay, so clients cut at the same moment do not come back in lockstep. Attempts stop
once ``max_elapsed`` seconds have passed since the connection was lost: the session then ends
with ``SessionClosed(code="RECONNECT_GAVE_UP")``. A resume whose connection is lost again within
``max_delay`` with no DATA through it either way does not restart that clock. The default
``max_elapsed`` equals a server's default ``resume_window``: trying longer could only end in
``RESUME_EXPIRED``.
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from dataclasses import dataclass, fields
from typing import Any

from m2mwire.errors import ConfigError

__all__ = ["Reconnect", "parse_reconnect"]


@dataclass(frozen=True, slots=True)
class Reconnect:
    """How a client reconnects after losing its connection (seconds)."""

    initial_delay: float = 0.1
    max_delay: float = 5.0
    max_elapsed: float = 60.0

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            if isinstance(value, bool) or not isinstance(value, int | float) or value <= 0:
                raise ConfigError(f"Reconnect {f.name}= takes seconds above 0, not {value!r}")
        if self.max_delay < self.initial_delay:
            raise ConfigError("Reconnect max_delay= must be at least initial_delay=")

    def delays(self, rng: random.Random | None = None) -> Iterator[float]:
        """The waits between attempts: jittered, doubling, capped (endless; max_elapsed stops it)."""
        uniform = (rng or random).uniform
        delay = self.initial_delay
        while True:
            yield uniform(delay / 2, delay)
            delay = min(delay * 2, self.max_delay)


def parse_reconnect(value: Any) -> Reconnect | None:
    """``reconnect=`` as given to connect(): False/None (off), True, a dict or a Reconnect."""
    if value is None or value is False:
        return None
    if value is True:
        return Reconnect()
    if isinstance(value, Reconnect):
        return value
    if isinstance(value, dict):
        known = {f.name for f in fields(Reconnect)}
        wrong = sorted(set(value) - known)
        if wrong:
            raise ConfigError(
                f"unknown reconnect option(s) {', '.join(wrong)}; reconnect= takes {', '.join(sorted(known))}"
            )
        return Reconnect(**value)
    raise ConfigError(f"reconnect= takes True, a dict or m2mwire.Reconnect(...), not {type(value).__name__}")
