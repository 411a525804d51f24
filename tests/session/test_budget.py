"""The decode budget (m2mwire/session/budget.py): the time a peer's messages take to process
beyond FREE_BASE + FREE_PER_BYTE per wire byte is paid from its address's bucket of BURST
seconds, refilled at REFILL seconds per second."""

from __future__ import annotations

import pytest

from m2mwire.session.budget import (
    BURST,
    FREE_BASE,
    FREE_PER_BYTE,
    MAX_PAUSE,
    MAX_PEERS,
    NETWORK_SCALE,
    PAUSE_PER_WAITER,
    REFILL,
    DecodeBudget,
    DecodeBudgets,
    peer_key,
)

BOMB = 0.040  # seconds: a 199-byte Brotli wire of 16 MiB (stop 32's attack run)


def test_messages_within_their_allowance_cost_nothing() -> None:
    budget = DecodeBudget(0.0)
    allowance = FREE_BASE + FREE_PER_BYTE * 1000
    for _ in range(100_000):  # far more than BURST in all: never charged
        assert budget.charge(1000, allowance, 0.0) == 0.0
    assert budget.owed(0.0) == 0.0


def test_a_flood_of_bombs_gets_the_burst_then_refill_per_second() -> None:
    budget = DecodeBudget(0.0)
    free = int(BURST / BOMB)  # 50 at once
    waits = [budget.charge(199, BOMB, 0.0) for _ in range(free + 3)]
    assert waits[: free - 1] == [0.0] * (free - 1)
    excess = BOMB - FREE_BASE - FREE_PER_BYTE * 199
    # Each further bomb is one more excess owed: reading stops that much longer.
    assert waits[free:] == sorted(waits[free:]) and waits[-1] > 2 * excess / REFILL
    assert budget.owed(0.0) == pytest.approx(waits[-1])
    # Time repays it: after the wait, nothing is owed, and the next bomb owes only itself.
    now = waits[-1]
    assert budget.owed(now) == pytest.approx(0.0, abs=1e-9)
    assert 0.0 < budget.charge(199, BOMB, now) <= excess / REFILL + 1e-9


def test_the_bucket_refills_only_up_to_the_burst() -> None:
    budget = DecodeBudget(0.0)
    budget.charge(1, BURST + FREE_BASE, 0.0)  # empty
    later = 3600.0  # an hour idle: full again, and no fuller
    assert budget.charge(1, BURST + FREE_BASE, later) == 0.0
    assert budget.charge(1, 0.01, later) > 0.0


def test_a_debt_past_max_pause_is_reported_whole() -> None:
    """The shell closes a session whose peer owes more than MAX_PAUSE of refill (capping the pause
    let each paused session decode one more message per pause); the bucket says how much is owed,
    and time repays it."""
    budget = DecodeBudget(0.0)
    owed = 3 * MAX_PAUSE * REFILL
    assert budget.charge(1, BURST + owed + FREE_BASE + FREE_PER_BYTE, 0.0) == pytest.approx(3 * MAX_PAUSE)
    assert budget.charge(1000, FREE_BASE, MAX_PAUSE) == 0.0  # within the allowance: never charged
    assert budget.owed(MAX_PAUSE) == pytest.approx(2 * MAX_PAUSE)
    assert 2 * MAX_PAUSE < budget.charge(1, 0.01, MAX_PAUSE) <= 2 * MAX_PAUSE + 1


@pytest.mark.parametrize(
    ("address", "keys"),
    [
        ("203.0.113.7:50123", ("203.0.113.7", "203.0.113.0/24")),
        ("[2001:db8:1:2:3:4:5:6]:443", ("2001:db8:1:2::/64", "2001:db8:1::/48")),
        ("[2001:db8:1:2:ffff::1]:9", ("2001:db8:1:2::/64", "2001:db8:1::/48")),  # the same /64: one peer
        ("[::1]:8765", ("::/64", "::/48")),
        ("[::ffff:203.0.113.7]:50123", ("203.0.113.7", "203.0.113.0/24")),  # dual stack: IPv4
        ("nats-client:0", ("nats-client", None)),
        ("memory:127.0.0.1:8765/client", ("memory:127.0.0.1:8765/client", None)),
    ],
)
def test_a_peer_is_its_host_and_an_ipv6_peer_its_64_in_its_network(
    address: str, keys: tuple[str, str | None]
) -> None:
    assert peer_key(address) == keys


def test_a_server_keeps_one_bucket_per_peer_and_forgets_the_oldest() -> None:
    budgets = DecodeBudgets()
    one = budgets.for_peer("198.51.100.1", 0.0)
    assert budgets.for_peer("198.51.100.1", 1.0) is one
    one.charge(1, BURST + 1.0, 1.0)  # this peer owes 10 s
    other = budgets.for_peer("198.51.100.2", 1.0)
    assert other.owed(1.0) == 0.0 and one.owed(1.0) > MAX_PAUSE  # another peer's debt is not its
    for i in range(MAX_PEERS):  # bounded: MAX_PEERS more peers
        budgets.for_peer(f"10.0.{i >> 8}.{i & 255}", 2.0)
    assert len(budgets) == MAX_PEERS
    assert budgets.for_peer("198.51.100.1", 2.0) is not one  # forgotten, least recently seen


def test_a_peer_cycling_through_its_networks_addresses_gets_no_more_than_the_network() -> None:
    """Each address (IPv6: /64) has a bucket of its own: a peer with a /48 had 65,536 of them,
    each a fresh BURST and REFILL (stop 33's second attack run). Its network's bucket, charged
    too, holds NETWORK_SCALE times one address's: once it owes, every address of it waits."""
    budgets = DecodeBudgets()
    charged = 0.0
    owing = None
    for i in range(400):  # bounded: more addresses than the network's BURST covers (200 bombs)
        address, network = peer_key(f"[2001:db8:7:{i:x}::1]:443")
        budget = budgets.for_peer(address, 0.0, network)
        assert budget.owed(0.0) == 0.0  # each address is fresh
        budget.charge(100, BOMB, 0.0)
        charged += BOMB
        if budget.waits(0.0) > 0.0:
            owing = i
            break
    assert owing is not None and charged == pytest.approx(NETWORK_SCALE * BURST, abs=2 * BOMB)
    address, network = peer_key("[2001:db8:7:ffff::2]:443")
    assert network == "2001:db8:7::/48"
    neighbour = budgets.for_peer(address, 0.0, network)
    assert neighbour.owed(0.0) == 0.0 and neighbour.waits(0.0) > 0.0  # waits, not closed
    address, network = peer_key("[2001:db8:8::1]:443")
    elsewhere = budgets.for_peer(address, 0.0, network)
    assert elsewhere.waits(0.0) == 0.0
    assert neighbour.waits(1.0) < neighbour.waits(0.0)  # the network refills NETWORK_SCALE x faster


def test_sessions_waiting_for_one_bucket_wait_longer_the_more_they_are() -> None:
    """A debt of a few ms woke every session paused on the bucket each few ms: 200 paused sessions
    of one address kept a core busy re-checking (stop 33's third attack run). Each waits at least
    PAUSE_PER_WAITER per session already waiting, so they wake ~1 / PAUSE_PER_WAITER times a
    second in all."""
    budget = DecodeBudget(0.0)
    budget.charge(0, FREE_BASE + BURST + 0.001 * REFILL, 0.0)  # owes 1 ms
    assert budget.waits(0.0) == pytest.approx(0.001)
    budget.waiting = 200
    assert budget.waits(0.0) == pytest.approx(200 * PAUSE_PER_WAITER)
    assert budget.waits(0.01) == 0.0  # repaid: nobody waits, however many were waiting
    network = DecodeBudget(0.0, scale=NETWORK_SCALE)
    neighbour = DecodeBudget(0.0, network)
    network.charge(0, FREE_BASE + NETWORK_SCALE * BURST + 0.001, 0.0)
    network.waiting = 50
    assert neighbour.buckets() == (neighbour, network)
    assert neighbour.waits(0.0) == pytest.approx(50 * PAUSE_PER_WAITER)
