"""Shared test fixtures: reference data location and transport parametrisation."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from m2mwire.transport.nats.local import LocalNatsServer

# Copied from the steering repository's reference folder (see tests/data/README.md): tests read only
# files inside this checkout, since CI machines and fresh clones have nothing beside it.
DATA_DIR = Path(__file__).resolve().parent / "data"
REFERENCE_VECTORS = DATA_DIR / "m2m-reference-vectors.json"


@pytest.fixture(scope="session", autouse=True)
def private_state_dir(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """Servers that generate a certificate keep it in the state directory (docs/PROTOCOL.md §9,
    "Certificates"): a temporary one for the whole run, inherited by the CLI's subprocesses, so the
    suite never writes into the user's home."""
    state = tmp_path_factory.mktemp("m2mwire-state")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("M2MWIRE_STATE_DIR", str(state))
        yield state


@pytest.fixture(scope="session")
def m2m_vectors() -> dict[str, Any]:
    data: dict[str, Any] = json.loads(REFERENCE_VECTORS.read_text())
    return data


@pytest.fixture(scope="session")
def nats_server() -> Iterator[LocalNatsServer]:
    """One real nats-server for the session (loopback, kernel-chosen port, temporary directory);
    tests use distinct service subjects, so they never see each other's workers."""
    with LocalNatsServer(max_payload=1024 * 1024) as server:
        yield server


@pytest.fixture
def memory_scheme() -> Iterator[str]:
    """The in-memory transport, registered under a test-only scheme for the test's duration."""
    from m2mwire.transport import memory, registry

    registry.register("memtest", memory.REGISTRATION)
    try:
        yield "memtest"
    finally:
        registry.unregister("memtest")
