"""QUIC flow control without I/O (m2mwire/transport/quic/flow.py) and the aioquic compat seam."""

from __future__ import annotations

import ast
import inspect
import re
from pathlib import Path

import pytest

from m2mwire.errors import UnsupportedDependency
from m2mwire.transport.quic import compat
from m2mwire.transport.quic.flow import ReceiveCredit, SendBudget

PACKAGE = Path(compat.__file__).resolve().parent


def test_credit_is_granted_on_consumption_in_quarter_windows() -> None:
    credit = ReceiveCredit(1000)
    assert credit.limit == 1000  # the initial limit, from the handshake
    assert credit.grant(received=1000, unread=1000) is None  # all of it unread: nothing more
    assert credit.grant(received=1000, unread=800) is None  # 200 consumed: less than a quarter
    assert credit.grant(received=1000, unread=750) == 1250  # a quarter consumed: consumed + window
    assert credit.limit == 1250
    assert credit.grant(received=1250, unread=1000) is None  # received more, consumed nothing
    assert credit.grant(received=1250, unread=0) == 2250  # everything consumed: a whole window


def test_credit_never_shrinks() -> None:
    credit = ReceiveCredit(1000)
    assert credit.grant(received=2000, unread=0) == 3000
    # Unread bytes grow again (e.g. reading paused and a message in progress counted again):
    # the announced limit stays, it cannot be taken back from the peer.
    assert credit.grant(received=2500, unread=2500) is None
    assert credit.limit == 3000


def test_send_budget_waits_between_the_watermarks() -> None:
    budget = SendBudget(stream_high=100, stream_low=50, connection_high=150, connection_low=80)
    assert budget.fits(100, stream_unacked=0, connection_unacked=0)
    assert not budget.fits(101, stream_unacked=0, connection_unacked=0)
    assert not budget.fits(10, stream_unacked=20, connection_unacked=141)  # the connection's cap
    assert budget.room(stream_unacked=30, connection_unacked=100) == 50
    assert budget.room(stream_unacked=100, connection_unacked=0) == 0
    # A waiting sender resumes only under both low watermarks (hysteresis).
    assert not budget.writable(stream_unacked=60, connection_unacked=0)
    assert not budget.writable(stream_unacked=50, connection_unacked=81)
    assert budget.writable(stream_unacked=50, connection_unacked=80)
    with pytest.raises(ValueError):
        SendBudget(stream_high=10, stream_low=20, connection_high=100, connection_low=50)


def test_another_aioquic_minor_version_fails_at_import_with_what_to_install() -> None:
    compat.check_version("1.7.2")
    for version in ("1.8.0", "2.0", "1.6.1", "dev"):
        # one of ours (m2mwire.errors), and still an ImportError for code that catches that
        with pytest.raises(UnsupportedDependency, match=r"aioquic>=1\.7,<1\.8.*ws://"):
            compat.check_version(version)


# aioquic names the transport may only touch in compat.py.
_AIOQUIC_PRIVATE = {
    "_quic",
    "_streams",
    "_buffer",
    "_local_max_data",
    "_local_max_streams_bidi",
    "_local_max_streams_uni",
    "_remote_max_streams_bidi",
    "_remote_max_idle_timeout",
    "_ack_delay",
    "_protocols",
    "_peer_certificate",
    "_transmit_task",
    "_transmit_soon",
    "_process_events",
    "_connected_waiter",
    "_write_stream_limits",
    "_write_connection_limits",
    "__class__",
}


def _protocol_privates() -> set[str]:
    """The private names of aioquic's asyncio protocol, which our connection subclasses."""
    from aioquic.asyncio.protocol import QuicConnectionProtocol

    source = inspect.getsource(QuicConnectionProtocol)
    return set(re.findall(r"self\.(_[a-z]\w*)", source)) | {
        n for n in vars(QuicConnectionProtocol) if n[:1] == "_"
    }


def _private_accesses(path: Path) -> list[tuple[int, str, str]]:
    """(line, receiver, attribute) of every private attribute access in a module."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Attribute) and node.attr.startswith("_"):
            receiver = node.value.id if isinstance(node.value, ast.Name) else ast.unparse(node.value)
            found.append((node.lineno, receiver, node.attr))
        elif isinstance(node, ast.Constant) and node.value in _AIOQUIC_PRIVATE:  # getattr(x, "_name")
            found.append((node.lineno, "getattr", str(node.value)))
    return found


def test_aioquic_internals_are_touched_only_in_compat() -> None:
    modules = sorted(p for p in PACKAGE.glob("*.py") if p.name != "compat.py")
    assert {p.name for p in modules} >= {"channel.py", "connection.py", "server.py", "client.py", "udp.py"}
    offenders = [
        f"{p.name}:{line} {receiver}.{attr}"
        for p in modules
        for line, receiver, attr in _private_accesses(p)
        if attr in _AIOQUIC_PRIVATE
    ]
    assert offenders == []


def test_channel_and_connection_use_each_other_only_through_public_names() -> None:
    # The channel reaches its connection through the Link interface, and the connection its
    # channels through their public methods: private names only on self.
    for name in ("channel.py", "connection.py"):
        offenders = [
            f"{name}:{line} {receiver}.{attr}"
            for line, receiver, attr in _private_accesses(PACKAGE / name)
            if receiver != "self" and not (attr.startswith("__") and attr.endswith("__"))
        ]
        assert offenders == []
