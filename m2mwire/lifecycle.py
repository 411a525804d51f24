"""The start/stop protocol shared by the listening objects (``Server``, ``Gateway``).

Each of them is awaitable (``server = await serve(...)``), an async context manager (``async with
serve(...) as server``) and has ``serve_forever()``; all three reduce to the subclass's ``start()``
and ``aclose()``, written once here.
"""

from __future__ import annotations

import asyncio
from collections.abc import Generator
from types import TracebackType
from typing import Any, Self

__all__ = ["Listening"]


class Listening:
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
