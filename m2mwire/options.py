"""URLs and keyword options of ``connect()`` and ``serve()``, checked when they are called.

Every option either applies to the call and its URL scheme or is rejected at once, with the list of
those that do: a ``fingerprint=`` on a ``ws://`` URL or an ``insecure=`` given to ``serve()`` would
otherwise be silently ignored, and a missing ``cafile=`` or a certificate without its key would
only show up as a failed handshake much later (on the server: at every client's handshake).
"""

from __future__ import annotations

import os
import ssl as ssl_module
from collections.abc import Awaitable, Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Any, Literal, TypedDict

from m2mwire.errors import ConfigError
from m2mwire.reconnect import Reconnect
from m2mwire.session.config import SESSION_OPTIONS, SessionConfig, make_config
from m2mwire.transport import registry
from m2mwire.transport.registry import Endpoint, parse_url

if TYPE_CHECKING:
    from m2mwire.admission import Hello
    from m2mwire.codecs.limits import Limits
    from m2mwire.schemas.identity import ModelIdentity
    from m2mwire.session.config import Timers, ZstdOptions
    from m2mwire.transport.quic import QuicClientConnection

__all__ = [
    "Call",
    "ConnectOptions",
    "Endpoint",
    "ServeOptions",
    "parse_url",
    "split_options",
    "valid_options",
]


class SessionOptions(TypedDict, total=False):
    """Options of both connect() and serve(): what this endpoint brings to a session (SessionConfig).

    Typed so that a checker catches a misspelt option in the caller's code; at run time an unknown
    or inapplicable option raises ConfigError as well (split_options)."""

    algorithms: str | Iterable[str]
    encodings: str | Iterable[str]
    preferred_encoding: str | None
    max_payload: int
    identity: ModelIdentity | None
    agent_id: str
    agent_type: str
    timers: Timers | Mapping[str, float | None]
    limits: Limits
    optimize: Literal["bytes", "tokens"]
    token_stats: bool
    max_queue: int
    max_queue_bytes: int
    zstd: ZstdOptions | Mapping[str, Any]
    resume_buffer_bytes: int
    binary_text: bool


class NatsOptions(TypedDict, total=False):
    """The nats:// options of connect() and serve() (docs/PROTOCOL.md §5a; passed to nats-py)."""

    servers: str | list[str]
    user: str
    password: str
    nats_token: str
    credentials: str
    nkeys_seed: str
    tls: ssl_module.SSLContext
    tls_hostname: str
    inbox_prefix: str
    name: str
    reconnect_time_wait: float
    max_reconnect_attempts: int
    connect_timeout: float
    nats_options: dict[str, Any]
    nats_window: int
    probe_interval: float


class ConnectOptions(SessionOptions, NatsOptions, total=False):
    """Keyword options of :func:`m2mwire.connect` (which apply depends on the URL's scheme)."""

    token: str | None
    ssl: ssl_module.SSLContext | None
    cafile: str | os.PathLike[str] | None
    cadata: str | bytes | None
    fingerprint: str | None
    insecure: bool
    server_name: str | None
    open_timeout: float | None
    idle_timeout: float | None
    connection: QuicClientConnection | None
    reconnect: bool | Mapping[str, float] | Reconnect | None


class ServeOptions(SessionOptions, NatsOptions, total=False):
    """Keyword options of :func:`m2mwire.serve` (which apply depends on the URL's scheme)."""

    queue: str  # nats://: the queue group the workers of a service join
    nats_max_half_open: int  # nats://: sessions opened but whose HELLO has not come, at most
    reuse_port: bool  # ws://, wss://, quic://: SO_REUSEPORT, for several worker processes on one port
    on_hello: Callable[[Hello], Awaitable[None] | None] | None
    max_sessions: int | None
    max_sessions_per_peer: int | None
    ssl: ssl_module.SSLContext | None
    certfile: str | os.PathLike[str] | None
    keyfile: str | os.PathLike[str] | None
    cert_dir: str | os.PathLike[str] | Literal[False] | None  # None: the state directory; False: in memory
    idle_timeout: float | None
    resume_window: float


# Transport options whose False means something other than leaving them out.
_FALSE_IS_A_CHOICE = frozenset({"cert_dir"})

Call = Literal["connect", "serve"]
Scheme = Literal["ws", "wss", "quic", "nats"]  # the built-in schemes (more may be registered)
_CALLS: tuple[Call, ...] = ("connect", "serve")

# Options of one call only: the client's credential, the server's admission control (serve() takes
# those out before calling split_options, but they belong in its list of valid options).
_CALL_ONLY: dict[str, Call] = {
    "token": "connect",
    "on_hello": "serve",
    "max_sessions": "serve",
    "max_sessions_per_peer": "serve",
    "resume_window": "serve",
    "reconnect": "connect",
}


def _transport_options(call: Call, scheme: str) -> tuple[str, ...]:
    """The transport options ``call`` takes with ``scheme://`` (the registry's table)."""
    registration = registry.lookup(scheme)
    return registration.connect_options if call == "connect" else registration.serve_options


def _all_transport_options() -> frozenset[str]:
    """Every transport option of any registered scheme: these are not session options."""
    return frozenset(
        name for scheme in registry.schemes() for call in _CALLS for name in _transport_options(call, scheme)
    )


def valid_options(call: Call, scheme: str) -> list[str]:
    """Every option ``call`` accepts with a ``scheme://`` URL, sorted."""
    shared = {name for name in SESSION_OPTIONS if _CALL_ONLY.get(name, call) == call}
    own = {name for name, only in _CALL_ONLY.items() if only == call}
    return sorted({*shared, *own, *_transport_options(call, scheme)})


def split_options(options: dict[str, Any], call: Call, ep: Endpoint) -> tuple[SessionConfig, dict[str, Any]]:
    """Check every option against ``call`` and the URL's scheme; returns (session config, transport options).

    A transport option set to None (or ``insecure=False``) is the same as leaving it out, so callers can
    pass e.g. ``fingerprint=server.fingerprint`` whatever the scheme. ``cert_dir=False`` is kept
    where the scheme takes cert_dir: it asks for a certificate in memory only (left out, cert_dir=
    means the default state directory); elsewhere there is no certificate, and it is left out too.
    """
    all_transport = _all_transport_options()
    allowed = set(valid_options(call, ep.scheme))
    given = {
        k: v
        for k, v in options.items()
        if not (
            k in all_transport
            and (v is None or (v is False and not (k in _FALSE_IS_A_CHOICE and k in allowed)))
        )
    }
    wrong = sorted(set(given) - allowed)
    if wrong:
        raise ConfigError(_not_applicable(wrong, call, ep.scheme))
    transport = {k: v for k, v in given.items() if k in all_transport}
    session = {k: v for k, v in given.items() if k not in all_transport}
    config = make_config(session)
    for name in ("open_timeout", "idle_timeout"):
        value = transport.get(name)
        if value is not None and (
            isinstance(value, bool) or not isinstance(value, int | float) or value <= 0
        ):
            raise ConfigError(f"{name}= takes a number of seconds above 0, not {value!r}")
    if "ssl" in transport and not isinstance(transport["ssl"], ssl_module.SSLContext):
        raise ConfigError(f"ssl= takes an ssl.SSLContext, not {type(transport['ssl']).__name__}")
    if call == "connect":
        from m2mwire.transport.tls import check_client_trust  # cryptography: only when TLS is used

        check_client_trust(transport)
    elif "certfile" in transport or "keyfile" in transport:
        from m2mwire.transport.tls import load_server_certificate

        load_server_certificate(transport.get("certfile"), transport.get("keyfile"))
    return config, transport


def _not_applicable(names: list[str], call: Call, scheme: str) -> str:
    reasons = []
    for name in names:
        schemes = [s for s in registry.schemes() if name in _transport_options(call, s)]
        other: Call = "serve" if call == "connect" else "connect"
        if schemes:
            reasons.append(
                f"{name}= applies to {call}() with {' and '.join(s + '://' for s in schemes)} only"
            )
        elif _CALL_ONLY.get(name) == other or any(
            name in _transport_options(other, s) for s in registry.schemes()
        ):
            reasons.append(f"{name}= is an option of {other}(), not of {call}()")
        else:
            reasons.append(f"unknown option {name}=")
    return f"{'; '.join(reasons)}. Options of {call}() with a {scheme}:// URL: " + ", ".join(
        valid_options(call, scheme)
    )
