"""Opening a session channel to a NATS service, and serving one as a queue-group member.

The transport handshake (before the session's HELLO) is one NATS request on the service subject:
OPEN (JSON: the client's subject and window) answered by one worker of the queue group with
OPEN_OK (JSON: the worker's subject, window, and the worker's own subject). nats-server's "no
responders" answer tells a client at once that no worker serves the subject.

A client that reconnects to resume a session sends its OPEN to the worker's own subject instead
(the channel's ``resume_route``, from OPEN_OK), since the queue group would hand it to any worker
and only the one that holds the session can resume it. "No responders" there, a few times in a
row, means that worker is gone: :class:`~m2mwire.errors.ResumeImpossible` ends the session at once.
"""

from __future__ import annotations

import asyncio
import json
import logging
import secrets
from collections.abc import Awaitable, Callable
from typing import Any

from nats.aio.msg import Msg
from nats.aio.subscription import Subscription
from nats.errors import Error as NatsError
from nats.errors import NoRespondersError
from nats.errors import TimeoutError as NatsTimeoutError

from m2mwire.codecs.limits import MiB
from m2mwire.errors import ConfigError, ResumeImpossible, TransportError
from m2mwire.schemas.codes import CloseCode
from m2mwire.transport.nats import frames as f
from m2mwire.transport.nats.bus import Bus, acquire_bus, release_bus
from m2mwire.transport.nats.channel import NatsChannel
from m2mwire.transport.nats.options import parse_nats_url, valid_subject

__all__ = ["NatsListener", "check_nats_window", "open_nats_channel", "serve_nats"]

log = logging.getLogger("m2mwire.nats")

OPEN_VERSION = 1
DEFAULT_WINDOW = 8 * MiB
DEFAULT_PROBE_INTERVAL = 5.0
DEFAULT_QUEUE = "m2mwire"
# Channels opened whose HELLO has not arrived yet, per worker. An OPEN costs its sender one small
# NATS message and nothing to hold, and the worker ~19 KiB (channel, session, handler task) until
# the HELLO or hello_timeout (30 s): past this many, the oldest is dropped (ABORT 1013) to make
# room. A client sends its HELLO one round trip after OPEN_OK, so a flood of OPENs drops only
# channels older than max_half_open / (OPENs per second): 25 ms at 10,000 OPENs/s.
DEFAULT_MAX_HALF_OPEN = 256
_SHED_LOG_EVERY = 60.0  # seconds between two warnings about half-open channels dropped
# OPENs waiting to be served, per subscription, in multiples of nats_max_half_open: beyond it
# nats-py drops them unread (their requesters time out). Serving one costs ~0.2-0.35 ms of CPU
# (a channel, a session, a task), so the default 1,024 is at most ~0.4 s of work queued: a
# burst of OPENs (stop 32's attack: 50,000 in 0.2 s) no longer queues minutes of work, served
# long after every requester gave up, nor memory (~300 MiB).
_BACKLOG_PER_HALF_OPEN = 4
_MAX_OPEN = 4096  # an OPEN request is a few hundred bytes; anything larger is refused unread
# A resuming OPEN answered "no responders" this many times in a row, this many seconds apart,
# means the worker is gone. Not the first answer: a worker whose NATS node died is unsubscribed
# until nats-py has reconnected it to another node (at once, on a cluster), as the liveness probe
# also allows for (channel._MISSED_PROBES).
_GONE_ANSWERS = 3
_GONE_EVERY = 1.0


def check_nats_window(options: dict[str, Any]) -> int:
    """``nats_window=``, checked (ConfigError names the option)."""
    window = options.get("nats_window", DEFAULT_WINDOW)
    if type(window) is not int or not 0 < window <= f.MAX_WINDOW:
        raise ConfigError(
            f"nats_window= must be a number of bytes (an int up to 2**64 - 1; values below "
            f"{f.MIN_WINDOW} or 4 x the NATS server's max_payload are raised to that), not {window!r}"
        )
    return window


def _window(bus: Bus, options: dict[str, Any]) -> int:
    # At least four NATS messages, so a full-size chunk always fits in a quarter of the window.
    return min(max(check_nats_window(options), 4 * bus.nc.max_payload, f.MIN_WINDOW), f.MAX_WINDOW)


def _open_ok(reply: Msg, service: str) -> dict[str, Any]:
    """The JSON object of a worker's answer to our OPEN; TransportError when it is none, or says
    why the worker refused the OPEN."""
    try:
        answer = json.loads(reply.data)
    except (ValueError, RecursionError) as exc:  # RecursionError: JSON nested too deeply
        raise TransportError(f"malformed OPEN_OK from the worker of {service!r}: {exc}") from exc
    if not isinstance(answer, dict):
        raise TransportError(f"malformed OPEN_OK from the worker of {service!r}: {answer!r}"[:300])
    if "error" in answer:  # the worker read our OPEN and refused it, saying why
        raise TransportError(f"the worker of {service!r} refused the OPEN: {answer['error']}"[:300])
    return answer


async def _respond(msg: Msg, answer: dict[str, Any], service: str) -> bool:
    """Answer an OPEN; False when NATS would not take the answer (logged)."""
    try:
        await msg.respond(json.dumps(answer).encode())
    except NatsError as exc:
        log.info("could not answer OPEN on %s: %s", service, exc)
        return False
    return True


def _probe_interval(options: dict[str, Any]) -> float:
    return float(options.get("probe_interval", DEFAULT_PROBE_INTERVAL) or 0.0)


async def _request_open(
    bus: Bus, subject: str, request: bytes, timeout: float, service: str, servers: str
) -> Msg:
    """One OPEN request; TransportError (the reconnect loop tries again) when nobody answers."""
    try:
        return await bus.nc.request(subject, request, timeout=timeout)
    except NoRespondersError:
        raise TransportError(
            f"no worker serves {service!r} on NATS {servers} "
            "(nothing is subscribed to that subject: start one with m2mwire.serve(handler, url))"
        ) from None
    except (TimeoutError, NatsTimeoutError):
        raise TransportError(
            f"no worker of {service!r} answered within {timeout:g} s (open_timeout=)"
        ) from None
    except NatsError as exc:
        raise TransportError(f"could not open a NATS session on {service!r}: {exc}") from exc


async def _request_resume_open(bus: Bus, route: str, request: bytes, timeout: float, service: str) -> Msg:
    """OPEN on the worker's own subject; ResumeImpossible once "no responders" says it is gone."""
    for answer in range(1, _GONE_ANSWERS + 1):
        try:
            return await bus.nc.request(route, request, timeout=timeout)
        except NoRespondersError:
            if answer == _GONE_ANSWERS:
                break
            await asyncio.sleep(_GONE_EVERY)
        except (TimeoutError, NatsTimeoutError):
            raise TransportError(
                f"the worker of {service!r} holding this session did not answer within {timeout:g} s "
                "(open_timeout=)"
            ) from None
        except NatsError as exc:
            raise TransportError(f"could not reach the worker of {service!r}: {exc}") from exc
    raise ResumeImpossible(
        f"the NATS worker of {service!r} that held this session is gone: nothing listened on its "
        f"subject for {_GONE_ANSWERS} attempts {_GONE_EVERY:g} s apart (its process ended, lost its "
        "NATS connection or stopped serving); open a new session"
    )


async def open_nats_channel(
    url: str,
    *,
    max_message_size: int,
    options: dict[str, Any],
    open_timeout: float = 10.0,
    resume_route: str | None = None,
) -> NatsChannel:
    """Ask the service named by ``url`` for a session channel; one worker answers. With
    ``resume_route`` (a previous channel's), ask the worker that holds the session being resumed."""
    target = parse_nats_url(url, options)
    bus = await acquire_bus(target, options)
    channel: NatsChannel | None = None
    try:
        window = _window(bus, options)
        channel = NatsChannel(
            bus,
            f"{await bus.client_subjects()}.{secrets.token_hex(16)}",  # 128 random bits: unguessable
            max_message_size=max_message_size,
            window=window,
            remote_address=f"nats:{target.subject}",
            probe_interval=_probe_interval(options),
        )
        request = {"v": OPEN_VERSION, "subject": channel.in_subject, "window": window, "peer": bus.label}
        body = json.dumps(request).encode()
        if resume_route is None:
            servers = ", ".join(target.servers)
            reply = await _request_open(bus, target.subject, body, open_timeout, target.subject, servers)
        else:
            reply = await _request_resume_open(bus, resume_route, body, open_timeout, target.subject)
        answer = _open_ok(reply, target.subject)
        subject, peer_window = answer.get("subject"), answer.get("window")
        worker = answer.get("worker", resume_route)  # absent: a worker that cannot be reached again
        if (
            answer.get("v") != OPEN_VERSION
            or not isinstance(subject, str)
            or not valid_subject(subject)
            or not isinstance(peer_window, int)
            or f.window_error(peer_window) is not None
            or (worker is not None and not valid_subject(worker))
        ):
            raise TransportError(f"the worker of {target.subject!r} answered OPEN with {answer!r}"[:300])
        channel.connect_peer(subject, peer_window)
        channel.resume_route = worker
        channel.owns_bus = True
        return channel
    except BaseException:
        if channel is not None:
            channel._unroute()
        await release_bus(bus)
        raise


class NatsListener:
    """A queue-group member of one NATS service: each OPEN becomes a channel and a handler task."""

    def __init__(
        self,
        handler: Callable[[NatsChannel], Awaitable[None]],
        url: str,
        *,
        max_message_size: int,
        options: dict[str, Any],
    ) -> None:
        self._handler = handler
        self.url = url
        self._target = parse_nats_url(url, options)
        self._options = options
        self._max = max_message_size
        self._bus: Bus | None = None
        self._sub: Subscription | None = None
        self._own_sub: Subscription | None = None  # the worker's own subject (resuming OPENs)
        self._prefix = ""
        self._tasks: set[asyncio.Task[None]] = set()
        self._closed = asyncio.Event()
        self._half_open: dict[NatsChannel, None] = {}  # oldest first (see DEFAULT_MAX_HALF_OPEN)
        self._max_half_open = int(options.get("nats_max_half_open", DEFAULT_MAX_HALF_OPEN))
        if self._max_half_open < 1:
            raise ConfigError(f"nats_max_half_open= must be at least 1, not {self._max_half_open}")
        check_nats_window(options)  # a bad nats_window= fails here, not at every OPEN
        self.shed = 0  # half-open channels dropped to make room
        self._shed_logged_at = -_SHED_LOG_EVERY

    @property
    def subject(self) -> str:
        return self._target.subject

    async def start(self) -> None:
        self._bus = bus = await acquire_bus(self._target, self._options)
        try:
            # Session subjects of this worker: a random process prefix under the service, so a
            # deployment can give workers "subscribe _M2M.<service>.>" and clients "publish" to it.
            # The prefix itself is the worker's own subject (outside the prefix's "*" wildcard),
            # where clients resuming one of its sessions send their OPEN.
            self._prefix = f"_M2M.{self._target.subject}.{secrets.token_hex(8)}"
            await bus.subscribe_prefix(self._prefix)
            backlog = _BACKLOG_PER_HALF_OPEN * self._max_half_open
            self._own_sub = await bus.subscribe_service(
                self._prefix, "", self._on_resume_open, backlog=backlog, max_size=_MAX_OPEN
            )
            queue = str(self._options.get("queue", DEFAULT_QUEUE))
            self._sub = await bus.subscribe_service(
                self._target.subject, queue, self._on_open, backlog=backlog, max_size=_MAX_OPEN
            )
            await bus.nc.flush(timeout=5)  # the subscriptions are in place when start() returns
        except BaseException:
            await release_bus(bus)
            self._bus = None
            raise

    async def _on_open(self, msg: Msg) -> None:
        """An OPEN from the queue group: a new session, taken until close()."""
        if not self._closed.is_set():
            await self._accept(msg)
        # nats-py calls us for each waiting OPEN in turn without giving the event loop back (its
        # queue has them; our answer only fills a buffer): a backlog of OPENs held the loop, and
        # every session of this worker, until it was served (stop 32's attack: a round trip of
        # 16.6 s). One OPEN per loop turn lets them run in between.
        await asyncio.sleep(0)

    async def _on_resume_open(self, msg: Msg) -> None:
        """An OPEN on this worker's own subject: taken until wait_closed(), so the sessions of a
        worker that stopped taking new ones (close(), e.g. while it is being replaced) can still
        be resumed while they run (the session layer checks the resume token). Only this worker's
        own clients learn the subject, from OPEN_OK."""
        await self._accept(msg)
        await asyncio.sleep(0)  # see _on_open

    async def _accept(self, msg: Msg) -> None:
        bus = self._bus
        if bus is None or not msg.reply:
            return
        try:
            if len(msg.data) > _MAX_OPEN:
                raise ValueError("too large")
            request = json.loads(msg.data)
            subject, window = str(request["subject"]), request["window"]
            # The subject is written into our NATS protocol lines: see valid_subject. Such an
            # OPEN gets no answer at all (nor does one that is not an OPEN).
            if not valid_subject(subject):
                raise ValueError(f"unsupported OPEN {request!r}"[:200])
        except (ValueError, KeyError, TypeError, RecursionError) as exc:  # (JSON nested too deeply)
            log.info("malformed OPEN on %s: %s", self._target.subject, str(exc)[:200])
            return
        # An OPEN we can read but not serve is told why, so its client fails at once with the
        # reason instead of after open_timeout (a later version of the OPEN, a window no chunk fits).
        why = (
            f"OPEN version {request.get('v')!r} is not supported; this worker speaks {OPEN_VERSION}"[:120]
            if request.get("v") != OPEN_VERSION
            else f.window_error(window)
        )
        if why is not None:
            log.info("refused OPEN on %s: %s", self._target.subject, why)
            await _respond(msg, {"v": OPEN_VERSION, "error": why}, self._target.subject)
            return
        assert isinstance(window, int)  # window_error said so
        own_window = _window(bus, self._options)
        peer = str(request.get("peer", "nats-client"))[:64]
        if not peer.isprintable():  # it goes into logs as the session's remote address
            peer = "nats-client"
        channel = NatsChannel(
            bus,
            f"{self._prefix}.{secrets.token_hex(16)}",
            max_message_size=self._max,
            window=own_window,
            remote_address=f"{peer}:0",
            probe_interval=_probe_interval(self._options),
        )
        channel.connect_peer(subject, window)
        self._admit_half_open(channel)
        answer = {
            "v": OPEN_VERSION,
            "subject": channel.in_subject,
            "window": own_window,
            "worker": self._prefix,  # where this client resumes the session (see _on_resume_open)
        }
        if not await _respond(msg, answer, self._target.subject):
            channel._unroute()
            return
        task = asyncio.create_task(self._run(channel), name="m2mwire-nats-session")
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _admit_half_open(self, channel: NatsChannel) -> None:
        half_open = self._half_open
        while len(half_open) >= self._max_half_open:
            oldest = next(iter(half_open))
            # abort() ends the channel, whose watch_opening callback removes it from half_open.
            oldest.abort(CloseCode.TRY_AGAIN_LATER, "too many sessions opening at once; try again")
            self.shed += 1
        now = asyncio.get_running_loop().time()
        if self.shed and now - self._shed_logged_at >= _SHED_LOG_EVERY:
            self._shed_logged_at = now
            log.warning(
                "%d NATS session(s) on %s dropped so far before their HELLO: OPENs arrive faster "
                "than HELLOs follow them (over nats_max_half_open=%d)",
                self.shed,
                self._target.subject,
                self._max_half_open,
            )
        half_open[channel] = None
        channel.watch_opening(self._half_open_done)

    def _half_open_done(self, channel: NatsChannel) -> None:
        self._half_open.pop(channel, None)

    async def _run(self, channel: NatsChannel) -> None:
        try:
            await self._handler(channel)
        finally:
            channel.abort()  # a no-op after an orderly close

    def close(self) -> None:
        """Stop taking new sessions (sessions already running go on, and can be resumed, until
        wait_closed())."""
        if self._closed.is_set():
            return
        self._closed.set()
        if self._sub is not None:
            sub, self._sub = self._sub, None
            task = asyncio.ensure_future(_unsubscribe(sub))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def wait_closed(self) -> None:
        self.close()
        if self._tasks:
            await asyncio.wait(list(self._tasks), timeout=10)
        for task in list(self._tasks):
            task.cancel()
        if self._own_sub is not None:
            # The shared connection may outlive this worker (other users): from now on a resuming
            # client gets "no responders" here, and learns that the worker is gone.
            sub, self._own_sub = self._own_sub, None
            await _unsubscribe(sub)
        if self._bus is not None:
            bus, self._bus = self._bus, None
            await release_bus(bus)


async def _unsubscribe(sub: Subscription) -> None:
    try:
        await sub.unsubscribe()
    except NatsError as exc:
        log.debug("unsubscribing the service: %s", exc)


async def serve_nats(
    handler: Callable[[NatsChannel], Awaitable[None]],
    url: str,
    *,
    max_message_size: int,
    options: dict[str, Any],
) -> NatsListener:
    """Join the service of ``url`` as one worker of its queue group; ``handler(channel)`` per session."""
    listener = NatsListener(handler, url, max_message_size=max_message_size, options=options)
    await listener.start()
    return listener
