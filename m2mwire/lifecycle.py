"""The start/stop protocol shared by the listening objects (``Server``, ``Gateway``).

Each of them is awaitable (``server = await serve(...)``), an async context manager (``async with
serve(...) as server``) and has ``serve_forever()``; all three reduce to the subclass's ``start()``
and ``aclose()``, written once here, as are the transport listener they hold (its URL, port,
fingerprint) and stopping it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Generator
from types import TracebackType
from typing import Any, Self

from m2mwire.errors import ListenError
from m2mwire.transport import registry
from m2mwire.transport.base import ChannelHandler, Listener, TransportConfig
from m2mwire.transport.registry import Endpoint

__all__ = ["Listening"]


class Listening:
    def __init__(self, endpoint: Endpoint) -> None:
        self._endpoint = endpoint
        self._impl: Listener | None = None  # the transport's, once started
        self.port = endpoint.port
        self.fingerprint: str | None = None

    @property
    def url(self) -> str:
        """The URL clients connect to (with the bound port once started)."""
        return self._impl.url if self._impl is not None else self._endpoint.url

    async def _listen(self, handler: ChannelHandler, config: TransportConfig) -> None:
        listener = registry.listen(handler, self._endpoint, config)
        try:
            await listener.start()
        except OSError as exc:  # the bind: in use, not our address, a privileged port
            raise ListenError(
                f"cannot listen on {self._endpoint.url}: {exc.strerror or exc}; choose another port "
                "(0 lets the system pick one) or host, or stop what already listens there",
                errno=exc.errno,
            ) from exc
        self._impl = listener
        self.port = listener.port
        self.fingerprint = listener.fingerprint

    def close(self) -> None:
        """Stop accepting connections (what is running goes on; see ``aclose()``)."""
        if self._impl is not None:
            self._impl.close()

    async def wait_closed(self) -> None:
        if self._impl is not None:
            await self._impl.wait_closed()

    async def start(self) -> Self:
        raise NotImplementedError

    async def aclose(self) -> None:
        raise NotImplementedError

    async def serve_forever(self) -> None:
        """Run until cancelled, then close (sessions first, as ``aclose()`` does)."""
        try:
            await asyncio.Future()
        finally:
            await self.aclose()

    def __await__(self) -> Generator[Any, None, Self]:
        return self.start().__await__()

    async def __aenter__(self) -> Self:
        return await self.start()

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.aclose()
