"""ws:// and wss://: channels and listeners of m2mwire.transport.websocket for the registry."""

from __future__ import annotations

from typing import Any

from websockets.asyncio.server import Server

from m2mwire.transport.base import Channel, ChannelHandler, TransportConfig
from m2mwire.transport.entries.listener import SocketListener
from m2mwire.transport.registry import Endpoint
from m2mwire.transport.websocket import connect_websocket, serve_websocket

__all__ = ["WebSocketListener", "listen", "open"]


async def open(endpoint: Endpoint, config: TransportConfig) -> Channel:
    options = config.options
    kwargs: dict[str, Any] = {"max_message_size": config.max_message_size}
    if endpoint.scheme == "wss":
        from m2mwire.transport import tls  # cryptography: only for TLS

        kwargs["ssl"] = tls.client_context(options, target="wss:// server")
        if options.get("fingerprint"):
            kwargs["fingerprint"] = options["fingerprint"]
    if options.get("open_timeout") is not None:
        kwargs["open_timeout"] = options["open_timeout"]
    if config.token is not None:
        # Also on the upgrade, so an HTTP proxy or gateway in front can authenticate it.
        kwargs["additional_headers"] = {"Authorization": f"Bearer {config.token}"}
    return await connect_websocket(endpoint.url, **kwargs)


def listen(handler: ChannelHandler, endpoint: Endpoint, config: TransportConfig) -> WebSocketListener:
    return WebSocketListener(handler, endpoint, config)


class WebSocketListener(SocketListener[Server]):
    """A websockets server (see m2mwire.transport.base.Listener); ``server`` once started."""

    async def start(self) -> None:
        options = self._config.options
        ssl_ctx = None
        if self._endpoint.scheme == "wss":
            from m2mwire.transport import certstore  # cryptography: only for TLS

            ssl_ctx, self.fingerprint = certstore.server_context(
                options, target="wss:// server", host=self._endpoint.host
            )
        extra = {"reuse_port": True} if options.get("reuse_port") else {}
        self.server = await serve_websocket(
            self._handler,
            self._endpoint.host,
            self._endpoint.port,
            max_message_size=self._config.max_message_size,
            ssl=ssl_ctx,
            **extra,
        )
        self.port = self.server.sockets[0].getsockname()[1]
