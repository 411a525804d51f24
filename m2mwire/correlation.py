"""Matching answers to requests on one session (``Session.request``/``stream``/``reply``).

The wire side lives in the session core (the ``request_id``/``reply_to``/``more`` fields of a DATA
payload, or reserved keys of an AVP frame's ``extra`` map); this module only keeps, for one
session, which of our requests still wait for answers and hands each answer to its waiter. It
has no I/O and no protocol rules: the shell calls :meth:`Correlator.route` for every received
answer and :meth:`Correlator.fail_all` when the session ends.

Why ids are a per-session counter: an id only has to be unique among this session's requests in
flight, and the peer echoes it verbatim; a counter never repeats within a session (a Python int
does not wrap), costs nothing, and reveals nothing the peer does not already know.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from dataclasses import dataclass, field

from m2mwire.errors import M2MError
from m2mwire.session.payload import Message, queued_cost

__all__ = ["Correlator", "Stream"]

log = logging.getLogger("m2mwire.session")


@dataclass(slots=True, eq=False)
class Stream:
    """The answers to one ``stream()`` request, in arrival order, until the one with more=False."""

    parts: deque[Message] = field(default_factory=deque)
    waiter: asyncio.Future[None] | None = None
    ended: bool = False  # the last part (more=False) arrived
    error: M2MError | None = None  # the session ended before the last part

    def _wake(self) -> None:
        if self.waiter is not None and not self.waiter.done():
            self.waiter.set_result(None)
        self.waiter = None


class Correlator:
    """Requests of one session that wait for answers."""

    def __init__(self) -> None:
        self._next = 0
        self._requests: dict[str, asyncio.Future[Message]] = {}
        self._streams: dict[str, Stream] = {}
        # Stream parts received and not yet taken, in messages and in queued_cost() bytes: they
        # count toward the session's max_queue / max_queue_bytes like the inbox does.
        self.buffered = 0
        self.buffered_bytes = 0

    def new_id(self) -> str:
        self._next += 1
        return format(self._next, "x")

    def expect_one(self, request_id: str) -> asyncio.Future[Message]:
        future: asyncio.Future[Message] = asyncio.get_running_loop().create_future()
        self._requests[request_id] = future
        return future

    def expect_stream(self, request_id: str) -> Stream:
        stream = Stream()
        self._streams[request_id] = stream
        return stream

    def forget(self, request_id: str, stream: Stream | None = None) -> None:
        """The waiter is gone (answered, timed out, cancelled, loop left early): later answers to
        ``request_id`` are dropped, and parts of ``stream`` nobody will take stop counting."""
        self._requests.pop(request_id, None)
        self._streams.pop(request_id, None)
        if stream is not None:
            self.buffered -= len(stream.parts)
            self.buffered_bytes -= sum(queued_cost(part) for part in stream.parts)
            stream.parts.clear()

    def route(self, message: Message) -> None:
        """Hand an answer (``message.reply_to`` set) to its waiter; drop it when nobody waits."""
        request_id = message.reply_to
        assert request_id is not None
        future = self._requests.pop(request_id, None)
        if future is not None:
            if not future.done():
                future.set_result(message)
            return
        stream = self._streams.get(request_id)
        if stream is None:
            # A late answer (the request timed out or was cancelled) or one to nothing we asked:
            # never delivered to recv(), as the API promises.
            log.debug("dropping an answer to request %r, which nobody waits for", request_id[:40])
            return
        stream.parts.append(message)
        self.buffered += 1
        self.buffered_bytes += queued_cost(message)
        if not message.more:
            stream.ended = True
            del self._streams[request_id]
        stream._wake()

    def take(self, stream: Stream) -> Message | None:
        """The next part of ``stream``, or None when none has arrived yet."""
        if not stream.parts:
            return None
        self.buffered -= 1
        part = stream.parts.popleft()
        self.buffered_bytes -= queued_cost(part)
        return part

    def fail_all(self, error: M2MError) -> None:
        """The session ended: every waiter gets ``error`` (after the parts that did arrive)."""
        for future in self._requests.values():
            if not future.done():
                future.set_exception(error)
                future.exception()  # retrieved: a waiter that was cancelled never reads it
        self._requests.clear()
        for stream in self._streams.values():
            stream.error = error
            stream._wake()
        self._streams.clear()
