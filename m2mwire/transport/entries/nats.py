"""nats://: channels and listeners of m2mwire.transport.nats for the registry."""

from __future__ import annotations

from m2mwire.transport.base import Channel, ChannelHandler, TransportConfig
from m2mwire.transport.nats.service import NatsListener, open_nats_channel
from m2mwire.transport.registry import Endpoint

__all__ = ["NatsServiceListener", "listen", "open"]


async def open(endpoint: Endpoint, config: TransportConfig) -> Channel:
    options = dict(config.options)
    return await open_nats_channel(
        endpoint.url,
        max_message_size=config.max_message_size,
        options=options,
        open_timeout=options.get("open_timeout", 10.0),
        resume_route=config.resume_route,
    )


class NatsServiceListener(NatsListener):
    """A worker of the service: no port, no certificate of its own (NATS brings its own TLS)."""

    port = 0
    fingerprint: str | None = None


def listen(handler: ChannelHandler, endpoint: Endpoint, config: TransportConfig) -> NatsServiceListener:
    return NatsServiceListener(
        handler, endpoint.url, max_message_size=config.max_message_size, options=dict(config.options)
    )
