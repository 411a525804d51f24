"""NATS URLs and the options passed through to nats-py (no nats-py import here)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

__all__ = [
    "NATS_CLIENT_OPTIONS",
    "NATS_OPTIONS",
    "NATS_SERVER_OPTIONS",
    "NatsTarget",
    "nats_connect_kwargs",
    "parse_nats_url",
    "valid_subject",
]

# Keyword options of connect()/serve()/gateway() that configure the NATS connection or this
# transport. The nats-py names are kept where they do not clash with a session option: the NATS
# token is ``nats_token`` because ``token=`` is the session credential sent in HELLO.
NATS_OPTIONS = frozenset(
    {
        "servers",  # extra server URLs (the URL's hosts come first)
        "user",
        "password",
        "nats_token",
        "credentials",  # a .creds file (JWT + NKey seed), nats-py's user_credentials
        "nkeys_seed",
        "tls",  # an ssl.SSLContext for tls:// NATS servers
        "tls_hostname",
        "inbox_prefix",  # where this process's client subjects live (default _INBOX)
        "name",  # the connection name shown by nats-server's monitoring
        "reconnect_time_wait",
        "max_reconnect_attempts",
        "connect_timeout",
        "nats_options",  # a dict passed verbatim to nats.connect() for anything else
        "queue",  # the queue group workers of one service join (default "m2mwire")
        "nats_window",  # credit window per session and direction, in bytes
        "probe_interval",  # seconds between liveness probes of an idle peer (0 = off)
        "nats_max_half_open",  # worker: sessions opened but not yet sent their HELLO, at most
    }
)

# serve() takes every one of them; connect() all but the worker's own.
NATS_SERVER_OPTIONS = tuple(sorted(NATS_OPTIONS))
_WORKER_ONLY = ("queue", "nats_max_half_open")
NATS_CLIENT_OPTIONS = tuple(name for name in NATS_SERVER_OPTIONS if name not in _WORKER_ONLY)

# Our option name -> nats.connect() keyword.
_RENAMED = {"nats_token": "token", "credentials": "user_credentials"}
_PASSED = (
    "user",
    "password",
    "nats_token",
    "credentials",
    "nkeys_seed",
    "tls",
    "tls_hostname",
    "inbox_prefix",
    "name",
    "reconnect_time_wait",
    "max_reconnect_attempts",
    "connect_timeout",
)


@dataclass(frozen=True, slots=True)
class NatsTarget:
    """Where a nats:// URL points: NATS server URLs and the service subject."""

    servers: tuple[str, ...]
    subject: str


def parse_nats_url(url: str, options: dict[str, Any] | None = None) -> NatsTarget:
    """``nats://h1:4222,h2:4222/agents.planner`` -> servers and subject.

    User and password in the URL are kept on each server URL (nats-py reads them there).
    """
    parts = urlsplit(url)
    if parts.scheme.lower() != "nats":
        raise ValueError(f"not a nats:// URL: {url!r}")
    subject = parts.path.lstrip("/").replace("/", ".")
    if not subject or any(not token or " " in token for token in subject.split(".")):
        raise ValueError(
            f"{url!r} names no valid service subject: write nats://host:4222/agents.planner "
            "(dot-separated tokens, no wildcards)"
        )
    if "*" in subject or ">" in subject:
        raise ValueError(f"the service subject in {url!r} may not contain wildcards (* or >)")
    userinfo, _, hosts = parts.netloc.rpartition("@")
    prefix = f"{userinfo}@" if userinfo else ""
    for host in hosts.split(","):
        _, colon, port = host.rpartition(":")
        if colon and "]" not in port and not (port.isdigit() and 0 < int(port) < 65536):
            raise ValueError(f"bad port {port!r} in {url!r}: write nats://host:4222/{subject}")
    servers = [f"nats://{prefix}{host}" for host in hosts.split(",") if host] or ["nats://127.0.0.1:4222"]
    extra = (options or {}).get("servers")
    if extra:
        servers.extend([extra] if isinstance(extra, str) else list(extra))
    return NatsTarget(tuple(dict.fromkeys(servers)), subject)


def nats_connect_kwargs(options: dict[str, Any]) -> dict[str, Any]:
    """The nats.connect() keywords among ``options`` (renamed where ours differ)."""
    kwargs = {_RENAMED.get(name, name): options[name] for name in _PASSED if name in options}
    kwargs.update(options.get("nats_options") or {})
    return kwargs


def valid_subject(subject: object) -> bool:
    """Whether ``subject``, given by a peer, is one concrete NATS subject we may publish to: a
    non-empty string of non-empty dot-separated tokens with no wildcard, no whitespace and no
    control character. nats-py writes a subject into its protocol line as it is (``PUB <subject>
    <size>``), so a CR/LF or space in one would let the peer that chose it write NATS commands on
    our connection, shared by every session of the process."""
    return (
        isinstance(subject, str)
        and subject.isprintable()
        and not any(c in subject for c in "*> ")
        and all(subject.split("."))
    )
