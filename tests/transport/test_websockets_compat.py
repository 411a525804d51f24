"""The websockets compat module refuses versions and builds it was not verified against (issue 13)."""

from __future__ import annotations

import subprocess
import sys

import pytest
import websockets.version
from websockets.server import ServerProtocol
from websockets.streams import StreamReader

from m2mwire.errors import M2MError, UnsupportedDependency
from m2mwire.transport import websockets_compat as compat


def test_installed_websockets_passes() -> None:
    compat.check_version(websockets.version.version)
    compat.check_attributes(compat.required_attributes())


@pytest.mark.parametrize("version", ["17.3", "17.5", "16.0", "18.4", "dev"])
def test_other_minor_versions_are_refused_with_the_supported_range(version: str) -> None:
    with pytest.raises(UnsupportedDependency) as info:
        compat.check_version(version)
    message = str(info.value)
    assert f"found websockets {version}" in message
    assert "pip install 'websockets>=17.4,<17.5'" in message
    assert isinstance(info.value, ImportError) and isinstance(info.value, M2MError)


def test_patch_releases_of_the_verified_minor_pass() -> None:
    compat.check_version("17.4.1")


def test_a_protocol_without_its_reader_attribute_is_refused() -> None:
    required = compat.required_attributes()
    protocol = ServerProtocol()
    del protocol.reader  # a websockets build that no longer keeps its reader there
    required = [
        (what, protocol if isinstance(obj, ServerProtocol) else obj, names) for what, obj, names in required
    ]
    with pytest.raises(UnsupportedDependency) as info:
        compat.check_attributes(required)
    message = str(info.value)
    assert "a websockets.server.ServerProtocol.reader" in message
    assert "parser" not in message  # only what is missing is named
    assert "websockets 17.4.x" in message


def test_a_stream_reader_without_read_exact_is_refused() -> None:
    # A real copy of websockets' StreamReader class with one method left out.
    copy = type("StreamReader", (), {k: v for k, v in vars(StreamReader).items() if k != "read_exact"})
    required = [
        (what, copy if obj is StreamReader else obj, names)
        for what, obj, names in compat.required_attributes()
    ]
    with pytest.raises(UnsupportedDependency, match=r"websockets\.streams\.StreamReader\.read_exact"):
        compat.check_attributes(required)


def test_the_check_runs_when_the_transport_is_imported() -> None:
    # websockets without a private method the transport relies on: importing the transport fails
    # with the m2mwire error, before any connection is made.
    code = (
        "from websockets.asyncio.connection import Connection\n"
        "del Connection.send_data\n"
        "from m2mwire.errors import UnsupportedDependency\n"
        "try:\n"
        "    import m2mwire.transport.websocket\n"
        "except UnsupportedDependency as exc:\n"
        "    print('refused:', exc)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    assert "refused:" in out.stdout, out.stdout + out.stderr
    assert "websockets.asyncio.connection.Connection.send_data" in out.stdout
