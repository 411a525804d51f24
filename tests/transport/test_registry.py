"""The transport registry: URL scheme -> transport, one table for the shell and the option checks."""

from __future__ import annotations

import pytest

import m2mwire
from m2mwire.errors import ConfigError
from m2mwire.options import valid_options
from m2mwire.transport import registry
from m2mwire.transport.memory import MemoryChannel


@pytest.mark.parametrize("url", ["tcp://127.0.0.1:1", "foo://x"])
def test_unknown_scheme_names_every_registered_scheme(url: str, memory_scheme: str) -> None:
    with pytest.raises(ConfigError) as caught:
        m2mwire.connect(url)
    message = str(caught.value)
    assert "unsupported URL scheme" in message
    for scheme in ("ws", "wss", "quic", "nats", memory_scheme):
        assert f"{scheme}://" in message, (scheme, message)


def test_without_the_registration_the_scheme_is_unknown() -> None:
    with pytest.raises(ConfigError, match=r"use ws://, wss:// or quic:// \(or nats://"):
        m2mwire.connect("memtest://pair")
    with pytest.raises(ConfigError, match="unsupported URL scheme 'memtest'"):
        registry.lookup("memtest")


def test_options_follow_the_registration(memory_scheme: str) -> None:
    # A scheme takes the session options and its registration's transport options, nothing else.
    assert "max_queue" in valid_options("connect", memory_scheme)
    assert "fingerprint" not in valid_options("connect", memory_scheme)
    with pytest.raises(
        ConfigError, match=r"fingerprint= applies to connect\(\) with wss:// and quic:// only"
    ):
        m2mwire.connect(f"{memory_scheme}://pair", fingerprint="00" * 32)


async def test_a_new_transport_is_one_registry_entry(memory_scheme: str) -> None:
    """Registering the in-memory transport is all it takes to run sessions over it through the
    public connect() and serve(): nothing in the shell names a scheme."""
    seen: list[object] = []

    async def echo(session: m2mwire.Session) -> None:
        seen.append(session._channel)
        async for message in session:
            if message.request_id is not None:
                await session.reply(message, {"echo": message.json()})
            else:
                await session.send(message.text or "")

    async with m2mwire.serve(echo, f"{memory_scheme}://agents") as server:
        assert server.url.startswith(f"{memory_scheme}://agents:")
        assert server.port > 0
        async with m2mwire.connect(server.url) as session:
            assert isinstance(session._channel, MemoryChannel)
            await session.send("hello")
            assert (await session.recv()).text == "hello"
            answer = await session.request({"q": 1}, timeout=5)
            assert answer.json() == {"echo": {"q": 1}}
            assert session.info.session_id
    assert len(seen) == 1 and isinstance(seen[0], MemoryChannel)
    with pytest.raises(m2mwire.TransportError, match="nothing listens"):
        await m2mwire.connect(server.url)


def test_a_listener_url_brackets_an_ipv6_host() -> None:
    from m2mwire.transport.registry import parse_url

    assert parse_url("ws://[::1]:0").with_port(8765) == "ws://[::1]:8765"
    assert parse_url("quic://127.0.0.1:0").with_port(4433) == "quic://127.0.0.1:4433"


@pytest.mark.parametrize(
    ("url", "match"),
    [
        ("quic://[::1", "malformed URL 'quic://\\[::1': Invalid IPv6 URL"),
        ("ws://[::1:8765", "malformed URL"),
        ("nats://host:notaport/agents.x", "bad port 'notaport'"),
        ("nats://h1:4222,h2:99999/agents.x", "bad port '99999'"),
    ],
)
def test_a_malformed_url_is_a_config_error_at_the_call(url: str, match: str) -> None:
    """A CLI user got urllib's ValueError traceback for quic://[::1, and nats://host:notaport
    failed only ~3 s later inside nats-py ("invalid connect url option"): both say what is wrong
    at the call now."""
    for call in (lambda: m2mwire.connect(url), lambda: m2mwire.serve(lambda session: None, url)):
        with pytest.raises(ConfigError, match=match):
            call()
