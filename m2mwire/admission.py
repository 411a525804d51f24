"""Server admission: who may open a session (``serve(on_hello=..., max_sessions=..., ...)``).

The session core reports a HELLO that negotiation accepted as a ``HelloReceived`` event and waits
for a verdict; this module decides it: the server-wide and per-host session limits first (cheap,
and they must hold even while checks are slow), then the application's ``on_hello`` check, which
may be a coroutine. A slot is reserved before the check runs, so many HELLOs arriving at once
cannot all pass a limit that only one of them fits under.
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from m2mwire.errors import ConfigError, Reject
from m2mwire.schemas.codes import RejectCode
from m2mwire.schemas.identity import ModelIdentity
from m2mwire.schemas.messages import Capabilities, LatentCaps

__all__ = ["Admission", "Hello", "HelloCheck"]

log = logging.getLogger("m2mwire.server")


@dataclass(frozen=True, slots=True)
class Hello:
    """What ``on_hello`` sees of a client's HELLO (and of its connection)."""

    agent_id: str
    agent_type: str
    token: str | None  # the client's connect(token=...); None when it sent none
    remote_address: tuple[str, int]  # (host, port) of the connection
    algorithms: tuple[str, ...]  # offered, as sent
    encodings: tuple[str, ...]  # offered, as sent
    identity: ModelIdentity | None  # offered model identity (latent mode), if any
    version: str

    @classmethod
    def from_capabilities(cls, caps: Capabilities, remote_address: tuple[str, int]) -> Hello:
        avp = caps.avp
        return cls(
            agent_id=caps.agent_id,
            agent_type=caps.agent_type,
            token=caps.token if isinstance(caps.token, str) else None,
            remote_address=remote_address,
            algorithms=tuple(caps.compression.algorithms),
            encodings=tuple(caps.compression.encodings),
            identity=avp.identity if isinstance(avp, LatentCaps) else None,
            version=caps.version,
        )


HelloCheck = Callable[[Hello], Awaitable[None] | None]


def split_address(address: str) -> tuple[str, int]:
    """``"host:port"`` / ``"[v6]:port"`` (a channel's remote_address) as (host, port)."""
    host, sep, port = address.rpartition(":")
    if not sep:
        return (address, 0)
    try:
        return (host.strip("[]"), int(port))
    except ValueError:
        return (address, 0)


class Admission:
    """The admission rules of one server, and the sessions they currently count."""

    def __init__(
        self,
        on_hello: HelloCheck | None = None,
        *,
        max_sessions: int | None = None,
        max_sessions_per_peer: int | None = None,
    ) -> None:
        for name, value in (("max_sessions", max_sessions), ("max_sessions_per_peer", max_sessions_per_peer)):
            if value is not None and (not isinstance(value, int) or value < 1):
                raise ConfigError(f"{name}= must be a positive int or None (no limit), not {value!r}")
        if on_hello is not None and not callable(on_hello):
            raise ConfigError(f"on_hello= takes a function of one Hello argument, not {on_hello!r}")
        self.on_hello = on_hello
        self.max_sessions = max_sessions
        self.max_sessions_per_peer = max_sessions_per_peer
        self.total = 0
        self._per_host: dict[str, int] = {}
        # Set by Server.close(): no new session from then on. A transport may still bring
        # connections after it (a NATS worker takes OPENs on its own subject until
        # wait_closed(), so that its sessions can be resumed): their new HELLOs are refused.
        self.closing = False

    @property
    def active(self) -> bool:
        """Whether HELLOs need a verdict at all (otherwise the core accepts them itself)."""
        return (
            self.closing
            or self.on_hello is not None
            or self.max_sessions is not None
            or self.max_sessions_per_peer is not None
        )

    async def decide(self, hello: Hello) -> Reject | None:
        """None to accept (a slot is then held until :meth:`release`), or the Reject to send."""
        if self.closing:
            return Reject(
                RejectCode.RATE_LIMITED, "the server is shutting down and takes no new session; connect again"
            )
        host = hello.remote_address[0]
        if self.max_sessions is not None and self.total >= self.max_sessions:
            return Reject(
                RejectCode.RATE_LIMITED, f"the server is at its limit of {self.max_sessions} sessions"
            )
        held = self._per_host.get(host, 0)
        if self.max_sessions_per_peer is not None and held >= self.max_sessions_per_peer:
            return Reject(
                RejectCode.RATE_LIMITED, f"at most {self.max_sessions_per_peer} sessions per client address"
            )
        self.total += 1
        self._per_host[host] = held + 1
        verdict: Reject | None = None
        try:
            if self.on_hello is not None:
                result = self.on_hello(hello)
                if inspect.isawaitable(result):
                    await result
        except Reject as exc:
            verdict = exc
        except Exception:
            # The application's check failed: refuse (never admit on an error), say nothing of
            # its internals to the client, and leave the traceback to the server's log.
            log.exception("on_hello check failed for %s from %s", hello.agent_id[:64], host)
            verdict = Reject(RejectCode.UNKNOWN, "the server's admission check failed")
        except BaseException:
            self.release(host)
            raise
        if verdict is not None:
            self.release(host)
        return verdict

    def release(self, host: str) -> None:
        self.total -= 1
        left = self._per_host.get(host, 1) - 1
        if left > 0:
            self._per_host[host] = left
        else:
            self._per_host.pop(host, None)
