"""m2mwire: agent-to-agent sessions over WebSocket and QUIC with M2M wire formats and AVP latent frames.

    async with m2mwire.connect("ws://127.0.0.1:8765") as session:
        await session.send({"model": "gpt-4o", "messages": [...]})
        reply = await session.recv()

Names are loaded on first use, so ``import m2mwire.codecs`` stays light.
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

from m2mwire.errors import (
    ChecksumMismatch,
    ConfigError,
    DecodeError,
    EncodeError,
    LimitExceeded,
    ListenError,
    M2MError,
    ModeError,
    ProtocolError,
    Reject,
    SessionClosed,
    SessionRejected,
    SessionTimeout,
    TokenizerUnavailable,
    TransportError,
)

__version__ = "0.1.0"

_LAZY = {
    "connect": "m2mwire.api",
    "serve": "m2mwire.api",
    "Session": "m2mwire.api",
    "Server": "m2mwire.api",
    "open_quic_connection": "m2mwire.api",
    "gateway": "m2mwire.shell.gateway",
    "Message": "m2mwire.session.payload",
    "JsonValue": "m2mwire.codecs.jsonutil",
    "Hello": "m2mwire.admission",
    "SessionInfo": "m2mwire.session.events",
    "Timers": "m2mwire.session.config",
    "Reconnect": "m2mwire.reconnect",
    "ZstdOptions": "m2mwire.session.config",
    "ZstdDictionary": "m2mwire.codecs.zstdcontext",
    "ModelIdentity": "m2mwire.schemas.identity",
    "compress": "m2mwire.codecs",
    "decompress": "m2mwire.codecs",
    "compress_binary": "m2mwire.codecs",
    "decompress_binary": "m2mwire.codecs",
}

__all__ = [
    "ChecksumMismatch",
    "ConfigError",
    "DecodeError",
    "EncodeError",
    "LimitExceeded",
    "ListenError",
    "M2MError",
    "ModeError",
    "ProtocolError",
    "Reject",
    "SessionClosed",
    "SessionRejected",
    "SessionTimeout",
    "TokenizerUnavailable",
    "TransportError",
    *_LAZY,
]

if TYPE_CHECKING:
    # "import X as X": explicit re-exports, so type checkers see m2mwire.connect and friends.
    from m2mwire.admission import Hello as Hello
    from m2mwire.api import Server as Server
    from m2mwire.api import Session as Session
    from m2mwire.api import connect as connect
    from m2mwire.api import open_quic_connection as open_quic_connection
    from m2mwire.api import serve as serve
    from m2mwire.codecs import compress as compress
    from m2mwire.codecs import compress_binary as compress_binary
    from m2mwire.codecs import decompress as decompress
    from m2mwire.codecs import decompress_binary as decompress_binary
    from m2mwire.codecs.jsonutil import JsonValue as JsonValue
    from m2mwire.codecs.zstdcontext import ZstdDictionary as ZstdDictionary
    from m2mwire.reconnect import Reconnect as Reconnect
    from m2mwire.schemas.identity import ModelIdentity as ModelIdentity
    from m2mwire.session.config import Timers as Timers
    from m2mwire.session.config import ZstdOptions as ZstdOptions
    from m2mwire.session.events import SessionInfo as SessionInfo
    from m2mwire.session.payload import Message as Message
    from m2mwire.shell.gateway import gateway as gateway


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'm2mwire' has no attribute {name!r}")
    value = getattr(import_module(module), name)
    globals()[name] = value
    return value
