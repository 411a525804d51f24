"""The nats-py internals the NATS transport relies on, in one place, checked at import.

Three things here reach past nats-py's public API, each read against nats-py :data:`VERIFIED_MINOR`.
Importing this module with another version, or with one of the fields used missing, raises
:class:`m2mwire.errors.UnsupportedDependency` naming the supported versions.

- :func:`publish_now`: nats-py's ``publish()`` is a coroutine, although for a connected client with
  room in its pending buffer it never waits: it appends the PUB command to the buffer and wakes the
  flusher task. The channel's ``send_now`` (the transport contract's synchronous write, see
  ``transport.base``) needs exactly that step without the coroutine. It also takes the payload in
  two parts (our header, the message body) and queues them as they are: ``publish()`` would copy
  the payload twice building the command, and the flusher joins the buffer into one write anyway.
- :class:`DirectParser` (installed by :func:`install_parser`): nats-py's protocol parser with two
  changes. Messages of a subscription registered with :func:`route_directly` go to a plain
  function at once, from the read loop, instead of through a ``Msg``, the subscription's queue and
  its task (one event-loop turn per batch, and the task's await per message); and a large payload
  that spans several socket reads is read straight into a buffer of its own, which the function
  receives (nats-py copies it three times). Everything else is parsed and dispatched as nats-py does.
- The connection's ``asyncio.StreamReader`` (stdlib internals, checked here too): its
  ``feed_data`` goes to :meth:`DirectParser._feed`, which hands routed messages on at once while
  the read loop waits with nothing buffered (an event-loop turn sooner), and copies the rest of a
  big payload straight into the payload's buffer. The StreamReader would copy every read twice
  (into its buffer, and out of it for ``read()``) and wake the read loop for it.
- :func:`publish_now` writes a large body with ``os.writev`` on the connection's socket, beside
  our header, where asyncio's transport (Python 3.11: ``writelines`` joins) would need them joined
  (plain TCP only: over TLS the bytes must go through the TLS transport, :func:`_plain_socket`).
- :func:`discard_pending`: nats-py's ``close()`` writes what its pending buffer holds and awaits
  the socket's drain *before* it cancels the subscriptions' tasks and closes the transport; on a
  connection that died (the server gone, the client reconnecting) that write raises, and
  ``close()`` stops there, leaving the error to our caller and the tasks and socket behind.
  Dropping the pending commands first (they can reach no one) lets ``close()`` finish.
- :data:`READ_SIZE`: nats-py reads its socket through an ``asyncio.StreamReader`` whose limit and
  read size are the module constant ``DEFAULT_BUFFER_SIZE`` (32 KiB): the reader stops reading the
  socket at 64 KiB buffered, so a 1 MiB message took 32 reads and 16 pauses and resumes of the
  socket. We raise that constant, before any connection is made; a larger read returns what is
  there, so other nats-py clients of the process only read in larger pieces too.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
from collections.abc import Callable, Sequence
from typing import cast

import nats.aio.client as nats_client
from nats.aio.client import Client
from nats.aio.subscription import Subscription
from nats.aio.transport import TcpTransport
from nats.errors import ProtocolError
from nats.protocol import parser as nats_parser
from nats.protocol.parser import (
    AWAITING_CONTROL_LINE,
    AWAITING_MSG_PAYLOAD,
    CRLF_SIZE,
    ERR_RE,
    HMSG_RE,
    INFO_RE,
    MAX_CONTROL_LINE_SIZE,
    MSG_RE,
    OK_RE,
    PING_RE,
    PONG_RE,
    Parser,
)

from m2mwire.transport.pinned import Pinned

__all__ = [
    "BIG_PAYLOAD",
    "READ_SIZE",
    "VERIFIED_MINOR",
    "WRITEV_BODY",
    "DirectParser",
    "Route",
    "check_attributes",
    "check_version",
    "discard_pending",
    "install_parser",
    "publish_now",
    "required_attributes",
    "route_directly",
]

log = logging.getLogger("m2mwire.nats")

VERIFIED_MINOR = (2, 16)
PIN = Pinned("nats-py", VERIFIED_MINOR, "NATS")
check_version = PIN.check_version

# One read of the socket (and the StreamReader's limit: it buffers up to twice this before it
# pauses the socket). The sessions' credit windows bound what a peer sends us, not this.
READ_SIZE = 1024 * 1024
# A payload at least this large that has not fully arrived goes into a buffer of its own.
BIG_PAYLOAD = 64 * 1024
# A body at least this large goes to the socket beside its header (os.writev), not joined to it.
WRITEV_BODY = 16 * 1024

# (subject, payload): a routed message; a bytearray payload is handed over (nobody else holds it).
Route = Callable[[bytes, bytes | bytearray], None]


def _stream_reader() -> asyncio.StreamReader:
    loop = asyncio.new_event_loop()  # a StreamReader made outside a loop needs one (not run)
    try:
        return asyncio.StreamReader(loop=loop)
    finally:
        loop.close()


def required_attributes() -> list[tuple[str, object, tuple[str, ...]]]:
    """(what, object, names it must have); a fresh Client (no connection) has the instance fields."""
    return [
        (
            "a nats.aio.client.Client",
            Client(),
            (
                "_pending",
                "_pending_data_size",
                "_max_pending_size",
                "_flush_queue",
                "_flusher_task",
                "stats",
                "_ps",
                "_subs",
                "_transport",
            ),
        ),
        (
            "nats.aio.client.Client",
            Client,
            (
                "is_connected",
                "is_draining_pubs",
                "max_payload",
                "_process_msg",
                "_process_err",
                "_process_ping",
                "_process_pong",
                "_process_info",
            ),
        ),
        ("nats.aio.client", nats_client, ("DEFAULT_BUFFER_SIZE",)),
        ("a nats.aio.subscription.Subscription", Subscription(None), ("_id",)),
        ("a nats.aio.transport.TcpTransport", TcpTransport(), ("_io_writer", "_io_reader")),  # type: ignore[no-untyped-call]
        (
            "an asyncio.StreamReader",
            _stream_reader(),
            ("_buffer", "_eof", "_waiter", "_wakeup_waiter", "feed_data"),
        ),
        ("a nats.protocol.parser.Parser", Parser(), ("buf", "state", "needed", "header_needed", "msg_arg")),
        ("nats.protocol.parser", nats_parser, ("MSG_RE", "HMSG_RE", "CRLF_SIZE")),
    ]


check_attributes = PIN.check_attributes


check_version()
check_attributes(required_attributes())
nats_client.DEFAULT_BUFFER_SIZE = max(nats_client.DEFAULT_BUFFER_SIZE, READ_SIZE)


def publish_now(nc: Client, subject: str, head: bytes, body: bytes | memoryview = b"") -> bool:
    """Queue ``head + body`` on ``subject`` as ``nc.publish()`` would, or return False and queue nothing.

    False where ``publish()`` could wait or fail: not connected (reconnecting), draining, the
    flusher gone, or the pending buffer too full to take the command without a forced flush.
    The subject was checked when the peer gave it (``NatsChannel.connect_peer``: no whitespace or
    control character that would end the protocol line), so no check is repeated per message;
    the payload must be within the server's max_payload (the channel's chunk size is). ``body`` is
    queued by reference: it must not change until sent (the channel passes immutable bytes).
    """
    if not nc.is_connected or nc.is_draining_pubs:
        return False
    flusher, queue = nc._flusher_task, nc._flush_queue
    if flusher is None or flusher.done() or queue is None:
        return False
    payload_size = len(head) + len(body)
    line = f"PUB {subject}  {payload_size}\r\n".encode()  # what nats-py's pub_cmd writes
    size = len(line) + payload_size + CRLF_SIZE
    limit = nc._max_pending_size
    if limit > 0 and nc._pending_data_size + size > limit:
        return False  # publish() would force a flush and wait for it
    stats = nc.stats
    stats["out_msgs"] += 1
    stats["out_bytes"] += payload_size
    if _write_now(nc):
        if len(body) >= WRITEV_BODY and _plain_socket(nc):
            _write_parts(nc, (line + head, body, b"\r\n"))
        else:
            nc._transport.write(b"".join((line, head, body, b"\r\n")))  # type: ignore[union-attr]
        return True
    # The flusher hands the list to the transport's writelines(), which takes any bytes-like
    # object: a memoryview body is written without a copy of its own.
    pending = cast("list[bytes | memoryview]", nc._pending)
    if isinstance(parser := nc._ps, DirectParser):
        parser.wrote_directly = False  # the flusher writes next (see _write_now)
    if body:
        pending.extend((line + head, body, b"\r\n"))
    else:
        pending.append(line + head + b"\r\n")
    nc._pending_data_size += size
    if queue.empty():  # publish() kicks the flusher the same way (its queue holds wake-ups)
        queue.put_nowait(asyncio.get_running_loop().create_future())
    return True


def discard_pending(nc: Client) -> int:
    """Drop the commands nats-py holds for the socket (before closing a connection that cannot
    deliver them; see the module docstring); returns how many bytes were dropped."""
    dropped: int = nc._pending_data_size
    nc._pending = []
    nc._pending_data_size = 0
    return dropped


def _write_now(nc: Client) -> bool:
    """Whether a command may go straight to the socket instead of through the flusher task.

    The flusher costs an event-loop turn per wake-up, on every round trip; writing at once saves
    it. Only while nothing waits ahead of it (the pending buffer and the socket's write buffer
    are empty), so the order of commands is kept and the flusher's drain() still paces a slow
    connection; the command costs the same one copy the flusher's writelines() makes.

    And not twice in a row: after a command went straight out, the next one goes through the
    flusher, unless a read came in between (``DirectParser.wrote_directly`` is cleared by every
    read and by every command queued for the flusher). So a burst of small messages still leaves
    in one write by the flusher, after its first, and a request after its answer goes at once.
    (It was cleared by a callback at the end of the event-loop turn: that callback cost every
    round trip one more turn of the loop, ~4 us of CPU and ~7 us of RTT on each side.)
    """
    parser, transport = nc._ps, nc._transport
    if nc._pending or not isinstance(parser, DirectParser) or parser.wrote_directly:
        return False
    if type(transport) is not TcpTransport or transport._io_writer is None:
        return False  # the websocket transport: through the flusher
    if transport._io_writer.transport.get_write_buffer_size():
        return False
    parser.wrote_directly = True
    return True


def _plain_socket(nc: Client) -> bool:
    """Whether the connection's bytes go to its socket as they are: not over TLS, where
    :func:`_write_parts` would write plaintext past the encryption into the TLS stream (nats-py
    upgrades a TcpTransport in place: its type does not tell). Until stop 28 it did: every large
    message over a TLS connection broke it, and got through only once a reconnect's resend took
    the flusher's path."""
    writer = nc._transport._io_writer  # type: ignore[union-attr]
    return writer is not None and writer.get_extra_info("sslcontext") is None


def _write_parts(nc: Client, parts: Sequence[bytes | memoryview]) -> None:
    """Write ``parts`` to the socket in one ``writev`` call, and what it did not take through the
    transport (which buffers it and writes it when the socket is ready).

    Only after :func:`_write_now` said yes: the transport's write buffer is empty, so nothing
    written before would be overtaken. asyncio's own ``writelines`` (Python 3.11) joins the parts:
    a copy of the body, and for a 1 MiB body a fresh 1 MiB allocation, which costs more than the
    copy (the pages are new each time). Any error is left to the transport to meet and report as
    it does: we then hand it everything.
    """
    transport = nc._transport._io_writer.transport  # type: ignore[union-attr]
    sent = 0
    if not transport.is_closing():
        try:
            sent = os.writev(transport.get_extra_info("socket").fileno(), parts)
        except OSError:  # BlockingIOError (nothing taken) or an error the transport will report
            sent = 0
    for part in parts:
        size = len(part)
        if sent >= size:
            sent -= size
            continue
        transport.write(memoryview(part)[sent:] if sent else part)
        sent = 0


def install_parser(nc: Client) -> DirectParser:
    """Give a new (not yet connected) client the :class:`DirectParser`."""
    parser = DirectParser(nc)
    nc._ps = parser
    return parser


def route_directly(nc: Client, sub: Subscription, route: Route) -> None:
    """Hand the messages of ``sub`` (a subscription of ``nc``) to ``route`` from the read loop (see
    :class:`DirectParser`). Messages with headers (status answers) still go to its callback.

    Register right after subscribing, before anyone is told the subject: a message delivered
    through the subscription's queue before it would otherwise be overtaken by later ones.
    """
    parser = nc._ps
    if not isinstance(parser, DirectParser):
        raise TypeError("route_directly needs a client set up with install_parser()")
    parser.direct[sub._id] = route


class DirectParser(Parser):
    """nats-py's :class:`~nats.protocol.parser.Parser`, with direct routes and big payloads.

    The control lines are matched with nats-py's own patterns and handed to the same client
    methods in the same order; ``tests/transport/test_nats_compat.py`` feeds one byte stream, cut
    at random places, to both parsers and compares what comes out.
    """

    def __init__(self, nc: Client | None = None) -> None:
        self.direct: dict[int, Route] = {}  # survives reset(): sids keep their number on reconnect
        self.wrote_directly = False  # see _write_now (the client's per-connection state lives here)
        self._big: bytearray | None = None  # the payload being read into a buffer of its own
        self._filled = 0
        self._hooked: asyncio.StreamReader | None = None  # whose reads go to _feed
        super().__init__(nc)

    def reset(self) -> None:
        super().reset()
        self._unhook()
        self._big = None
        self._filled = 0

    def _hook(self) -> None:
        """Have the connection's StreamReader give its reads to :meth:`_feed` (TCP connections,
        TLS included: the reader gets decrypted bytes; a websocket transport reads as before).
        Done by the read loop's first parse() of a connection: nats-py's own reads of the
        connection's first lines are over."""
        transport = getattr(self.nc, "_transport", None)
        if type(transport) is not TcpTransport:
            return
        reader = transport._io_reader
        if type(reader) is not asyncio.StreamReader:
            return
        self._hooked = reader
        reader.feed_data = self._feed  # type: ignore[method-assign, assignment]

    def _unhook(self) -> None:
        reader, self._hooked = self._hooked, None
        if reader is not None:
            vars(reader).pop("feed_data", None)  # the class's feed_data again

    @staticmethod
    def _to_reader(reader: asyncio.StreamReader, data: bytes | memoryview) -> None:
        asyncio.StreamReader.feed_data(reader, data)  # the class's: buffers and wakes the read loop

    def _feed(self, data: bytes) -> None:
        """The StreamReader's ``feed_data``: a socket read, from the transport's protocol, between
        two turns of the read loop. Two reads skip the reader (the general path, the class's
        ``feed_data``, takes everything else):

        - *Routed messages, at once.* While the read loop waits in ``read()`` and nothing is
          buffered anywhere (the reader, the parser), the routed messages at the head of the read
          are handed on here (:meth:`_route_run`, the same code as from ``parse()``) and only
          what follows them is fed to the reader. The read loop would have woken for them one
          event-loop turn later and copied the read twice more (out of the reader, into ``buf``);
          a round trip over NATS has two such reads, ~15 us of its ~200 (docs/NATS.md). Order is
          kept: nothing received earlier is still waiting, and the rest goes to the reader after.
        - *The rest of a big payload*, copied straight into its buffer while nothing else is
          buffered (one copy instead of three). Once it is complete, what follows it is fed to
          the reader and the read loop woken: its next parse() (of what follows, or of nothing)
          dispatches the payload first (:meth:`_fill`, with nothing left to take).
        """
        reader = self._hooked
        assert reader is not None
        self.wrote_directly = False  # a read came in (see _write_now)
        if reader._buffer or reader._eof:  # type: ignore[attr-defined]
            self._to_reader(reader, data)  # reads queued ahead: this one goes after them
            return
        big = self._big
        if big is None:
            waiter = reader._waiter  # type: ignore[attr-defined]
            if (
                waiter is None  # the read loop is not waiting for data (it has some to parse)
                or waiter.done()
                or self.buf  # a line or payload cut across reads waits in the parser
                or self.state != AWAITING_CONTROL_LINE
                or not data.startswith(b"MSG ")
            ):
                self._to_reader(reader, data)
                return
            buf = bytearray(data)
            if not self._route_run(buf) or buf:
                self._to_reader(reader, bytes(buf))  # not ours, or not all here: the general path
            return
        filled = self._filled
        take = min(len(big) - filled, len(data))
        big[filled : filled + take] = memoryview(data)[:take]
        self._filled = filled + take
        if self._filled < len(big):
            return
        if take < len(data):
            self._to_reader(reader, memoryview(data)[take:])  # wakes the read loop
        else:
            reader._wakeup_waiter()  # type: ignore[attr-defined]  # read() returns b"": parse() dispatches the payload

    async def parse(self, data: bytes = b"") -> None:
        self.wrote_directly = False  # a read came in (see _write_now)
        if self._hooked is None:
            self._hook()
        if self._big is not None:
            rest = await self._fill(data)
            if not rest:
                return
            self.buf.extend(rest)
        else:
            self.buf.extend(data)
        buf = self.buf
        nc = self.nc
        while buf:
            if self.state == AWAITING_CONTROL_LINE:
                if buf.startswith(b"MSG ") and self._route_run(buf):
                    continue
                msg = MSG_RE.match(buf)
                if msg:
                    self._start_payload(msg.groups(), False)
                    del buf[: msg.end()]
                    if self.needed >= BIG_PAYLOAD and len(buf) < self.needed + CRLF_SIZE:
                        # The rest arrives over further reads: collect it in its own buffer
                        # (one copy) rather than in ``buf`` and out of it again.
                        self._big = big = bytearray(self.needed + CRLF_SIZE)
                        self._filled = len(buf)
                        big[: len(buf)] = buf
                        buf.clear()
                        return
                    continue
                msg = HMSG_RE.match(buf)
                if msg:
                    self._start_payload(msg.groups(), True)
                    del buf[: msg.end()]
                    continue
                ok = OK_RE.match(buf)
                if ok:
                    del buf[: ok.end()]
                    continue
                err = ERR_RE.match(buf)
                if err:
                    emsg = err.groups()[0].decode().lower()
                    await nc._process_err(emsg)
                    del buf[: err.end()]
                    continue
                ping = PING_RE.match(buf)
                if ping:
                    del buf[: ping.end()]
                    await nc._process_ping()
                    continue
                pong = PONG_RE.match(buf)
                if pong:
                    del buf[: pong.end()]
                    await nc._process_pong()
                    continue
                info = INFO_RE.match(buf)
                if info:
                    srv_info = json.loads(info.groups()[0].decode())
                    await nc._process_info(srv_info)
                    del buf[: info.end()]
                    continue
                if len(buf) < MAX_CONTROL_LINE_SIZE and b"\r\n" in buf:
                    raise ProtocolError("nats: unknown protocol")
                break  # a control line split across reads
            # AWAITING_MSG_PAYLOAD
            needed = self.needed
            if len(buf) < needed + CRLF_SIZE:
                break
            hdr: bytes | None = None
            with memoryview(buf) as view:  # one copy out of ``buf`` (nats-py makes two)
                if self.header_needed > 0:
                    hdr = view[: self.header_needed].tobytes()
                    payload = view[self.header_needed : needed].tobytes()
                    self.header_needed = 0
                else:
                    payload = view[:needed].tobytes()
            del buf[: needed + CRLF_SIZE]
            self.state = AWAITING_CONTROL_LINE
            await self._dispatch(payload, hdr)

    def _route_run(self, buf: bytearray) -> bool:
        """Hand on the routed messages at the head of ``buf`` that are there whole; True if any.

        The fast path for small messages: per message, a split of the control line instead of the
        regular expression, the state machine and an awaited dispatch, and the payload sliced out
        (one copy, a bytearray handed over) with one deletion from ``buf`` for the whole run. Only
        the lines nats-server writes (``MSG <subject> <sid> [<reply>] <size>``, single spaces, no
        other whitespace) of a routed subscription take it; on anything else it stops, and the
        general path goes on from there, so the order of messages is kept. ``parse`` and this
        read the same stream the same way (tests/transport/test_nats_compat.py, cut at random).
        """
        direct, subs, stats = self.direct, self.nc._subs, self.nc.stats
        size = len(buf)
        pos = 0
        while buf.startswith(b"MSG ", pos):
            end = buf.find(b"\r\n", pos + 4)
            if end < 0:
                break
            line = bytes(buf[pos + 4 : end])
            parts = line.split(b" ")
            if not 3 <= len(parts) <= 4 or len(line.split()) != len(parts):
                break  # other whitespace, or not our shape: the regular expression decides
            sid_text, needed_text = parts[1], parts[-1]
            if not (sid_text.isdigit() and needed_text.isdigit()):
                break
            sid = int(sid_text)
            route = direct.get(sid)
            start = end + CRLF_SIZE
            stop = start + int(needed_text)
            if route is None or sid not in subs or stop + CRLF_SIZE > size:
                break  # another subscription's, or not all here: the general path
            payload = buf[start:stop]
            pos = stop + CRLF_SIZE
            stats["in_msgs"] += 1
            stats["in_bytes"] += stop - start
            try:
                route(parts[0], payload)
            except Exception:  # as in _dispatch
                log.exception("routing a NATS message on %r failed", parts[0])
        if not pos:
            return False
        del buf[:pos]
        return True

    def _start_payload(self, groups: tuple[bytes, ...], headers: bool) -> None:
        try:
            if headers:
                subject, sid, _, reply, header_size, needed = groups
                self.header_needed = int(header_size)
            else:
                subject, sid, _, reply, needed = groups
            self.msg_arg["subject"] = subject
            self.msg_arg["sid"] = int(sid)
            self.msg_arg["reply"] = reply or b""
            self.needed = int(needed)
        except Exception as exc:
            raise ProtocolError("nats: malformed MSG") from exc
        self.state = AWAITING_MSG_PAYLOAD

    async def _fill(self, data: bytes) -> bytes | memoryview:
        """Copy ``data`` into the big payload; return what follows it (nothing if incomplete)."""
        big = self._big
        assert big is not None
        filled = self._filled
        take = min(len(big) - filled, len(data))
        view = memoryview(data)  # of immutable bytes: no release needed, slices are free
        big[filled : filled + take] = view[:take]
        rest = view[take:]
        self._filled = filled = filled + take
        if filled < len(big):
            return b""
        self._big = None
        del big[-CRLF_SIZE:]
        self.state = AWAITING_CONTROL_LINE
        await self._dispatch(big, None)
        return rest

    async def _dispatch(self, payload: bytes | bytearray, hdr: bytes | None) -> None:
        args = self.msg_arg
        sid = args["sid"]
        nc = self.nc
        route = self.direct.get(sid)
        if route is not None and hdr is None and sid in nc._subs:
            stats = nc.stats
            stats["in_msgs"] += 1
            stats["in_bytes"] += len(payload)
            try:
                route(args["subject"], payload)
            except Exception:  # as nats-py's subscription task does: the read loop goes on
                log.exception("routing a NATS message on %r failed", args["subject"])
            return
        if not isinstance(payload, bytes):
            payload = bytes(payload)
        await nc._process_msg(sid, args["subject"], args["reply"], payload, hdr)
