"""The QUIC transport's constants and performance knobs (:class:`QuicTuning`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

from aioquic.quic.configuration import SMALLEST_MAX_DATAGRAM_SIZE

from m2mwire.errors import ConfigError

__all__ = ["ALPN", "DEFAULT_MAX_MESSAGE_SIZE", "MAX_DATAGRAM", "QuicTuning"]

ALPN: Final = "m2mwire/1"
DEFAULT_MAX_MESSAGE_SIZE: Final = 16 * 1024 * 1024
MiB: Final = 1024 * 1024
# aioquic writes STREAM frame lengths as 2-byte varints, so a packet carries < 16 KiB.
MAX_DATAGRAM: Final = 16384


@dataclass(frozen=True)
class QuicTuning:
    """Performance knobs; the defaults come from loopback measurements documented in docs/QUIC.md.

    ``max_datagram_size=None`` picks 16384 bytes when the peer (client side) or the bound address
    (server side) is loopback, where the MTU is 64 KiB, and the QUIC minimum of 1200 bytes otherwise:
    aioquic has no path-MTU discovery, so anything larger can black-hole on a real path. Set it
    explicitly (e.g. 1452 for a plain Ethernet path) when you know the path.
    """

    max_datagram_size: int | None = None
    loopback_datagram_size: int = 16384
    # Receive credit: unread bytes a peer may have in flight or queued, per stream / per connection.
    stream_window: int = 8 * MiB
    connection_window: int = 32 * MiB
    # Send watermarks on bytes handed to QUIC but not yet acknowledged by the peer.
    stream_send_high: int = 4 * MiB
    stream_send_low: int = 2 * MiB
    connection_send_high: int = 16 * MiB
    connection_send_low: int = 8 * MiB
    socket_buffer: int = 4 * MiB
    congestion_control: str = "reno"
    # How long a receiver may hold back an ACK (aioquic: 1 ms). Fewer ACK packets save CPU on both
    # sides, since aioquic's cost is per packet; must stay below the advertised max_ack_delay (25 ms).
    ack_delay: float = 0.001
    # A sender that never has to wait would queue up to the watermark before the event loop gets
    # to transmit anything; yielding once this much is queued but not yet flushed keeps the
    # network and the receiver busy while the sender produces.
    flush_threshold: int = 256 * 1024
    # Concurrent peer-opened channels a server accepts on one connection (QUIC MAX_STREAMS).
    max_channels_per_connection: int = 256
    # Server: connections whose handshake has not completed, at most (each holds ~80 KB of
    # aioquic state); Initials that would start another are dropped, and the client retries.
    max_half_open: int = 256
    # Server: a handshake not completed in this time is abandoned (its state freed).
    handshake_timeout: float = 10.0

    def __post_init__(self) -> None:
        if not 0 < self.stream_send_low <= self.stream_send_high:
            raise ConfigError("QuicTuning (tuning=): need 0 < stream_send_low <= stream_send_high")
        if not 0 < self.connection_send_low <= self.connection_send_high:
            raise ConfigError("QuicTuning (tuning=): need 0 < connection_send_low <= connection_send_high")
        if self.stream_window < 4096 or self.connection_window < self.stream_window:
            raise ConfigError(
                "QuicTuning (tuning=): need stream_window >= 4096 and connection_window >= stream_window"
            )
        if self.max_half_open < 1 or self.handshake_timeout <= 0:
            raise ConfigError("QuicTuning (tuning=): need max_half_open >= 1 and handshake_timeout > 0")
        if not 0 < self.ack_delay < 0.025:
            raise ConfigError(
                "QuicTuning (tuning=): ack_delay must be above 0 and below the advertised "
                "max_ack_delay of 25 ms"
            )
        for name in ("max_datagram_size", "loopback_datagram_size"):
            size = getattr(self, name)
            if size is not None and not SMALLEST_MAX_DATAGRAM_SIZE <= size <= MAX_DATAGRAM:
                raise ConfigError(
                    f"QuicTuning (tuning=): {name} must be between {SMALLEST_MAX_DATAGRAM_SIZE} and "
                    f"{MAX_DATAGRAM} bytes"
                )

    def datagram_size_for(self, loopback: bool) -> int:
        if self.max_datagram_size is not None:
            return self.max_datagram_size
        return self.loopback_datagram_size if loopback else SMALLEST_MAX_DATAGRAM_SIZE
