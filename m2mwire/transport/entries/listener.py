"""What the WebSocket and QUIC listeners share: a server bound on start, its URL and port, closing.

Each transport's listener only says how to start its server (``start()``); the rest of the
:class:`m2mwire.transport.base.Listener` interface is here once.
"""

from __future__ import annotations

from typing import Generic, Protocol, TypeVar

from m2mwire.transport.base import ChannelHandler, TransportConfig
from m2mwire.transport.registry import Endpoint

__all__ = ["SocketListener"]


class _Server(Protocol):
    def close(self) -> None: ...

    async def wait_closed(self) -> None: ...


S = TypeVar("S", bound=_Server)


class SocketListener(Generic[S]):
    """A server on a host and port; ``server`` once started, ``port`` the bound one."""

    def __init__(self, handler: ChannelHandler, endpoint: Endpoint, config: TransportConfig) -> None:
        self._handler = handler
        self._endpoint = endpoint
        self._config = config
        self.server: S | None = None
        self.port = endpoint.port
        self.fingerprint: str | None = None

    @property
    def url(self) -> str:
        return self._endpoint.with_port(self.port)

    def close(self) -> None:
        if self.server is not None:
            self.server.close()

    async def wait_closed(self) -> None:
        if self.server is not None:
            await self.server.wait_closed()
