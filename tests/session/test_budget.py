"""The decode budget (m2mwire/session/budget.py): what a session decodes beyond FREE_RATIO x the
bytes received is paid from a bucket of BURST bytes refilled at REFILL per second."""

from __future__ import annotations

from m2mwire.codecs.limits import MiB
from m2mwire.session.budget import BURST, FREE_RATIO, MAX_PAUSE, REFILL, DecodeBudget

BOMB = 16 * MiB  # a 199-byte Brotli wire's output (stop 32's attack run)


def test_messages_within_the_free_ratio_cost_nothing() -> None:
    budget = DecodeBudget(0.0)
    for _ in range(10_000):  # far more than BURST in all: never charged
        assert budget.charge(1000, FREE_RATIO * 1000, 0.0) == 0.0


def test_a_flood_of_bombs_gets_the_burst_then_refill_per_second() -> None:
    budget = DecodeBudget(0.0)
    free = BURST // BOMB  # 4 at once
    waits = [budget.charge(199, BOMB, 0.0) for _ in range(free + 3)]
    assert waits[: free - 1] == [0.0] * (free - 1)
    excess = BOMB - FREE_RATIO * 199
    # Each further bomb is one more excess owed: reading stops that much longer.
    assert waits[free:] == sorted(waits[free:]) and waits[-1] > 2 * excess / REFILL
    # Time repays it: after the wait, the next bomb owes only itself.
    now = waits[-1]
    assert 0.0 < budget.charge(199, BOMB, now) <= excess / REFILL + 1e-9


def test_the_bucket_refills_only_up_to_the_burst() -> None:
    budget = DecodeBudget(0.0)
    budget.charge(1, BURST, 0.0)  # empty
    later = 3600.0  # an hour idle: full again, and no fuller
    assert budget.charge(1, BURST, later) == 0.0
    assert budget.charge(1, MiB, later) > 0.0


def test_a_debt_past_max_pause_is_reported_whole() -> None:
    """The shell closes a session whose message leaves more than MAX_PAUSE of refill owed
    (capping the pause let each paused session decode one more message per pause); the bucket
    says how much is owed, and time repays it."""
    budget = DecodeBudget(0.0)
    owed = 3 * MAX_PAUSE * REFILL
    assert budget.charge(1, int(BURST + owed) + FREE_RATIO, 0.0) == 3 * MAX_PAUSE
    assert budget.charge(1000, 1000, MAX_PAUSE) == 0.0  # within the free ratio: never charged
    assert 2 * MAX_PAUSE < budget.charge(1, MiB, MAX_PAUSE) <= 2 * MAX_PAUSE + 1
