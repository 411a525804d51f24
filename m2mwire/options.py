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
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal, TypedDict
from urllib.parse import urlsplit

from m2mwire.errors import ConfigError
from m2mwire.reconnect import Reconnect
from m2mwire.session.config import SESSION_OPTIONS, SessionConfig, make_config
from m2mwire.transport.nats.options import NATS_CLIENT_OPTIONS, NATS_SERVER_OPTIONS, parse_nats_url

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
    "load_server_certificate",
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
    reuse_port: bool  # ws://, wss://, quic://: SO_REUSEPORT, for several worker processes on one port
    on_hello: Callable[[Hello], Awaitable[None] | None] | None
    max_sessions: int | None
    max_sessions_per_peer: int | None
    ssl: ssl_module.SSLContext | None
    certfile: str | os.PathLike[str] | None
    keyfile: str | os.PathLike[str] | None
    cert_dir: str | os.PathLike[str] | None
    idle_timeout: float | None
    resume_window: float


Call = Literal["connect", "serve"]
Scheme = Literal["ws", "wss", "quic", "nats"]

_SCHEMES: tuple[Scheme, ...] = ("ws", "wss", "quic", "nats")
_DEFAULT_PORTS: dict[str, int] = {"ws": 80, "wss": 443, "quic": 4433, "nats": 4222}

# Transport options per call and scheme; every session option (SessionConfig's fields) applies to all.
_TRANSPORT_OPTIONS: dict[Call, dict[Scheme, tuple[str, ...]]] = {
    "connect": {
        "ws": ("open_timeout",),
        "wss": ("ssl", "cafile", "cadata", "fingerprint", "insecure", "open_timeout"),
        "quic": (
            "cafile",
            "cadata",
            "fingerprint",
            "insecure",
            "server_name",
            "open_timeout",
            "idle_timeout",
            "connection",
        ),
        "nats": ("open_timeout", *NATS_CLIENT_OPTIONS),
    },
    "serve": {  # reuse_port: SO_REUSEPORT, for several worker processes on one port
        "ws": ("reuse_port",),
        "wss": ("ssl", "certfile", "keyfile", "cert_dir", "reuse_port"),
        "quic": ("certfile", "keyfile", "idle_timeout", "cert_dir", "reuse_port"),
        "nats": NATS_SERVER_OPTIONS,
    },
}
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
_ALL_TRANSPORT = frozenset(
    name for by_scheme in _TRANSPORT_OPTIONS.values() for v in by_scheme.values() for name in v
)


@dataclass(frozen=True, slots=True)
class Endpoint:
    scheme: Scheme
    host: str
    port: int
    url: str


def parse_url(url: str) -> Endpoint:
    """``ws://``, ``wss://`` or ``quic://`` host and port; ConfigError says how to write anything else."""
    if not isinstance(url, str):
        raise ConfigError(f"the URL must be a str such as 'ws://127.0.0.1:8765', not {type(url).__name__}")
    if "://" not in url:
        raise ConfigError(f"URL {url!r} has no scheme: write ws://{url}, wss://{url} or quic://{url}")
    parts = urlsplit(url)
    scheme = parts.scheme.lower()
    if scheme == "nats":  # several hosts and a service subject: nats://h1:4222,h2:4222/agents.planner
        try:
            parse_nats_url(url)
        except ValueError as exc:
            raise ConfigError(str(exc)) from None
        return Endpoint("nats", "", 0, url)
    if scheme in ("http", "https"):
        secure = scheme == "https"
        raise ConfigError(
            f"{scheme}:// is not an m2mwire URL ({url!r}): use {'wss' if secure else 'ws'}:// for a "
            "WebSocket server or quic:// for a QUIC server"
        )
    if scheme not in _SCHEMES:
        raise ConfigError(
            f"unsupported URL scheme {parts.scheme!r} in {url!r}: use ws://, wss:// or quic:// "
            "(or nats://host:4222/service.subject)"
        )
    try:
        port = parts.port
    except ValueError as exc:  # urllib's "Port could not be cast to integer value" and out-of-range
        raise ConfigError(f"bad port in {url!r}: {exc}") from None
    host = parts.hostname or "127.0.0.1"
    return Endpoint(scheme, host, port if port is not None else _DEFAULT_PORTS[scheme], url)


def valid_options(call: Call, scheme: Scheme) -> list[str]:
    """Every option ``call`` accepts with a ``scheme://`` URL, sorted."""
    shared = {name for name in SESSION_OPTIONS if _CALL_ONLY.get(name, call) == call}
    own = {name for name, only in _CALL_ONLY.items() if only == call}
    return sorted({*shared, *own, *_TRANSPORT_OPTIONS[call][scheme]})


def split_options(options: dict[str, Any], call: Call, ep: Endpoint) -> tuple[SessionConfig, dict[str, Any]]:
    """Check every option against ``call`` and the URL's scheme; returns (session config, transport options).

    A transport option set to None (or ``insecure=False``) is the same as leaving it out, so callers can
    pass e.g. ``fingerprint=server.fingerprint`` whatever the scheme.
    """
    given = {k: v for k, v in options.items() if not (k in _ALL_TRANSPORT and (v is None or v is False))}
    allowed = set(valid_options(call, ep.scheme))
    wrong = sorted(set(given) - allowed)
    if wrong:
        raise ConfigError(_not_applicable(wrong, call, ep.scheme))
    transport = {k: v for k, v in given.items() if k in _ALL_TRANSPORT}
    session = {k: v for k, v in given.items() if k not in _ALL_TRANSPORT}
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
        _check_trust(transport)
    elif "certfile" in transport or "keyfile" in transport:
        load_server_certificate(transport.get("certfile"), transport.get("keyfile"))
    return config, transport


def _not_applicable(names: list[str], call: Call, scheme: Scheme) -> str:
    reasons = []
    for name in names:
        schemes = [s for s in _SCHEMES if name in _TRANSPORT_OPTIONS[call][s]]
        other: Call = "serve" if call == "connect" else "connect"
        if schemes:
            reasons.append(
                f"{name}= applies to {call}() with {' and '.join(s + '://' for s in schemes)} only"
            )
        elif _CALL_ONLY.get(name) == other or any(name in _TRANSPORT_OPTIONS[other][s] for s in _SCHEMES):
            reasons.append(f"{name}= is an option of {other}(), not of {call}()")
        else:
            reasons.append(f"unknown option {name}=")
    return f"{'; '.join(reasons)}. Options of {call}() with a {scheme}:// URL: " + ", ".join(
        valid_options(call, scheme)
    )


def _check_trust(transport: dict[str, Any]) -> None:
    """Contradictory verification options, a malformed fingerprint, a missing or unreadable cafile."""
    from m2mwire.transport.tls import check_trust_options

    try:
        check_trust_options(
            cafile=transport.get("cafile"),
            cadata=transport.get("cadata"),
            fingerprint=transport.get("fingerprint"),
            insecure=bool(transport.get("insecure", False)),
        )
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    cafile, cadata = transport.get("cafile"), transport.get("cadata")
    if cafile is None and cadata is None:
        return
    if cafile is not None and not os.path.isfile(cafile):
        raise ConfigError(
            f"cafile={os.fspath(cafile)!r}: no such file. Pass the PEM file of the CA that signed the "
            "server's certificate (or the server's own certificate), or pin fingerprint= instead"
        )
    try:  # the same loader the transports use, so what passes here loads there too
        ssl_module.create_default_context(
            cafile=cafile, cadata=cadata.decode("ascii") if isinstance(cadata, bytes) else cadata
        )
    except (ssl_module.SSLError, OSError, ValueError, UnicodeDecodeError) as exc:
        what = f"cafile={os.fspath(cafile)!r}" if cafile is not None else "cadata="
        raise ConfigError(f"{what} holds no usable PEM certificate: {exc}") from None


def load_server_certificate(certfile: Any, keyfile: Any) -> ssl_module.SSLContext:
    """A server TLS context from ``certfile``/``keyfile``; ConfigError when they do not load.

    Checked when serve() is called: QUIC (aioquic) would otherwise accept a certificate without its
    key at start and fail every client's handshake.
    """
    from m2mwire.transport.tls import server_ssl_context

    if certfile is None:
        raise ConfigError("keyfile= needs certfile= (the certificate chain, PEM)")
    for name, path in (("certfile", certfile), ("keyfile", keyfile)):
        if path is not None and not os.path.isfile(path):
            raise ConfigError(f"{name}={os.fspath(path)!r}: no such file")
    try:
        return server_ssl_context(certfile, keyfile)
    except (ssl_module.SSLError, OSError, ValueError) as exc:
        hint = (
            "; pass keyfile= with the private key (PEM) unless certfile holds both" if keyfile is None else ""
        )
        raise ConfigError(
            f"cannot load the server certificate certfile={os.fspath(certfile)!r}"
            + (f" keyfile={os.fspath(keyfile)!r}" if keyfile is not None else "")
            + f": {exc}{hint}"
        ) from None
