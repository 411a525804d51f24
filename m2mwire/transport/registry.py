"""Transports by URL scheme: the one table the shell consults to open and listen.

Each registration names the module that implements the transport (imported on first use, so a
``ws://`` user never loads aioquic or nats-py), the transport options ``connect()`` and ``serve()``
accept with its scheme, and how its URLs look. The module defines::

    async def open(endpoint: Endpoint, config: TransportConfig) -> Channel
    def listen(handler: ChannelHandler, endpoint: Endpoint, config: TransportConfig) -> Listener

Adding a transport is adding one :class:`Registration` (:func:`register`); the session shell,
the option checks and the error messages all read this table.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from importlib import import_module
from typing import Protocol, cast
from urllib.parse import urlsplit

from m2mwire.errors import ConfigError
from m2mwire.transport.base import Channel, ChannelHandler, Listener, TransportConfig
from m2mwire.transport.nats.options import NATS_CLIENT_OPTIONS, NATS_SERVER_OPTIONS, parse_nats_url

__all__ = [
    "Endpoint",
    "Registration",
    "TransportModule",
    "listen",
    "lookup",
    "open_channel",
    "parse_url",
    "register",
    "schemes",
    "unregister",
]


@dataclass(frozen=True, slots=True)
class Endpoint:
    """A parsed URL: its scheme, host and port (host ``""`` and port 0 where the URL is not
    ``scheme://host:port``, e.g. nats://), and the URL as given."""

    scheme: str
    host: str
    port: int
    url: str

    def with_port(self, port: int) -> str:
        """The URL to reach this endpoint on ``port`` (a listener's, once bound to port 0);
        an IPv6 host goes in brackets, as URLs write it."""
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{self.scheme}://{host}:{port}"


class TransportModule(Protocol):
    async def open(self, endpoint: Endpoint, config: TransportConfig) -> Channel: ...

    def listen(self, handler: ChannelHandler, endpoint: Endpoint, config: TransportConfig) -> Listener: ...


@dataclass(frozen=True, slots=True)
class Registration:
    """One transport, under one URL scheme."""

    module: str  # defines open() and listen(); imported when the scheme is first used
    connect_options: tuple[str, ...] = ()
    serve_options: tuple[str, ...] = ()
    # scheme://host:port URLs take this port when they give none. None: the URL has another form,
    # which check_url validates (raising ValueError with what is wrong) and url_form shows.
    default_port: int | None = 0
    check_url: Callable[[str], object] | None = None
    url_form: str = ""


_TLS_CLIENT = ("cafile", "cadata", "fingerprint", "insecure")
_TLS_SERVER = ("certfile", "keyfile", "cert_dir")

_REGISTRY: dict[str, Registration] = {
    "ws": Registration(
        "m2mwire.transport.entries.websocket",
        connect_options=("open_timeout",),
        serve_options=("reuse_port",),
        default_port=80,
    ),
    "wss": Registration(
        "m2mwire.transport.entries.websocket",
        connect_options=("ssl", *_TLS_CLIENT, "open_timeout"),
        serve_options=("ssl", *_TLS_SERVER, "reuse_port"),
        default_port=443,
    ),
    "quic": Registration(
        "m2mwire.transport.entries.quic",
        connect_options=(*_TLS_CLIENT, "server_name", "open_timeout", "idle_timeout", "connection"),
        serve_options=(*_TLS_SERVER, "idle_timeout", "reuse_port"),
        default_port=4433,
    ),
    "nats": Registration(
        "m2mwire.transport.entries.nats",
        connect_options=("open_timeout", *NATS_CLIENT_OPTIONS),
        serve_options=NATS_SERVER_OPTIONS,
        default_port=None,
        check_url=parse_nats_url,
        url_form="nats://host:4222/service.subject",
    ),
}


def register(scheme: str, registration: Registration) -> None:
    """Serve ``scheme://`` URLs with another transport (or replace one)."""
    if not scheme.isascii() or not scheme.isalnum() or scheme != scheme.lower():
        raise ValueError(f"a URL scheme is lowercase letters and digits, not {scheme!r}")
    _REGISTRY[scheme] = registration


def unregister(scheme: str) -> None:
    _REGISTRY.pop(scheme, None)


def schemes() -> tuple[str, ...]:
    """Every registered scheme, in registration order."""
    return tuple(_REGISTRY)


def lookup(scheme: str) -> Registration:
    registration = _REGISTRY.get(scheme)
    if registration is None:
        raise ConfigError(f"unsupported URL scheme {scheme!r}: {_known_schemes()}")
    return registration


def _known_schemes() -> str:
    """``use ws://, wss:// or quic:// (or nats://host:4222/service.subject)``, from the table."""
    plain = [f"{s}://" for s, r in _REGISTRY.items() if r.default_port is not None]
    other = [r.url_form or f"{s}://..." for s, r in _REGISTRY.items() if r.default_port is None]
    text = f"use {_or(plain)}" if plain else ""
    if other:
        text = f"{text} (or {_or(other)})" if text else f"use {_or(other)}"
    return text


def _or(items: list[str]) -> str:
    return items[0] if len(items) == 1 else f"{', '.join(items[:-1])} or {items[-1]}"


def parse_url(url: str) -> Endpoint:
    """Scheme, host and port of ``url``; ConfigError says how to write anything else."""
    if not isinstance(url, str):
        raise ConfigError(f"the URL must be a str such as 'ws://127.0.0.1:8765', not {type(url).__name__}")
    if "://" not in url:
        raise ConfigError(f"URL {url!r} has no scheme: write ws://{url}, wss://{url} or quic://{url}")
    try:
        parts = urlsplit(url)
    except ValueError as exc:  # urllib's "Invalid IPv6 URL" (an unclosed [), and the like
        raise ConfigError(f"malformed URL {url!r}: {exc} (an IPv6 host is written [::1]:8765)") from None
    scheme = parts.scheme.lower()
    if scheme in ("http", "https") and scheme not in _REGISTRY:
        secure = scheme == "https"
        raise ConfigError(
            f"{scheme}:// is not an m2mwire URL ({url!r}): use {'wss' if secure else 'ws'}:// for a "
            "WebSocket server or quic:// for a QUIC server"
        )
    registration = _REGISTRY.get(scheme)
    if registration is None:
        raise ConfigError(f"unsupported URL scheme {parts.scheme!r} in {url!r}: {_known_schemes()}")
    if registration.default_port is None:
        if registration.check_url is not None:
            try:
                registration.check_url(url)
            except ValueError as exc:
                raise ConfigError(str(exc)) from None
        return Endpoint(scheme, "", 0, url)
    try:
        port = parts.port
    except ValueError as exc:  # urllib's "Port could not be cast to integer value" and out-of-range
        raise ConfigError(f"bad port in {url!r}: {exc}") from None
    host = parts.hostname or "127.0.0.1"
    return Endpoint(scheme, host, port if port is not None else registration.default_port, url)


def _module(scheme: str) -> TransportModule:
    return cast(TransportModule, import_module(lookup(scheme).module))


async def open_channel(endpoint: Endpoint, config: TransportConfig) -> Channel:
    """A client channel to ``endpoint``, by its scheme's transport."""
    return await _module(endpoint.scheme).open(endpoint, config)


def listen(handler: ChannelHandler, endpoint: Endpoint, config: TransportConfig) -> Listener:
    """A listener (not started yet) for ``endpoint``, by its scheme's transport."""
    return _module(endpoint.scheme).listen(handler, endpoint, config)
