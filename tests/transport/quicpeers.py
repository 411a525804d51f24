"""QUIC peers shared by the QUIC transport tests: an echo handler and a server running it."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from m2mwire.errors import TransportError
from m2mwire.transport.quic import QuicChannel, QuicServer, serve_quic


async def echo(channel: QuicChannel) -> None:
    """Send every message back until the channel ends."""
    while True:
        try:
            message = await channel.recv()
        except TransportError:
            return
        await channel.send(message)


@asynccontextmanager
async def quic_server(**options: object) -> AsyncIterator[QuicServer]:
    """An echo server on 127.0.0.1 (an OS-chosen port), closed on exit; ``options`` go to serve_quic."""
    server = await serve_quic(echo, "127.0.0.1", 0, **options)  # type: ignore[arg-type]
    try:
        yield server
    finally:
        server.close()
        await server.wait_closed()
