"""quic://: channels and listeners of m2mwire.transport.quic for the registry, and
``open_quic_connection()`` (one connection shared by several sessions: ``connect(url, connection=)``).
"""

from __future__ import annotations

from typing import Any

from m2mwire.errors import ConfigError
from m2mwire.session.config import DEFAULT_MAX_PAYLOAD
from m2mwire.transport import certstore
from m2mwire.transport.base import Channel, ChannelHandler, TransportConfig
from m2mwire.transport.entries.listener import SocketListener
from m2mwire.transport.quic import (
    QuicClientConnection,
    QuicServer,
    connect_quic,
    open_quic_channel,
    serve_quic,
)
from m2mwire.transport.registry import Endpoint, parse_url

__all__ = ["QuicListener", "listen", "open", "open_quic_connection"]

_CLIENT_OPTIONS = ("cafile", "cadata", "fingerprint", "insecure", "server_name", "idle_timeout")


async def open(endpoint: Endpoint, config: TransportConfig) -> Channel:
    options = config.options
    shared = options.get("connection")
    if shared is not None:
        if not isinstance(shared, QuicClientConnection):
            raise ConfigError(
                "connection= takes a connection from m2mwire.open_quic_connection(), "
                f"not {type(shared).__name__}"
            )
        # open_timeout also bounds the wait for a free stream when the connection has none left.
        return await shared.open_channel(
            max_message_size=config.max_message_size, timeout=options.get("open_timeout")
        )
    kwargs: dict[str, Any] = {k: v for k, v in options.items() if k in _CLIENT_OPTIONS}
    if "open_timeout" in options:
        kwargs["connect_timeout"] = options["open_timeout"]
    return await open_quic_channel(
        endpoint.host, endpoint.port, max_message_size=config.max_message_size, **kwargs
    )


def listen(handler: ChannelHandler, endpoint: Endpoint, config: TransportConfig) -> QuicListener:
    return QuicListener(handler, endpoint, config)


class QuicListener(SocketListener[QuicServer]):
    """A QUIC server (see m2mwire.transport.base.Listener); ``server`` once started."""

    async def start(self) -> None:
        options = self._config.options
        certfile, keyfile, _ = certstore.server_certificate_files(options, self._endpoint.host)
        kwargs: dict[str, Any] = {k: options[k] for k in ("idle_timeout", "reuse_port") if k in options}
        self.server = await serve_quic(
            self._handler,
            self._endpoint.host,
            self._endpoint.port,
            certfile=certfile,
            keyfile=keyfile,
            max_message_size=self._config.max_message_size,
            **kwargs,
        )
        self.port = self.server.port
        self.fingerprint = self.server.fingerprint


async def open_quic_connection(url: str, **options: Any) -> QuicClientConnection:
    """Open one QUIC connection to share between sessions: ``connect(url, connection=conn)``.

    Options: cafile, cadata, fingerprint, insecure, server_name, idle_timeout, open_timeout (the
    handshake, as connect()'s), max_payload (the default incoming message limit of its channels).
    Close it with ``await conn.close()``. ConfigError for a URL or option it cannot take.
    """
    endpoint = parse_url(url)
    if endpoint.scheme != "quic":
        raise ConfigError(f"open_quic_connection() needs a quic:// URL, not {url!r}")
    known = (*_CLIENT_OPTIONS, "max_payload", "open_timeout")
    unknown = set(options) - set(known)
    if unknown:
        raise ConfigError(
            f"unknown option(s) for open_quic_connection(): {', '.join(sorted(unknown))}; "
            f"it takes {', '.join(known)}"
        )
    max_size = options.pop("max_payload", DEFAULT_MAX_PAYLOAD)
    if "open_timeout" in options:  # as connect() calls it
        options["connect_timeout"] = options.pop("open_timeout")
    return await connect_quic(endpoint.host, endpoint.port, max_message_size=max_size, **options)
