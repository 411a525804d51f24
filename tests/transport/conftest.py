"""Fixtures shared by the NATS transport tests."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from m2mwire.transport.nats.local import LocalNatsServer

# A small server limit: the channel's window is 4 x max_payload = 256 KiB, so a few dozen
# messages use it up (the credit and lost-message tests need a sender that blocks on credit).
SMALL_MAX_PAYLOAD = 64 * 1024


@pytest.fixture(scope="module")
def small_nats() -> Iterator[LocalNatsServer]:
    with LocalNatsServer(max_payload=SMALL_MAX_PAYLOAD) as server:
        yield server
