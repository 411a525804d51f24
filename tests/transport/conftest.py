"""Fixtures shared by the NATS transport tests."""

from __future__ import annotations

import ssl
from collections.abc import Iterator

import pytest

from m2mwire.transport.nats.local import LocalNatsServer
from m2mwire.transport.tls import generate_self_signed

# A small server limit: the channel's window is 4 x max_payload = 256 KiB, so a few dozen
# messages use it up (the credit and lost-message tests need a sender that blocks on credit).
SMALL_MAX_PAYLOAD = 64 * 1024


@pytest.fixture(scope="module")
def small_nats() -> Iterator[LocalNatsServer]:
    with LocalNatsServer(max_payload=SMALL_MAX_PAYLOAD) as server:
        yield server


@pytest.fixture(scope="module")
def tls_nats() -> Iterator[tuple[LocalNatsServer, ssl.SSLContext]]:
    """A nats-server that requires TLS (a fresh self-signed certificate for 127.0.0.1), and a
    client context trusting it."""
    cert = generate_self_signed()
    with cert.temp_files() as (certfile, keyfile):
        tls = f'tls {{ cert_file: "{certfile}", key_file: "{keyfile}" }}'
        with LocalNatsServer(config=(tls,)) as server:
            yield server, ssl.create_default_context(cadata=cert.cert_pem.decode())
