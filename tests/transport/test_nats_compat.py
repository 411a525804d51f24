"""The nats-py compat module refuses versions and builds it was not verified against."""

from __future__ import annotations

from importlib.metadata import version

import pytest
from nats.aio.client import Client

from m2mwire.errors import UnsupportedDependency
from m2mwire.transport.nats import compat


def test_installed_nats_py_passes() -> None:
    compat.check_version(version("nats-py"))
    compat.check_attributes(compat.required_attributes())


@pytest.mark.parametrize("found", ["2.15.0", "2.17.1", "3.0"])
def test_other_minor_versions_are_refused_with_the_supported_range(found: str) -> None:
    with pytest.raises(UnsupportedDependency, match=r"pip install 'nats-py>=2\.16,<2\.17'"):
        compat.check_version(found)


def test_a_client_without_its_pending_buffer_is_refused() -> None:
    client = Client()
    del client._pending  # a nats-py build that keeps its outgoing buffer elsewhere
    required = [
        (what, client if isinstance(obj, Client) else obj, names)
        for what, obj, names in compat.required_attributes()
    ]
    with pytest.raises(UnsupportedDependency) as info:
        compat.check_attributes(required)
    # only the one missing is named, with the versions to install
    assert "lacks a nats.aio.client.Client._pending, which" in str(info.value)
    assert "nats-py 2.16.x" in str(info.value)
