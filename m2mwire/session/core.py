"""The session protocol as a sans-I/O state machine.

``SessionProtocol`` never touches a socket or a clock: the I/O shell feeds it what arrived
(:meth:`receive_text`, :meth:`receive_binary`), what the application wants (:meth:`send`,
:meth:`send_frame`, :meth:`close`) and the current time, then collects what to transmit
(:meth:`data_to_send`) and what happened (:meth:`next_event`); a received DATA message is
returned by ``receive_*`` instead, as the per-message case (see :meth:`receive_text`). Timers
are deadlines that the shell asks for (:meth:`next_deadline`) and reports back
(:meth:`handle_timer`). This is the design of h11, wsproto and aioquic's ``QuicConnection``, so
every rule is testable without I/O.

States: INITIAL -> HELLO_SENT (client) -> ESTABLISHED -> CLOSING -> CLOSED, and
ESTABLISHED -> CLOSE_RECEIVED -> CLOSED when the peer closes first: the application still gets
what arrived before the CLOSE and may still send its replies until it acknowledges
(:meth:`acknowledge_close`, called by the shell when the application is done, or at the latest
``close_timeout / 2`` after the CLOSE arrived, so that a peer with the same timers sees it in time).
"""

from __future__ import annotations

import logging
import uuid
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from typing import Any, Literal

import msgspec

from m2mwire.codecs import Algorithm
from m2mwire.codecs.buffers import Buffer
from m2mwire.codecs.jsonutil import check_json_text, dumps_compact
from m2mwire.codecs.select import select_algorithm
from m2mwire.codecs.tokenizers import estimated_tokens
from m2mwire.codecs.utf8 import check_utf8, cut_utf8, utf8_len
from m2mwire.errors import (
    DecodeError,
    EncodeError,
    LimitExceeded,
    M2MError,
    ModeError,
    ProtocolError,
    SessionClosed,
    SessionRejected,
    SessionTimeout,
)
from m2mwire.schemas.codes import CloseCode, RejectCode, SessionCode, Violation
from m2mwire.schemas.messages import (
    PROTOCOL_VERSION,
    TOO_DEEP,
    AckPayload,
    Capabilities,
    ClosePayload,
    CompressionCaps,
    DataPayload,
    LatentCaps,
    MessageType,
    Rejection,
    ResumeCaps,
    SecurityCaps,
    ZstdCaps,
    decode_data,
    decode_message,
    encode_message,
)
from m2mwire.session.binarytext import BINARY_TEXT_MIN, BinaryText, BinaryTextMessage
from m2mwire.session.config import CONTROL_MESSAGE_LIMIT, SessionConfig, transport_limit
from m2mwire.session.events import (
    Closed,
    Detached,
    Established,
    Event,
    HelloReceived,
    Resumed,
    ResumeRequested,
    SessionInfo,
    Stats,
    closed_error,
)
from m2mwire.session.negotiation import (
    Negotiated,
    Refusal,
    accept_capabilities,
    negotiate_client,
    negotiate_server,
)
from m2mwire.session.outputs import (
    CLOSE_REASON_BYTES,
    CloseTransport,
    Output,
    SendMessage,
)
from m2mwire.session.payload import (
    Message,
    SentInfo,
    check_avp_frame,
    check_payload_size,
    correlate,
    decode_binary,
    decode_text_data,
    encode_binary,
    encode_text,
    zstd_binary_tokens,
    zstd_message,
)
from m2mwire.session.resume import ACK_WAIT_PONGS, ResumeState, message_size, new_token
from m2mwire.session.states import BINARY, Inbound, Role, State, expected, unexpected
from m2mwire.session.zstdstate import ZstdMessage, ZstdSessionState

__all__ = ["SessionProtocol"]

log = logging.getLogger("m2mwire.session")

# Longest piece of peer input (a name, a version, a type) we repeat in a REJECT, a CLOSE or the log:
# a peer must not be able to make us echo back or store what it sent in bulk.
MAX_ECHO_CHARS = 200
# Lists a HELLO/ACCEPT may carry: there are 8 algorithms and a handful of tokenizers.
MAX_CAPABILITY_ITEMS = 64
# The same warning about one session is logged at most once per this many seconds (with a count of
# those suppressed), so a peer cannot grow the log by flooding, e.g., messages of unknown types.
WARNING_INTERVAL = 10.0


# Hot-path aliases: reading an Enum member off its class costs ~0.12 us on Python 3.11
# (EnumType.__getattr__), a module global a tenth of that.
_ESTABLISHED = State.ESTABLISHED
_CLOSED = State.CLOSED
_CLOSE_RECEIVED = State.CLOSE_RECEIVED


def _bounded(text: str) -> str:
    """Peer-controlled text cut to MAX_ECHO_CHARS, for REJECT and CLOSE reasons and the log."""
    if len(text) <= MAX_ECHO_CHARS:
        return text
    return f"{text[:MAX_ECHO_CHARS]}... ({len(text)} characters)"


class _TypeOnly(msgspec.Struct):
    type: str = ""


# Reads only the "type" of an oversized message (skipping the rest is ~1 GB/s in msgspec).
_type_decoder = msgspec.json.Decoder(_TypeOnly)


class SessionProtocol:
    """One end of one session (sans-I/O)."""

    def __init__(
        self,
        role: Role,
        config: SessionConfig,
        *,
        session_id_factory: Callable[[], str] | None = None,
        admission: bool = False,
    ) -> None:
        self.role = role
        self.config = config
        self.state = State.INITIAL
        self.info: SessionInfo | None = None
        self.stats = Stats()
        self._new_session_id = session_id_factory or (lambda: str(uuid.uuid4()))
        self._session_id: str | None = None
        self._outputs: deque[Output] = deque()
        # Receiving DATA queued an ACK (resume): the shell wakes its writer and clears this. DATA
        # returned by receive_text/receive_binary causes no other output.
        self.ack_queued = False
        self._events: deque[Event] = deque()
        self._closed_event: Closed | None = None
        # deadlines (absolute times in the shell's clock), None when not armed
        self._hello_deadline: float | None = None
        self._close_deadline: float | None = None
        self._pong_deadline: float | None = None
        self._missed_pongs = 0
        # PONGs in a row while our retention buffer was full, and the acknowledged count then.
        self._full_pongs = 0
        self._full_pong_acked = -1
        self._last_pinged = 0.0  # when our last PING went out (see _ping_due)
        # Our last PING went out behind every DATA message we sent (none of a replay still to
        # come after it): only its PONG says the peer received them all (_check_acknowledging).
        self._ping_behind_data = False
        self._ping_sent_at: float | None = None
        self._closed_error: M2MError | None = None  # why we started closing, if not the app's close()
        self._closing: tuple[str, str] = (SessionCode.NORMAL, "")  # the code and text of our CLOSE
        self._last_received = 0.0
        self._last_data = 0.0
        self._payload_limit = config.limits.max_message_bytes  # the negotiated max_payload, once known
        # Admission (server): HELLO -> HelloReceived event -> admit()/refuse(); None while no
        # verdict is awaited. Holds what ACCEPT needs so the verdict does not negotiate again.
        self._admission = admission
        self._awaiting_verdict: tuple[Negotiated, Capabilities] | None = None
        self.peer_trace: tuple[str, str | None] | None = None  # server: HELLO's traceparent, tracestate
        # What the codecs may produce on this session: the negotiated max_payload bounds the decoded
        # content on both sides (PROTOCOL.md "Resource bounds"), so decoders stop at it.
        self._limits = config.limits
        self._peer_close: Closed | None = None  # the peer's CLOSE, while in CLOSE_RECEIVED
        self._close_code = CloseCode.NORMAL  # transport close code once our CLOSE is acknowledged
        self._close_reason: str | None = None  # ... and its reason, when not the event's code
        self._warned_at = -WARNING_INTERVAL  # rate limit of _warn()
        self._warnings_suppressed = 0
        self._discarding = False  # CLOSING: DATA is dropped undecoded (see discard_data)
        self._zstd: ZstdSessionState | None = None  # both zstd contexts, when zstd was negotiated
        self._binary_text: BinaryText | None = None  # when binary_text was negotiated
        # Resume (docs/PROTOCOL.md "Resume"): None unless both ends negotiated it. While
        # ``attached`` is False the session is ESTABLISHED without a connection: DATA sent is
        # retained only, and a server's ``_resume_deadline`` (resume_window) ends the wait.
        self.resume: ResumeState | None = None
        self.attached = True
        self._resuming = False  # client: the resuming HELLO is out, its ACCEPT not yet in
        # attached and not _resuming: DATA goes on the wire now. A plain attribute, set wherever
        # those two change, since every DATA message sent or received with resume reads it.
        self._live = True
        # DATA goes on the wire as it is sent (else it is retained only: detached, resuming, or a
        # replay in progress, which sends it in turn). Plain, like _live.
        self._direct = True
        self._resume_deadline: float | None = None
        self._resume_request: ResumeRequested | None = None  # server, fresh connection
        self._queued_pong: Output | None = None  # our last PONG, while it may still be queued
        self._agreed: Negotiated | None = None  # server with resume: what a resuming ACCEPT repeats

    # -- inputs ---------------------------------------------------------------------------------

    def initiate(self, now: float, trace: Mapping[str, str] | None = None) -> None:
        """Start the session: the client sends HELLO; both ends arm the handshake timer.

        ``trace`` (client): W3C ``traceparent``/``tracestate`` to put in HELLO."""
        if self.state is not State.INITIAL or self._hello_deadline is not None:
            raise ProtocolError(
                "initiate() may be called once, on a new session", code=SessionCode.INVALID_STATE
            )
        self._last_received = self._last_data = now
        self._hello_deadline = now + self.config.timers.hello_timeout
        if self.role is Role.CLIENT:
            caps = self._own_capabilities()
            if trace:
                caps.traceparent = trace.get("traceparent", msgspec.UNSET)
                caps.tracestate = trace.get("tracestate", msgspec.UNSET)
            self._send_text(encode_message(MessageType.HELLO, caps))
            self.state = State.HELLO_SENT

    def receive_text(self, data: bytes | str, now: float) -> Message | None:
        """Feed one text message from the channel, as the UTF-8 bytes it arrived as (not yet
        validated: this is where they are, once); returns the DATA message it carried, if any.
        A ``str`` is taken too, for callers that hold text (it is encoded first).

        A returned message is not queued as an event, and it means the input did nothing else:
        no event, no output, and no deadline earlier than before (a shell may skip polling).
        Anything else (handshake, PING, CLOSE, a protocol error) returns None and is reported
        through :meth:`next_event`, :meth:`next_output` and :meth:`next_deadline`.
        """
        if self.state is _CLOSED:
            return None
        if type(data) is not bytes:
            data = data.encode("utf-8", "surrogatepass") if isinstance(data, str) else bytes(data)
        self._last_received = now
        size = len(data)
        if self.state is _ESTABLISHED:
            # The per-message case, in one pass that also validates the UTF-8 (decode_data).
            env = decode_data(data, limits=self.config.limits)
            if env is not None:
                if size > self._payload_limit:
                    self._too_big(size, "DATA message")
                    return None
                message = self._on_data(env.session_id, env.payload, now)
                r = self.resume
                if r is not None and message is not None:
                    # ResumeState.on_received inline (see _count_received): the per-message path
                    if message.algorithm == "zstd":
                        size += message.original_bytes - message.wire_bytes
                    r.received += 1
                    r.unacked_bytes += size
                    if (r.unacked_bytes >= r.ack_bytes or r.received >= r.ack_at) and self._live:
                        self._send_ack()
                return message
        if size > CONTROL_MESSAGE_LIMIT and not self._large_message_allowed(data):
            return None
        try:
            check_utf8(data)  # the general path's one check (decode_data's did not succeed)
        except DecodeError as exc:
            self._fail(
                ProtocolError(f"text message is {exc}", code=SessionCode.MALFORMED_MESSAGE),
                SessionCode.MALFORMED_MESSAGE,
                CloseCode.INVALID_DATA,
            )
            return None
        try:
            msg = decode_message(data, limits=self.config.limits)
        except LimitExceeded as exc:
            self._fail(exc, SessionCode.MESSAGE_TOO_BIG, CloseCode.TOO_BIG)
            return None
        except ProtocolError as exc:
            self._fail(exc, exc.code, CloseCode.PROTOCOL_ERROR)
            return None
        if msg.type is None:
            self._warn(now, "ignoring message of unknown type %r", _bounded(msg.type_name))
            return None
        if msg.type is MessageType.DATA and size > self._payload_limit:
            self._too_big(size, "DATA message")  # DATA in another key order than decode_data's
            return None
        if msg.type not in self._expected():
            self._unexpected(msg.type, now)
            return None
        result = _HANDLERS[msg.type](self, msg.session_id, msg.payload, now)
        if result is not None and self.resume is not None:
            self._count_received(size, result)
        return result

    def receive_binary(self, data: bytes | bytearray | memoryview, now: float) -> Message | None:
        """Feed one binary message (TokenNative binary, an M2M v1 frame or an AVP frame); returns
        the DATA message it carried, if any, as :meth:`receive_text` does."""
        state = self.state
        if state is _CLOSED:
            return None
        self._last_received = now
        if state is not _ESTABLISHED:
            if BINARY not in self._expected():
                self._unexpected(BINARY, now)
                return None
            if self._discarding:
                return None
        size = len(data) if type(data) is bytes else len(memoryview(data))
        if size > self._payload_limit:  # the channel lets control-sized messages through
            self._too_big(size, "binary message")
            return None
        info = self.info
        assert info is not None
        try:
            message = decode_binary(
                data,
                mode=info.mode,
                limits=self._limits,
                payload_limit=self._payload_limit,
                zstd=self._zstd,
                session_id=self._session_id,
                binary_text=self._binary_text,
            )
        except M2MError as exc:  # DecodeError, LimitExceeded, TokenizerUnavailable, ...
            self._refuse_data("binary frame", exc)
            return None
        if isinstance(message, Violation):
            self._protocol_violation(message.message, message.code)
            return None
        if self.config.token_stats and message.algorithm == "zstd":
            assert message.text is not None
            self.stats.original_tokens_received += estimated_tokens(message.text)
            self.stats.wire_tokens_received += zstd_binary_tokens(data)
        if self.resume is not None:
            if message.algorithm == "zstd":
                assert self._zstd is not None
                size = self._zstd.received_size  # resume counts it decompressed (PROTOCOL.md §9)
            self._count_received(size)
        return self._deliver(message, now)

    def send(
        self,
        content: str | dict[str, Any] | list[Any],
        now: float,
        *,
        algorithm: Algorithm | None = None,
        binary: bool = False,
        request_id: str | None = None,
        reply_to: str | None = None,
        more: bool = False,
        trace: Mapping[str, str] | None = None,
    ) -> SentInfo:
        """Queue one DATA message (text or JSON). Raises without queuing anything on error.

        ``request_id``/``reply_to``/``more`` are the request and stream correlation fields of the
        DATA payload (docs/PROTOCOL.md "Requests and streams"); they need the text form, since a
        TokenNative binary frame has no envelope to carry them.
        """
        info = self.info
        if self.state is not _ESTABLISHED or info is None:
            info = self._require_established()
        content_type: Literal["text", "json"]
        if isinstance(content, str):
            text, content_type = content, "text"
        elif isinstance(content, dict | list):
            text, content_type = dumps_compact(content), "json"
            # The receiver refuses JSON over the seed's limits (depth, array length, string size) and
            # closes the session; refuse it here first, with the receiver's own check.
            check_json_text(text, limits=self._limits, what="JSON content")
        else:
            raise EncodeError(f"send() takes str, dict or list content, not {type(content).__name__}")
        original = len(text) if text.isascii() else utf8_len(text)
        if original > self._payload_limit:
            check_payload_size(original, self._payload_limit, "message content")
        correlated = request_id is not None or reply_to is not None
        if binary and correlated:
            raise EncodeError(
                "requests and replies travel as text DATA (their ids live in the DATA envelope); "
                "leave binary=False"
            )
        if binary:
            kind, frame = encode_binary(
                text,
                algorithm,
                algorithms=info.algorithms,
                encoding=info.encoding,
                limits=self._limits,
                payload_limit=self._payload_limit,
            )
            self._queue_data(SendMessage((frame,)))
            sent = SentInfo(kind.value, True, original, len(frame))
        else:
            if self._zstd is not None and (
                algorithm is Algorithm.ZSTD or (algorithm is None and self.config.optimize == "bytes")
            ):
                correlation = (
                    correlate(DataPayload(algorithm="zstd", content=""), request_id, reply_to, more, trace)
                    if correlated
                    else None
                )
                zsent = self._send_zstd(
                    text, content_type, original, info, correlation, explicit=algorithm is not None
                )
                if zsent is not None:
                    self._account_sent(zsent, now)
                    return zsent
            if self._binary_text is not None and original >= BINARY_TEXT_MIN:
                auto = algorithm is None
                if auto:  # chosen here once, and passed on to encode_text
                    algorithm = select_algorithm(
                        text, allowed=info.algorithms, optimize=self.config.optimize, encoding=info.encoding
                    )
                # NONE unnegotiated: selection's plain-text fallback for long content where only
                # TokenNative is (select.TOKENNATIVE_AUTO_MAX), which every peer reads.
                if algorithm is Algorithm.NONE and (auto or Algorithm.NONE in info.algorithms):
                    fields = (request_id, reply_to, more, trace) if correlated else None
                    sent = self._send_binary_text(text, content_type, original, fields)
                    self._account_sent(sent, now)
                    return sent
            envelope, name, wire, wire_len = encode_text(
                text,
                content_type,
                original,
                algorithm,
                algorithms=info.algorithms,
                encoding=info.encoding,
                optimize=self.config.optimize,
                session_id=info.session_id,
                limits=self._limits,
                payload_limit=self._payload_limit,
                correlation=(request_id, reply_to, more, trace) if correlated else None,
            )
            r = self.resume
            if r is not None:  # ResumeState.on_sent inline (see _queue_data): the per-message path
                r.retained.append(envelope)  # the envelope itself, kept by reference
                r.retained_bytes += len(envelope)
            if self._direct:  # else retained only, and sent by the replay of a resume
                self._outputs.append(SendMessage(envelope))
            if self.config.token_stats:
                tokens = (estimated_tokens(text), estimated_tokens(wire))
                self.stats.original_tokens_sent += tokens[0]
                self.stats.wire_tokens_sent += tokens[1]
                sent = SentInfo(name, False, original, wire_len, *tokens)
            else:
                sent = SentInfo(name, False, original, wire_len)
        self._account_sent(sent, now)
        return sent

    def _send_binary_text(
        self,
        text: str,
        content_type: Literal["text", "json"],
        original: int,
        correlation: tuple[str | None, str | None, bool, Mapping[str, str] | None] | None,
    ) -> SentInfo:
        """Queue ``text`` as text DATA in binary form (session/binarytext.py)."""
        assert self._binary_text is not None
        payload = correlate(DataPayload(algorithm="none", content=""), *correlation) if correlation else None
        message = self._binary_text.encode(text, content_type, payload)
        size = message.size
        if size > self._payload_limit:
            check_payload_size(size, self._payload_limit, "DATA message")
        frame = message.take_frame()
        r = self.resume
        if r is not None:  # retained as head + text, framed again on a resume (BinaryTextMessage)
            r.retained.append(message)  # ResumeState.on_sent inline, as for text DATA
            r.retained_bytes += size
        if self._direct:  # else retained only, and sent by the replay of a resume
            self._outputs.append(SendMessage((frame,)))
        if self.config.token_stats:
            tokens = estimated_tokens(text)  # the content travels as it is
            self.stats.original_tokens_sent += tokens
            self.stats.wire_tokens_sent += tokens
            return SentInfo("none", True, original, size, tokens, tokens)
        return SentInfo("none", True, original, size)

    def _send_zstd(
        self,
        text: str,
        content_type: Literal["text", "json"],
        original: int,
        info: SessionInfo,
        correlation: DataPayload | None,
        *,
        explicit: bool,
    ) -> SentInfo | None:
        """Queue ``text`` through the session's zstd context (:func:`payload.zstd_message`); None
        when it cannot go that way and automatic selection should choose another algorithm."""
        state = self._zstd
        assert state is not None
        zmessage = zstd_message(
            state,
            text,
            content_type,
            original,
            session_id=info.session_id,
            payload_limit=self._payload_limit,
            correlation=correlation,
            explicit=explicit,
        )
        if zmessage is None:
            return None
        stats = self.config.token_stats
        if not self._direct:
            # Detached, resuming or replaying: retained only, and compressed when the replay
            # sends it (a context takes its messages in order). Its wire size is not known yet:
            # reported as its size uncompressed.
            assert self.resume is not None  # only a session with resume holds DATA back
            self.resume.on_sent(zmessage, zmessage.size)
            if not stats:
                return SentInfo("zstd", zmessage.payload is None, original, zmessage.size)
            tokens = estimated_tokens(text)
            self.stats.original_tokens_sent += tokens
            self.stats.wire_tokens_sent += tokens
            return SentInfo("zstd", zmessage.payload is None, original, zmessage.size, tokens, tokens)
        out = state.wire(zmessage)  # compressed into the context: from here on it must be sent
        self._queue_data(SendMessage(out), zmessage)  # resume retains zmessage, not its wire form
        if isinstance(out, bytes):  # the text form: a DATA envelope carrying #ZS|
            assert zmessage.payload is not None
            wire = zmessage.payload.content
            sent = SentInfo("zstd", False, original, len(wire))
            wire_tokens = estimated_tokens(wire) if stats else 0
        else:  # the binary form: the whole DATA message is the frame
            sent = SentInfo("zstd", True, original, len(out[0]))
            wire_tokens = zstd_binary_tokens(out[0]) if stats else 0
        if stats:
            original_tokens = estimated_tokens(text)
            self.stats.original_tokens_sent += original_tokens
            self.stats.wire_tokens_sent += wire_tokens
            sent = SentInfo("zstd", sent.binary, original, sent.wire_bytes, original_tokens, wire_tokens)
        return sent

    def reset_codec_state(self) -> None:
        """Forget the zstd history of both directions (resume calls this on both ends, before any
        message is retransmitted; the peer must do the same, or its next message fails)."""
        if self._zstd is not None:
            self._zstd.reset()

    @property
    def codec_memory(self) -> int:
        """Bytes zstd reserved for this session's contexts (0 without zstd or before first use)."""
        return self._zstd.memory_size() if self._zstd is not None else 0

    def send_frame(self, parts: Sequence[Buffer], now: float) -> SentInfo:
        """Queue one already-encoded AVP frame (as one or more buffers) for a latent-mode session."""
        info = self.info
        if self.state is not _ESTABLISHED or info is None:
            info = self._require_established()  # raises
        if info.mode != "LATENT":
            raise ModeError(
                f"cannot send an AVP frame: this session negotiated {info.mode} mode "
                f"({info.mode_reason}); latent mode needs both agents to offer a compatible model identity"
            )
        size = check_avp_frame(parts, self._payload_limit)
        self._queue_data(SendMessage(parts if type(parts) is tuple else tuple(parts)))
        sent = SentInfo("avp", True, size, size)
        self._account_sent(sent, now)
        return sent

    def close(self, now: float, reason: str = "", *, code: str = SessionCode.NORMAL) -> None:
        """Begin an orderly close: CLOSE now, CLOSED once the peer acknowledges (or close_timeout).

        ``code`` other than NORMAL tells the peer the session failed (e.g. INTERNAL_ERROR when a
        server's handler raised); INTERNAL_ERROR also closes the transport with 1011.
        """
        if self.state in (State.CLOSING, State.CLOSED):
            return
        if self.state is _CLOSE_RECEIVED:  # the peer closed first: this is our acknowledgement
            self.acknowledge_close()
            return
        if self.state is State.ESTABLISHED and not self.attached:
            # Detached: no connection to say CLOSE on (the shell waits for a resume first when
            # retained DATA must still reach the peer).
            self._finish(Closed(code, reason, by_peer=False), None)
            return
        if self.state is State.ESTABLISHED:
            self._begin_close(code, reason, now)
            if code == SessionCode.INTERNAL_ERROR:
                self._close_code, self._close_reason = CloseCode.INTERNAL_ERROR, code
            return
        # Not established yet: there is no session to close on the wire.
        self._finish(Closed(code, reason, by_peer=False), CloseCode.NORMAL)

    def discard_data(self) -> None:
        """CLOSING (we sent CLOSE): the application takes no more messages, so DATA that still
        arrives before the peer's acknowledgement is dropped without being decoded. Decoding it
        only to drop it would let a peer make us decompress up to max_payload per tiny message
        for as long as we wait (close_timeout); nothing decodes after it (the session ends), so
        skipping it cannot desynchronise a context. No effect in any other state."""
        if self.state is State.CLOSING:
            self._discarding = True

    def acknowledge_close(self) -> None:
        """In CLOSE_RECEIVED: the application is done (it asked for more than was received before
        the CLOSE, closed, or ran out of time). Acknowledge after whatever it sent meanwhile."""
        peer_close = self._peer_close
        if self.state is not _CLOSE_RECEIVED or peer_close is None:
            return
        self._finish_replay()
        self._send_close(SessionCode.NORMAL, "acknowledged")
        self._finish(peer_close, CloseCode.NORMAL)

    def write_stalled(self, waited: float) -> None:
        """The shell could not hand one message to the transport for ``waited`` seconds: the peer
        reads nothing. End the session (the shell drops the connection: nothing more can be written)."""
        if self.state is State.CLOSED:
            return
        err = SessionTimeout(
            f"the peer read nothing for {waited:g} s while we had a message to send (write_timeout); "
            "dropped it"
        )
        log.info("session %s: %s", self._session_id or "-", err)
        self._finish(Closed(SessionCode.WRITE_TIMEOUT, str(err), by_peer=False, error=err), None)

    def internal_error(self, cause: Exception) -> None:
        """The shell failed to process a message (a bug of ours, logged there): end the session
        for good. Not detached, even with resume: the peer would send the same message again
        after the resume, and it would fail again, round after round until max_elapsed."""
        if self.state is State.CLOSED:
            return
        err = SessionClosed(
            f"m2mwire failed to process a message ({type(cause).__name__}: {cause}); the session "
            "ended. This is a bug: the traceback is in the m2mwire.session log",
            code=SessionCode.INTERNAL_ERROR,
        )
        # Without its traceback, whose frames would keep the session alive (see closed_error);
        # the shell logged it whole.
        err.__cause__ = cause.with_traceback(None)
        # Tell the peer, as a failing handler does (CLOSE INTERNAL_ERROR, then the transport's
        # 1011): it saw only a lost connection, and with resume waited out resume_window for a
        # session that had ended. The cause stays here: its text is ours, not the peer's business.
        if self.state is not State.CLOSING:  # else our CLOSE is out already
            self._tell_peer(
                SessionCode.INTERNAL_ERROR,
                "the peer failed to process a message (a bug in m2mwire; the peer's log has the traceback)",
            )
        self._finish(
            Closed(SessionCode.INTERNAL_ERROR, str(err), by_peer=False, error=err), CloseCode.INTERNAL_ERROR
        )

    def transport_closed(self, error: M2MError | None = None, now: float | None = None) -> None:
        """The channel underneath is gone (peer vanished, connection lost, orderly transport close).

        A session that negotiated resume is detached instead of closed (a :class:`Detached`
        event); ``now`` then starts a server's ``resume_window``."""
        if self.state is State.CLOSED:
            return
        if self.resume is not None and self.state is State.ESTABLISHED:
            if self.attached:
                detail = f": {error}" if error is not None else ""
                self._detach(f"connection lost{detail}", self._last_received if now is None else now)
            return
        if self.state is _CLOSE_RECEIVED and self._peer_close is not None:
            self._finish(self._peer_close, None)  # the peer had closed anyway: an orderly end
            return
        if self.state is State.CLOSING:
            self._finish(Closed(SessionCode.NORMAL, "transport closed during CLOSE", by_peer=True), None)
            return
        err = error or SessionClosed(
            "the connection closed without a CLOSE message", code=SessionCode.TRANSPORT_CLOSED
        )
        self._finish(Closed(SessionCode.TRANSPORT_CLOSED, str(err), by_peer=True, error=err), None)

    def handle_timer(self, now: float) -> None:
        """Act on every deadline that has passed."""
        t = self.config.timers
        if self._resume_deadline is not None and now >= self._resume_deadline:
            expired = SessionClosed(
                f"the client did not resume the session within {self.config.resume_window:g} s "
                "(resume_window)",
                code=SessionCode.RESUME_EXPIRED,
            )
            self._finish(Closed(SessionCode.RESUME_EXPIRED, str(expired), by_peer=False, error=expired), None)
            return
        if self._hello_deadline is not None and now >= self._hello_deadline:
            if self._resuming:
                self._detach(f"no ACCEPT to the resuming HELLO within {t.hello_timeout:g} s", now)
                return
            waited = "ACCEPT" if self.role is Role.CLIENT else "HELLO"
            err = SessionTimeout(f"no {waited} within {t.hello_timeout:g} s (hello_timeout)")
            self._finish(
                Closed(SessionCode.HELLO_TIMEOUT, str(err), by_peer=False, error=err), CloseCode.GOING_AWAY
            )
            return
        if self._close_deadline is not None and now >= self._close_deadline:
            if self.state is _CLOSE_RECEIVED:  # the application took too long: acknowledge anyway
                self.acknowledge_close()
                return
            err = SessionTimeout(f"CLOSE not acknowledged within {t.close_timeout:g} s (close_timeout)")
            self._finish(Closed(self._closing[0], str(err), by_peer=False, error=err), self._close_code)
            return
        if self.state is not State.ESTABLISHED or not self._live:
            return
        if self._pong_deadline is not None and now >= self._pong_deadline:
            self._missed_pongs += 1
            if self._missed_pongs >= t.max_missed_pongs:
                err = SessionTimeout(
                    f"{self._missed_pongs} PINGs in a row not answered within {t.pong_timeout:g} s; "
                    "the peer is gone"
                )
                if self.resume is not None:  # the connection is dead, not the session
                    self._detach(str(err), now)
                    return
                self._send_close(SessionCode.PONG_TIMEOUT, str(err))
                self._finish(
                    Closed(SessionCode.PONG_TIMEOUT, str(err), by_peer=False, error=err), CloseCode.GOING_AWAY
                )
                return
            self._ping(now)
        elif self._pong_deadline is None and now >= self._ping_due(t.ping_interval):
            self._ping(now)
        if t.session_timeout is not None and now >= self._last_data + t.session_timeout:
            err = SessionTimeout(f"no DATA for {t.session_timeout:g} s (session_timeout)")
            self._begin_close(SessionCode.SESSION_TIMEOUT, str(err), now, err)

    def reading_suspended(self, now: float) -> None:
        """The shell stopped reading on purpose (the application is slow): whatever the peer sent
        (PONGs, DATA, the CLOSE acknowledgement) waits unread, so it must not count as silence."""
        self._last_received = now
        self._last_data = now
        self._missed_pongs = 0
        self._pong_deadline = None
        self._ping_sent_at = None  # its PONG waits unread: no round trip to measure

    def next_deadline(self) -> float | None:
        """The earliest time at which handle_timer() has something to do."""
        t = self.config.timers
        live = self._live
        if (
            self.state is _ESTABLISHED
            and self._hello_deadline is None
            and self._close_deadline is None
            and live
        ):
            # the per-message case: only the ping (or pong) and session deadlines are armed
            ping = self._pong_deadline
            if ping is None:
                ping = self._ping_due(t.ping_interval)
            if t.session_timeout is None:
                return ping
            session = self._last_data + t.session_timeout
            return ping if ping < session else session
        candidates = [
            d for d in (self._hello_deadline, self._close_deadline, self._resume_deadline) if d is not None
        ]
        if self.state is State.ESTABLISHED and live:
            if self._pong_deadline is not None:
                candidates.append(self._pong_deadline)
            else:
                candidates.append(self._ping_due(t.ping_interval))
            if t.session_timeout is not None:
                candidates.append(self._last_data + t.session_timeout)
        return min(candidates) if candidates else None

    # -- outputs --------------------------------------------------------------------------------

    @property
    def has_output(self) -> bool:
        return bool(self._outputs) or (not self._direct and self._live)

    @property
    def output_backlog(self) -> int:
        """Outputs queued and not yet taken: the shell stops reading when this grows (PING floods)."""
        return len(self._outputs)

    def sole_output(self) -> Output | None:
        """The queued output if it is the only one, without taking it (the shell's direct write
        takes it with next_output() once written)."""
        outputs = self._outputs
        return outputs[0] if len(outputs) == 1 and self._direct else None

    def next_output(self) -> Output | None:
        """Take the next output, one at a time (a cancelled write then loses nothing else):
        control messages first, then a replay's messages (made as they are taken)."""
        if self._outputs:
            return self._outputs.popleft()
        if not self._direct and self._live:  # attached but not direct: a replay is in progress
            return self._replayed()
        return None

    def data_to_send(self) -> list[Output]:
        out = []
        while (o := self.next_output()) is not None:  # bounded by the queue and the retained
            out.append(o)
        return out

    def next_event(self) -> Event | None:
        return self._events.popleft() if self._events else None

    @property
    def session_id(self) -> str | None:
        return self._session_id

    @property
    def closed(self) -> Closed | None:
        return self._closed_event

    # -- message handlers -------------------------------------------------------------------------

    def _on_hello(self, _sid: str | None, payload: Any, now: float) -> None:
        assert isinstance(payload, Capabilities)
        if (refusal := _oversized_lists(payload)) is not None:
            self._reject(SessionCode.MESSAGE_TOO_BIG, refusal)
            return
        if isinstance(payload.resume, ResumeCaps) and payload.resume.session_id is not None:
            self._on_resume_hello(payload.resume)
            return
        cfg = self.config
        result = negotiate_server(
            payload,
            algorithms=cfg.algorithms,
            encodings=cfg.resolved_encodings(),
            # What we enforce: with max_payload=0 the negotiated value was the client's, whatever
            # its size (a client announcing 1 GiB got a 256 MiB message buffered: stop 30).
            max_payload=self._own_payload_limit(),
            identity=cfg.identity,
            zstd=self._own_zstd_caps(),
            binary_text=cfg.binary_text,
        )
        if isinstance(result, Refusal):
            self._reject(result.code, result.message)
            return
        if self._admission:
            # The hello timer stays armed: a verdict that takes longer than hello_timeout ends
            # the handshake like a silent server would.
            self._awaiting_verdict = (result, payload)
            self._events.append(HelloReceived(payload))
            return
        self._accept(result, payload, now)

    def admit(self, now: float) -> None:
        """Server, admission on: accept the HELLO reported by :class:`HelloReceived`."""
        pending = self._awaiting_verdict
        if pending is None or self.state is not State.INITIAL:
            return  # the session ended meanwhile (hello timeout, transport gone): nothing to do
        self._awaiting_verdict = None
        self._accept(pending[0], pending[1], now)

    def refuse(self, code: str, message: str) -> None:
        """Server, admission on: answer the pending HELLO with REJECT ``code``."""
        if self._awaiting_verdict is None or self.state is not State.INITIAL:
            return
        self._awaiting_verdict = None
        self._reject(code, message)

    def _accept(self, result: Negotiated, hello: Capabilities, now: float) -> None:
        if isinstance(hello.traceparent, str):
            self.peer_trace = (
                hello.traceparent,
                hello.tracestate if isinstance(hello.tracestate, str) else None,
            )
        self._session_id = self._new_session_id()
        accept = accept_capabilities(self._own_capabilities(), result)
        if isinstance(hello.resume, ResumeCaps) and self._offers_resume():
            token = new_token()
            accept.resume = ResumeCaps(buffer=self.config.resume_buffer_bytes, token=token)
            self.resume = ResumeState(self.config.resume_buffer_bytes, hello.resume.buffer, token)
            self._agreed = result
        self._send_text(encode_message(MessageType.ACCEPT, accept, session_id=self._session_id))
        self._establish(result, hello, now)

    def _on_accept(self, sid: str | None, payload: Any, now: float) -> None:
        if self._resuming:
            self._on_resume_accept(sid, payload, now)
            return
        assert isinstance(payload, Capabilities)
        if not sid:
            self._protocol_violation("ACCEPT without a session_id", SessionCode.MALFORMED_MESSAGE)
            return
        cfg = self.config
        result = negotiate_client(
            payload,
            algorithms=cfg.algorithms,
            encodings=cfg.resolved_encodings(),
            preferred_encoding=cfg.resolved_preferred(),
            max_payload=cfg.max_payload,
            zstd=self._own_zstd_caps(),
            binary_text=cfg.binary_text,
        )
        if isinstance(result, Refusal):
            self._session_id = sid
            self._protocol_violation(f"unusable ACCEPT: {result.message}", result.code)
            return
        self._session_id = sid
        granted = payload.resume
        if self.config.resume and isinstance(granted, ResumeCaps) and granted.token:
            self.resume = ResumeState(self.config.resume_buffer_bytes, granted.buffer, granted.token)
        self._establish(result, payload, now)

    def _on_reject(self, _sid: str | None, payload: Any, _now: float) -> None:
        if self._resuming:
            assert isinstance(payload, Rejection)
            refused = SessionClosed(
                f"cannot resume the session: {payload.code}: {payload.message}",
                code=payload.code,
                reason=payload.message,
            )
            self._finish(Closed(payload.code, payload.message, by_peer=True, error=refused), CloseCode.NORMAL)
            return
        assert isinstance(payload, Rejection)
        err = SessionRejected(
            f"server rejected the session: {payload.code}: {payload.message}", code=payload.code
        )
        self._finish(Closed(payload.code, payload.message, by_peer=True, error=err), CloseCode.NORMAL)

    def _on_data(self, sid: str | None, payload: Any, now: float) -> Message | None:
        if sid != self._session_id:
            self._protocol_violation(
                f"DATA for session {sid!r} on session {self._session_id!r}", SessionCode.UNKNOWN_SESSION
            )
            return None
        assert isinstance(payload, DataPayload)
        if self._discarding:
            return None
        try:
            message = decode_text_data(payload, self._limits, self._zstd)
        except M2MError as exc:  # DecodeError, LimitExceeded, TokenizerUnavailable, ...
            self._refuse_data(f"DATA ({payload.algorithm})", exc)
            return None
        if self.config.token_stats:
            assert message.text is not None
            self.stats.original_tokens_received += estimated_tokens(message.text)
            self.stats.wire_tokens_received += estimated_tokens(payload.content)
        return self._deliver(message, now)

    def _on_ping(self, sid: str | None, _payload: Any, _now: float) -> None:
        outputs = self._outputs
        if not outputs or outputs[-1] is not self._queued_pong:
            # A PONG answers every PING before it (it carries nothing of the PING's), so one
            # still queued answers this one too: a peer flooding PINGs without reading queues
            # one PONG, not one per PING of a read (up to ~10,000 of 1 MiB).
            self._send_text(encode_message(MessageType.PONG, session_id=self._session_id or sid))
            self._queued_pong = outputs[-1]
        if self.resume is not None and self.resume.ack_pending and self._live:
            self._send_ack()  # a quiet moment: release what the peer retains for us

    def _on_ack(self, sid: str | None, payload: Any, now: float) -> None:
        if self.resume is None:  # rate-limited, as every warning a peer can trigger at will
            self._warn(now, "ignoring ACK on a session without resume")
            return
        if sid != self._session_id:  # as for DATA: it counts another session's messages
            self._protocol_violation(
                f"ACK for session {sid!r} on session {self._session_id!r}", SessionCode.UNKNOWN_SESSION
            )
            return
        assert isinstance(payload, AckPayload)
        try:
            self.resume.on_ack(payload.received)
        except ProtocolError as exc:
            self._protocol_violation(str(exc), exc.code)

    def _on_pong(self, _sid: str | None, _payload: Any, now: float) -> None:
        self._missed_pongs = 0
        self._pong_deadline = None
        if self._ping_sent_at is not None:
            self.stats.ping_rtt = now - self._ping_sent_at
            self._ping_sent_at = None
        r = self.resume
        behind, self._ping_behind_data = self._ping_behind_data, False
        if r is not None and r.full and behind and self.state is State.ESTABLISHED:
            self._check_acknowledging(r, now)

    def _check_acknowledging(self, r: ResumeState, now: float) -> None:
        """A PONG while our retention buffer is full, to a PING sent behind every message we
        retain (not during a replay). The peer read it after them (one ordered channel), so it
        received more than an eighth of our buffer, and every version of this protocol
        acknowledges by then (§9). A peer that answers PINGs and acknowledges nothing kept our
        send() waiting for good, the session alive (stop 32's attack run): after ACK_WAIT_PONGS
        such PONGs with no acknowledgement between them, the session ends INVALID_ACK (about
        ACK_WAIT_PONGS x ping_interval after it filled)."""
        if r.acked != self._full_pong_acked:
            self._full_pong_acked, self._full_pongs = r.acked, 1
            return
        self._full_pongs += 1
        if self._full_pongs >= ACK_WAIT_PONGS:
            err = ProtocolError(
                f"the peer answered {self._full_pongs} PINGs in a row but acknowledged none of our "
                f"{r.sent - r.acked} retained DATA messages, which it had received (resume): "
                "dropped. It does not follow the resume protocol (docs/PROTOCOL.md §9)",
                code=SessionCode.INVALID_ACK,
            )
            self._begin_close(SessionCode.INVALID_ACK, str(err), now, err)

    def _on_close(self, _sid: str | None, payload: Any, now: float) -> None:
        reason = ""
        code: str = SessionCode.NORMAL  # a peer's code stays the str it sent: it may be one we do not know
        if isinstance(payload, ClosePayload):
            if isinstance(payload.reason, str):
                code = _bounded(payload.reason)
            if isinstance(payload.message, str):
                reason = _bounded(payload.message)
        if self.state is State.CLOSING:
            # The session ends for the reason we closed it (SESSION_TIMEOUT, not the NORMAL of the
            # peer's acknowledgement: PROTOCOL.md §4, the close reason is the session's code); after
            # our NORMAL close, for the peer's, which may be a failure of its own crossing ours.
            if self._closing[0] != SessionCode.NORMAL:
                code, reason = self._closing
            self._finish(Closed(code, reason, by_peer=False, error=self._closed_error), self._close_code)
            return
        if self.state is _CLOSE_RECEIVED:  # a repeated CLOSE: the peer is in a hurry
            self.acknowledge_close()
            return
        # A CLOSE with a code other than NORMAL says the peer's side failed (its handler raised,
        # it timed out, ...): the application must be able to tell that from a clean end.
        error = (
            None
            if code == SessionCode.NORMAL
            else SessionClosed(f"the peer closed the session: {code}: {reason}", code=code, reason=reason)
        )
        closed = Closed(code, reason, by_peer=True, error=error)
        if self.state is State.ESTABLISHED:
            # Keep the session open for sending: the application still gets every message that
            # arrived before this CLOSE, and its replies to them go out before our acknowledgement.
            self.state = State.CLOSE_RECEIVED
            self._peer_close = closed
            self._close_deadline = now + self.config.timers.close_timeout / 2
            self._pong_deadline = None
            return
        self._finish(closed, CloseCode.NORMAL)

    # -- resume (docs/PROTOCOL.md "Resume") ------------------------------------------------------

    @property
    def detached(self) -> bool:
        """Established, but without a usable connection: waiting to be resumed."""
        return self.state is _ESTABLISHED and not self._live

    def _offers_resume(self) -> bool:
        if self.role is Role.SERVER:
            return self.config.resume_window > 0
        return self.config.resume

    def _on_resume_hello(self, caps: ResumeCaps) -> None:
        if not self._offers_resume():
            self._reject(SessionCode.RESUME_UNKNOWN, "this server does not resume sessions (resume_window=0)")
            return
        if not caps.token or caps.received is None or caps.received < 0:
            self._protocol_violation(
                "a resuming HELLO needs token and received", SessionCode.MALFORMED_MESSAGE
            )
            return
        assert caps.session_id is not None
        self._resume_request = ResumeRequested(caps.session_id, caps.token, caps.received)
        self._events.append(self._resume_request)

    def refuse_resume(self, code: str, message: str) -> None:
        """Server, fresh connection: answer the resuming HELLO with REJECT ``code``."""
        if self._resume_request is None or self.state is not State.INITIAL:
            return
        self._resume_request = None
        self._reject(code, message)

    def resume_token_matches(self, token: str) -> bool:
        return self.resume is not None and self.resume.token_matches(token)

    @property
    def accepts_resume(self) -> bool:
        """Server: a resuming client may take this session over now (it negotiated resume and
        is established: not closing, not closed)."""
        return self.resume is not None and self.state is _ESTABLISHED

    def replay_wait(self, peer_received: int, now: float) -> float:
        """Server: seconds a resume at ``peer_received`` should wait for its replay (see
        resume.REPLAY_REFILL); 0 when it may go on at once."""
        r = self.resume
        return r.replay_wait(peer_received, now, direct=self._direct) if r is not None else 0.0

    def attach(self, peer_received: int, now: float) -> None:
        """Server: a resuming client's connection now carries this (detached) session. Queues the
        ACCEPT with our count of DATA received, then every DATA message the client did not get."""
        if self.resume is None or self.state is not _ESTABLISHED or self.attached:
            raise ProtocolError(
                "attach() needs a detached session that negotiated resume", code=SessionCode.INVALID_STATE
            )
        self.attached = self._live = True  # DATA goes out directly once the replay is over
        self._resume_deadline = None
        # The first ACCEPT's agreement again, not our offer: a resume negotiates nothing anew
        # (PROTOCOL.md §9), and an ACCEPT always states the agreement (§2).
        assert self._agreed is not None  # set with self.resume
        accept = accept_capabilities(self._own_capabilities(), self._agreed)
        accept.resume = ResumeCaps(buffer=self.config.resume_buffer_bytes, received=self.resume.take_ack())
        self._send_text(encode_message(MessageType.ACCEPT, accept, session_id=self._session_id))
        self._replay(peer_received, now)

    def begin_resume(self, now: float) -> None:
        """Client: a new connection is open; say HELLO with the session id, token and our count."""
        r = self.resume
        if r is None or self.state is not _ESTABLISHED or self.attached:
            raise ProtocolError(
                "begin_resume() needs a detached session that negotiated resume",
                code=SessionCode.INVALID_STATE,
            )
        self.attached = True
        self._resuming = True
        self._live = self._direct = False  # until the ACCEPT: DATA sent meanwhile is retained only
        caps = self._own_capabilities()
        caps.resume = ResumeCaps(
            buffer=self.config.resume_buffer_bytes,
            session_id=self._session_id,
            token=r.token,
            received=r.take_ack(),
        )
        self._send_text(encode_message(MessageType.HELLO, caps))
        self._hello_deadline = now + self.config.timers.hello_timeout

    def request_ack(self, now: float) -> None:
        """Ask the peer for its count now (a PING: the PONG comes with an ACK when one is due),
        e.g. before an orderly close, so the close waits until every DATA message arrived."""
        if self._live and self.state is _ESTABLISHED and self._pong_deadline is None:
            self._ping(now)

    def give_up(self, message: str, code: str = SessionCode.RECONNECT_GAVE_UP) -> None:
        """Client: reconnecting failed for good; end the session with ``code`` (RECONNECT_GAVE_UP
        after max_elapsed; RESUME_UNKNOWN when the transport found the server gone)."""
        if not self.detached:
            return
        err = SessionClosed(f"connection lost and not resumed: {message}", code=code, reason=message)
        self._finish(Closed(code, message, by_peer=False, error=err), None)

    def _on_resume_accept(self, sid: str | None, payload: Any, now: float) -> None:
        assert isinstance(payload, Capabilities)
        granted = payload.resume
        if sid != self._session_id or not isinstance(granted, ResumeCaps) or granted.received is None:
            # e.g. a server that does not know resume answered the HELLO as a new session
            err = SessionClosed(
                f"the server answered the resuming HELLO with a new session ({sid!r}), not ours",
                code=SessionCode.RESUME_UNKNOWN,
            )
            self._send_close(SessionCode.RESUME_UNKNOWN, str(err))
            self._finish(
                Closed(SessionCode.RESUME_UNKNOWN, str(err), by_peer=True, error=err), CloseCode.NORMAL
            )
            return
        self._resuming = False
        self._live = True
        self._hello_deadline = None
        self._replay(granted.received, now)

    def _replay(self, peer_received: int, now: float) -> None:
        r = self.resume
        assert r is not None
        try:
            pending = r.replay(peer_received, now)
        except ProtocolError as exc:
            self._protocol_violation(str(exc), exc.code)
            return
        self._last_received = self._last_data = now
        self._missed_pongs = self._full_pongs = 0  # a new connection: the PONGs count afresh
        self._ping_behind_data = False
        self._pong_deadline = self._ping_sent_at = None
        self._on_resume()
        # The retained messages go out again one at a time, as the shell takes outputs
        # (next_output: _replayed), so a connection lost early costs only what it carried; DATA
        # sent meanwhile is retained only, and the replay takes it in turn.
        self._direct = not pending
        self.stats.reconnects += 1
        self._events.append(Resumed(r.to_resend))

    def _replayed(self) -> Output | None:
        """The next message of the replay in progress, encoded now (a zstd message compressed
        again in the fresh context); None, and DATA goes out directly again, once it is over."""
        r = self.resume
        assert r is not None
        transmitted = r.transmitted
        message = r.next_replayed()
        if message is None:
            self._direct = True
            return None
        if r.transmitted == transmitted:  # it went to a connection before (else it moves on)
            self.stats.retransmitted += 1
        if type(message) is bytes:  # text DATA: its envelope as it was
            return SendMessage(message)
        if isinstance(message, ZstdMessage):
            assert self._zstd is not None  # only a zstd session retains one
            return SendMessage(self._zstd.wire(message))
        if isinstance(message, BinaryTextMessage):
            return SendMessage((message.take_frame(),))
        return SendMessage(message)

    def _on_resume(self) -> None:
        """Hook: the session continues on a new connection, before anything is retransmitted.

        Per-session codec state (a compression context, say) is reset here on both ends: the
        peer's decoder restarts too, and retransmitted messages are those retained, so a codec
        with state must retain its input and encode it again here (docs/PROTOCOL.md "Resume")."""
        self.reset_codec_state()

    def _detach(self, reason: str, now: float) -> None:
        if self.resume is not None:
            self.resume.on_detached(self._direct)
        self.attached = self._live = self._direct = False
        self._resuming = False
        self._hello_deadline = self._pong_deadline = self._ping_sent_at = None
        self._missed_pongs = 0
        self._outputs.clear()  # control messages for the dead connection; DATA is retained
        if self.role is Role.SERVER:
            self._resume_deadline = now + self.config.resume_window
        log.info("session %s detached: %s", self._session_id or "-", reason)
        self._events.append(Detached(reason))

    def _queue_data(self, out: SendMessage, zstd: ZstdMessage | None = None) -> None:
        """Queue a DATA message; with resume, retain it (``zstd``: in the form to compress again)."""
        r = self.resume
        if r is not None:
            message = out.message
            if zstd is not None:
                r.on_sent(zstd, zstd.size)
            else:  # a binary frame (text DATA is retained inline by send())
                if any(type(part) is not bytes for part in message):
                    # Retained past this call: a caller's bytearray or view may change after send().
                    message = tuple(bytes(part) for part in message)
                    out = SendMessage(message)
                r.on_sent(message, message_size(message))
            if not self._direct:
                return  # retained only: sent by the replay of a resume
        self._outputs.append(out)

    def _count_received(self, size: int, message: Message | None = None) -> None:
        r = self.resume
        assert r is not None
        if message is not None and message.algorithm == "zstd":  # text form: counted decompressed,
            size += message.original_bytes - message.wire_bytes  # the content for its #ZS| string
        if r.on_received(size) and self._live:
            self._send_ack()

    def _send_ack(self) -> None:
        assert self.resume is not None
        ack = AckPayload(received=self.resume.take_ack())
        self._send_text(encode_message(MessageType.ACK, ack, session_id=self._session_id))
        self.ack_queued = True

    # -- helpers ----------------------------------------------------------------------------------

    def _own_capabilities(self) -> Capabilities:
        cfg = self.config
        encodings = cfg.resolved_encodings()
        return Capabilities(
            version=PROTOCOL_VERSION,
            agent_id=cfg.agent_id,
            agent_type=cfg.agent_type,
            compression=CompressionCaps(
                algorithms=[a.value for a in cfg.algorithms],
                max_payload=cfg.max_payload,
                streaming=False,
                ml_routing=False,
                encodings=[e.reference_name for e in encodings],
                preferred_encoding=cfg.resolved_preferred().reference_name,
                zstd=self._own_zstd_caps() or msgspec.UNSET,
            ),
            security=SecurityCaps(),
            avp=LatentCaps(identity=cfg.identity) if cfg.identity is not None else LatentCaps(),
            token=cfg.token if cfg.token is not None and self.role is Role.CLIENT else msgspec.UNSET,
            resume=ResumeCaps(buffer=cfg.resume_buffer_bytes) if self._offers_resume() else msgspec.UNSET,
            binary_text=True if cfg.binary_text else msgspec.UNSET,
        )

    def _own_zstd_caps(self) -> ZstdCaps | None:
        cfg = self.config
        if Algorithm.ZSTD not in cfg.algorithms:
            return None
        z = cfg.zstd
        dictionaries = [d.id for d in z.dictionaries]
        return ZstdCaps(window=z.window, binary=z.binary, dictionaries=dictionaries, history=z.history)

    def _establish(self, result: Negotiated, peer: Capabilities, now: float) -> None:
        assert self._session_id is not None
        self.state = State.ESTABLISHED
        self._hello_deadline = None
        self._last_received = self._last_data = now
        self.info = SessionInfo(
            session_id=self._session_id,
            role=self.role,
            algorithms=result.algorithms,
            encoding=result.encoding,
            mode=result.mode,
            mode_reason=result.mode_reason,
            avp_map_id=result.avp_map_id,
            max_payload=result.max_payload,
            peer_agent_id=peer.agent_id,
            peer_agent_type=peer.agent_type,
            peer_version=peer.version,
            zstd_window=result.zstd.window if result.zstd is not None else 0,
            zstd_dictionary=(result.zstd.dictionary or "") if result.zstd is not None else "",
            zstd_history=result.zstd is not None and result.zstd.history,
            binary_text=result.binary_text,
        )
        if result.binary_text:
            self._binary_text = BinaryText(self._session_id)
        # Never above our own: a client that announced none (max_payload=0) must not take a
        # hostile server's 1 GiB as its limit.
        own = self._own_payload_limit()
        self._payload_limit = min(result.max_payload or own, own)
        if self._payload_limit < self._limits.max_output_bytes:
            self._limits = replace(self._limits, max_output_bytes=self._payload_limit)
        if result.zstd is not None:
            options = self.config.zstd
            self._zstd = ZstdSessionState(
                self._session_id,
                result.zstd.window,
                level=options.level,
                dictionary=options.dictionary(result.zstd.dictionary) if result.zstd.dictionary else None,
                peer_binary=result.zstd.peer_binary,
                history=result.zstd.history,
            )
        self._events.append(Established(self.info))

    @property
    def channel_limit(self) -> int:
        """The incoming message limit the channel applies before buffering: control messages only
        until the session is established, then its payload limit (the negotiated max_payload,
        or the Limits' max_message_bytes where none was announced: a channel without a limit
        would buffer what the core then refuses)."""
        if self.info is None:
            return CONTROL_MESSAGE_LIMIT
        return transport_limit(self._payload_limit)

    def _own_payload_limit(self) -> int:
        """The largest message this end accepts: its max_payload, or where it announces none
        (0), its Limits' max_message_bytes."""
        return self.config.max_payload or self.config.limits.max_message_bytes

    def _require_established(self) -> SessionInfo:
        """The session info if the application may send (also after the peer's CLOSE, until we
        acknowledge it: replies it still owes go out first), else raise."""
        state = self.state
        if (state is not _ESTABLISHED and state is not _CLOSE_RECEIVED) or self.info is None:
            if self._closed_event is not None:
                raise closed_error(self._closed_event)  # what recv() raises, too
            raise SessionClosed(f"session is {self.state.value}, not ESTABLISHED", code=self.state.value)
        return self.info

    def _too_big(self, size: int, what: str) -> None:
        limit = self._payload_limit
        err = LimitExceeded(
            f"received {what} of {size} bytes, over the negotiated max_payload of {limit} bytes",
            limit=limit,
            actual=size,
        )
        self._fail(err, SessionCode.MESSAGE_TOO_BIG, CloseCode.TOO_BIG)

    def _large_message_allowed(self, data: bytes) -> bool:
        """A message over CONTROL_MESSAGE_LIMIT may only be DATA (within max_payload) in an
        established session; anything else fails the session before it is parsed."""
        try:
            kind = _type_decoder.decode(data).type
        except (msgspec.DecodeError, UnicodeError):
            kind = ""
        except RecursionError:  # msgspec skips nested values recursively: malformed, as a smaller
            self._protocol_violation(TOO_DEEP, SessionCode.MALFORMED_MESSAGE)  # message is
            return False
        size = len(data)
        if kind == "DATA" and MessageType.DATA in self._expected():
            if size > self._payload_limit:
                self._too_big(size, "DATA message")
            return self.state is not _CLOSED
        err = LimitExceeded(
            f"{_bounded(kind) or 'a message'} of {size} bytes: control messages are limited to "
            f"{CONTROL_MESSAGE_LIMIT} bytes",
            limit=CONTROL_MESSAGE_LIMIT,
            actual=size,
        )
        self._fail(err, SessionCode.MESSAGE_TOO_BIG, CloseCode.TOO_BIG)
        return False

    def _deliver(self, message: Message, now: float) -> Message:
        self._last_data = now
        s = self.stats
        s.messages_received += 1
        s.wire_bytes_received += message.wire_bytes
        s.original_bytes_received += message.original_bytes
        return message

    def _account_sent(self, sent: SentInfo, now: float) -> None:
        self._last_data = now
        s = self.stats
        s.messages_sent += 1
        s.original_bytes_sent += sent.original_bytes
        s.wire_bytes_sent += sent.wire_bytes
        key = sent.algorithm if not sent.binary or sent.algorithm == "avp" else sent.algorithm + "/binary"
        by_algorithm = s.by_algorithm
        by_algorithm[key] = by_algorithm.get(key, 0) + 1

    def _ping_due(self, interval: float) -> float:
        """When the next PING goes out: ``interval`` after the last message received, and while
        our retention buffer is full, also ``interval`` after our last PING. A peer that keeps
        talking never lets the first come due, and the PONGs are what tells a peer that
        acknowledges nothing (_check_acknowledging): one that sent a DATA every 9 s kept our
        send() waiting for good (stop 32's review)."""
        due = self._last_received + interval
        r = self.resume
        if r is not None and r.retained_bytes >= r.buffer_bytes:  # .full, inline
            pinged = self._last_pinged + interval
            return pinged if pinged < due else due
        return due

    def _ping(self, now: float) -> None:
        self._send_text(encode_message(MessageType.PING, session_id=self._session_id))
        # Control messages go ahead of a replay's DATA (next_output): a PONG to a PING sent
        # during one does not say the peer has the replayed messages, which it may not have read.
        self._ping_behind_data = self._direct
        self._pong_deadline = now + self.config.timers.pong_timeout
        self._ping_sent_at = self._last_pinged = now

    def _send_text(self, text: bytes) -> None:
        self._queue_output(SendMessage(text))

    def _queue_output(self, out: Output) -> None:
        self._outputs.append(out)

    def _begin_close(self, code: str, message: str, now: float, error: M2MError | None = None) -> None:
        """ESTABLISHED -> CLOSING: say CLOSE and wait up to close_timeout for its acknowledgement.
        No PINGs meanwhile (the peer answers the CLOSE or the close timer ends it); ``error`` is
        what the session ends with when we close for a cause (None for the application's close)."""
        self._finish_replay()
        self._send_close(code, message)
        self._closing = (code, message)
        self.state = State.CLOSING
        self._close_deadline = now + self.config.timers.close_timeout
        self._pong_deadline = None
        self._closed_error = error

    def _finish_replay(self) -> None:
        """Before an orderly CLOSE: the rest of a replay in progress goes out first, as what was
        sent before the close must (docs/PROTOCOL.md §3), all at once since nothing follows it."""
        if not self._direct and self._live:
            while (out := self._replayed()) is not None:  # bounded by the retained messages
                self._queue_output(out)

    def _send_close(self, code: str, message: str) -> None:
        payload = ClosePayload(reason=_bounded(code), message=_bounded(message))
        self._send_text(encode_message(MessageType.CLOSE, payload, session_id=self._session_id))

    def _reject(self, code: str, message: str) -> None:
        message = _bounded(message)
        self._send_text(encode_message(MessageType.REJECT, Rejection(code=code, message=message)))
        err = SessionRejected(f"rejected the client's HELLO: {code}: {message}", code=code)
        self._finish(Closed(code, message, by_peer=False, error=err), CloseCode.NORMAL)

    def _refuse_data(self, what: str, exc: M2MError) -> None:
        """Received DATA that cannot be delivered: content decoding past this session's size bounds
        closes with MESSAGE_TOO_BIG (1009), anything else undecodable with INVALID_DATA (1002)."""
        limits = self._limits
        # A size bound is recognised by its value: the JSON limits (depth, elements, string bytes)
        # are other numbers unless configured equal to a size bound, and then only the code differs.
        if isinstance(exc, LimitExceeded) and exc.limit in (
            self._payload_limit,
            limits.max_output_bytes,
            limits.max_message_bytes,
        ):
            why = f"{what} refused: {exc}"
            if exc.limit == self._payload_limit:
                why += f" (the negotiated max_payload, {self._payload_limit} bytes, bounds decoded content)"
            err = LimitExceeded(why, limit=exc.limit, actual=exc.actual)
            self._fail(err, SessionCode.MESSAGE_TOO_BIG, CloseCode.TOO_BIG)
            return
        self._protocol_violation(f"undecodable {what}: {exc}", SessionCode.INVALID_DATA)

    def _expected(self) -> frozenset[Inbound]:
        """The messages this session expects now (session/states.py's table)."""
        return expected(
            self.role, self.state, verdict_pending=self._awaiting_verdict is not None, resuming=self._resuming
        )

    def _unexpected(self, kind: Inbound, now: float) -> None:
        """A message the table does not expect now: the violation it is, or an ignored ACK."""
        violation = unexpected(self.role, self.state, kind)
        if violation is None:  # rate-limited: a peer must not be able to grow the log by flooding
            self._warn(now, "ignoring ACK before the session is established")
            return
        self._protocol_violation(violation.message, violation.code)

    def _protocol_violation(self, message: str, code: str) -> None:
        self._fail(ProtocolError(message, code=code), code, CloseCode.PROTOCOL_ERROR)

    def _fail(self, err: M2MError, code: str, close_code: int) -> None:
        """The peer broke the rules: tell it why (REJECT before a session exists, else CLOSE), then end."""
        reason = _bounded(str(err))
        self._tell_peer(code, reason)
        log.warning("session %s: %s: %s", self._session_id or "-", code, reason)
        self._finish(Closed(code, reason, by_peer=False, error=err), close_code)

    def _tell_peer(self, code: str, reason: str) -> None:
        """Before ending the session: say why, by REJECT before a session exists, else by CLOSE."""
        if self.state is State.INITIAL and self.role is Role.SERVER:
            self._send_text(
                encode_message(
                    MessageType.REJECT, Rejection(code=RejectCode.UNKNOWN, message=f"{code}: {reason}")
                )
            )
        elif self.state in (State.ESTABLISHED, State.CLOSE_RECEIVED, State.CLOSING, State.HELLO_SENT):
            self._send_close(code, reason)

    def _warn(self, now: float, message: str, *args: object) -> None:
        """log.warning, at most once per WARNING_INTERVAL for this session (counting the rest)."""
        if now < self._warned_at + WARNING_INTERVAL:
            self._warnings_suppressed += 1
            return
        suppressed, self._warnings_suppressed = self._warnings_suppressed, 0
        self._warned_at = now
        more = f" ({suppressed} similar warnings suppressed)" if suppressed else ""
        log.warning("session %s: " + message + "%s", self._session_id or "-", *args, more)

    def _finish(self, event: Closed, close_code: int | None) -> None:
        if event.error is not None:
            _drop_tracebacks(event.error)
        self.state = State.CLOSED
        self._hello_deadline = self._close_deadline = self._pong_deadline = self._resume_deadline = None
        if self.resume is not None:  # a replay in progress ends with the session: nothing follows
            self.resume.stop_replay()  # its CloseTransport (an orderly close sent it all before)
            self._direct = True
        self._closed_event = event
        self._events.append(event)
        if close_code is not None:
            # The reason may be the peer's CLOSE or REJECT code, any string: 100 characters of
            # it (the old cut) could be 300 bytes, which websockets refuses to send, turning
            # this orderly close into an abort.
            reason = (self._close_reason or event.code).encode("utf-8", "replace")
            self._queue_output(CloseTransport(close_code, cut_utf8(reason, CLOSE_REASON_BYTES).decode()))


def _drop_tracebacks(error: BaseException) -> None:
    """Forget where ``error`` (and what caused it) was raised: the frames in a traceback hold the
    objects of the session (channel, shell), and the session holds the error, a reference cycle
    that only the garbage collector would free, with every buffer the session still holds."""
    for exc in (error, error.__cause__, error.__context__):
        if exc is not None:
            exc.__traceback__ = None


def _oversized_lists(caps: Capabilities) -> str | None:
    """Why a HELLO's lists are too long to negotiate over, or None."""
    for name, items in (
        ("algorithms", caps.compression.algorithms),
        ("encodings", caps.compression.encodings),
    ):
        if len(items) > MAX_CAPABILITY_ITEMS:
            return f"HELLO lists {len(items)} {name}; at most {MAX_CAPABILITY_ITEMS} are accepted"
    return None


_Handler = Callable[[SessionProtocol, str | None, Any, float], Message | None]
_HANDLERS: dict[MessageType, _Handler] = {
    MessageType.HELLO: SessionProtocol._on_hello,
    MessageType.ACCEPT: SessionProtocol._on_accept,
    MessageType.REJECT: SessionProtocol._on_reject,
    MessageType.DATA: SessionProtocol._on_data,
    MessageType.PING: SessionProtocol._on_ping,
    MessageType.PONG: SessionProtocol._on_pong,
    MessageType.CLOSE: SessionProtocol._on_close,
    MessageType.ACK: SessionProtocol._on_ack,
}
