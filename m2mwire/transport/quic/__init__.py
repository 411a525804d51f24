"""QUIC transport: one m2mwire :class:`~m2mwire.transport.base.Channel` per bidirectional QUIC stream.

A client connection (:func:`connect_quic`) carries any number of channels, each on its own
client-initiated bidirectional stream; the server (:func:`serve_quic`) runs ``handler(channel)``
as a task per stream. Messages are delimited on the stream by :mod:`m2mwire.transport.framing`.
The wire contract (ALPN, framing, FIN/reset semantics, error codes) is in docs/QUIC.md.

Built on aioquic, along its own seams, with what aioquic does not do itself:

* :mod:`.flow`: **send and receive backpressure**, sans-I/O. aioquic buffers ``send_stream_data``
  without limit and raises its receive windows as data *arrives*; here ``send()`` waits while
  unacknowledged bytes are over a watermark, and credit (MAX_STREAM_DATA / MAX_DATA) is granted
  as the application *consumes*, so unread data per stream and per connection stays bounded.
* :mod:`.connection`: **liveness** (keepalive PINGs while idle; every channel fails with a clear
  error when no packet arrived for ``idle_timeout``), routing of stream events to channels.
* :mod:`.server`: **admission** (a Retry before any connection state, at most
  ``QuicTuning.max_half_open`` unfinished handshakes, each for at most ``handshake_timeout``; a
  connection with no channel for ``idle_timeout`` is closed). :mod:`.client` waits for the
  server's stream credit before opening a channel beyond its limit.
* :mod:`.channel`: framing, and the push interface the session uses (no reader task).
* :mod:`.udp`: a datagram transport that reads every queued datagram, then flushes once.
* :mod:`.tuning`: the knobs; :mod:`.compat`: every use of aioquic internals, version-checked.
"""

from m2mwire.transport.framing import ErrorCode
from m2mwire.transport.quic.channel import ChannelStats, QuicChannel
from m2mwire.transport.quic.client import QuicClientConnection, connect_quic, open_quic_channel
from m2mwire.transport.quic.server import QuicServer, serve_quic
from m2mwire.transport.quic.tuning import ALPN, DEFAULT_MAX_MESSAGE_SIZE, QuicTuning

__all__ = [
    "ALPN",
    "DEFAULT_MAX_MESSAGE_SIZE",
    "ChannelStats",
    "ErrorCode",
    "QuicChannel",
    "QuicClientConnection",
    "QuicServer",
    "QuicTuning",
    "connect_quic",
    "open_quic_channel",
    "serve_quic",
]
