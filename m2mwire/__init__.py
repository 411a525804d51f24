"""m2mwire: agent-to-agent sessions over WebSocket and QUIC with M2M wire formats and AVP latent frames."""

from __future__ import annotations

__version__ = "0.1.0"
