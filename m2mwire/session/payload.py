"""Payload coding: DATA content to wire forms and back, as pure functions.

Nothing here knows the session's state machine or the time: each function takes what the session
negotiated (algorithms, encoding, the max_payload bound, the codec limits, the zstd context when
there is one) and returns what goes on the wire or what the application receives, or raises an
:class:`~m2mwire.errors.M2MError`. :mod:`m2mwire.session.core` decides what an error does to the
session (which close code, whether the peer is told), so that these rules are tested without a
session (tests/session/test_payload.py).

Formats, magic bytes and frame sizes come from the codecs that own them (``codecs.avp``,
``codecs.m2mframe``, ``codecs.zstdcontext``, TokenNative's ``Encoding.binary_id``); nothing is
spelled twice.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Literal

import msgspec

from m2mwire.codecs import (
    Algorithm,
    Encoding,
    compress_binary,
    decode_m2m_binary,
    decode_wire,
    decompress_binary,
    encode_m2m_binary,
    select_algorithm,
)
from m2mwire.codecs.avpheader import FLAG_COMPRESSED, HEADER_SIZE, MAGIC, payload_size
from m2mwire.codecs.buffers import Buffer
from m2mwire.codecs.jsonutil import JsonValue, loads_limited, parse_json
from m2mwire.codecs.limits import DEFAULT_LIMITS, Limits
from m2mwire.codecs.m2mframe import M2M_PREFIX
from m2mwire.codecs.select import NONE_BELOW, Optimize
from m2mwire.codecs.tokenizers import estimated_tokens
from m2mwire.codecs.utf8 import utf8_len
from m2mwire.codecs.varint import b64encode
from m2mwire.codecs.wire import encode_with
from m2mwire.codecs.zstdcontext import ZSTD_PREFIX, payload_bound
from m2mwire.errors import DecodeError, EncodeError, LimitExceeded
from m2mwire.schemas.codes import SessionCode, Violation
from m2mwire.schemas.messages import DataPayload, encode_data
from m2mwire.session.binarytext import BINARY_TEXT_KIND, BinaryText
from m2mwire.session.zstdstate import ZstdMessage, ZstdSessionState, text_form_bound

if TYPE_CHECKING:
    from m2mwire.codecs.avp import (
        AVPMessage,  # imported when a frame arrives: numpy stays off text sessions
        AVPMetadata,
    )
    from m2mwire.session.config import SessionConfig
    from m2mwire.session.events import SessionInfo

__all__ = [
    "AVP_MORE_KEY",
    "AVP_REPLY_TO_KEY",
    "AVP_REQUEST_ID_KEY",
    "AVP_RESERVED_PREFIX",
    "Message",
    "SentInfo",
    "avp_extra",
    "avp_metadata",
    "check_avp_frame",
    "check_payload_size",
    "correlate",
    "decode_binary",
    "decode_text_data",
    "encode_binary",
    "encode_text",
    "queued_cost",
    "zstd_binary_tokens",
    "zstd_message",
]

# Reserved keys of an AVP frame's extra map that carry the request/stream correlation fields
# (AVP frames have no DATA envelope): docs/PROTOCOL.md "Requests and streams".
AVP_RESERVED_PREFIX = "m2mwire."
AVP_REQUEST_ID_KEY = "m2mwire.request_id"
AVP_REPLY_TO_KEY = "m2mwire.reply_to"
AVP_MORE_KEY = "m2mwire.more"
#: What one entry of a received AVP frame's ``extra`` map is charged while the message waits for
#: the application (``Message.decoded_bytes``): ~200 bytes measured for short keys and values.
EXTRA_ENTRY_COST = 256

# The first byte of a binary message names its form (docs/PROTOCOL.md §4), each from its codec.
_AVP_FIRST, _AVP_SECOND = MAGIC[0], MAGIC[1]
_M2M_FIRST = ord(M2M_PREFIX[0])
_TOKENNATIVE_BINARY_IDS = frozenset(enc.binary_id for enc in Encoding)

# Messages carry algorithm names as plain str (Enum.value is a slow property).
_UNSET = msgspec.UNSET
_NAMES: dict[Algorithm, str] = {a: a.value for a in Algorithm}


# Message and SentInfo are made once per message: frozen msgspec Structs build ten times faster
# than frozen dataclasses (0.14 vs 1.5 us) and read the same.


class Message(msgspec.Struct, frozen=True, kw_only=True):
    """One received DATA message: what arrived and how it travelled."""

    kind: Literal["text", "json", "avp"]
    algorithm: str  # wire algorithm ("tokennative", "brotli", ...) or "avp"
    binary: bool  # True when it came as a binary frame
    wire_bytes: int
    original_bytes: int
    text: str | None = None
    value: JsonValue = None  # the parsed JSON value when kind == "json"
    avp: AVPMessage | None = None
    # Requests and streams (Session.request/stream/reply): set when the peer expects an answer
    # (request_id) or when this answers one of ours (reply_to; more=True for a stream part).
    request_id: str | None = None
    reply_to: str | None = None
    more: bool = False
    traceparent: str | None = None  # a request's W3C trace context (OpenTelemetry), if it sent one
    tracestate: str | None = None
    # Bytes this message holds in memory once decoded: the text object, plus for JSON an upper-bound
    # estimate of the parsed value (jsonutil.json_cost, up to ~24x the text), plus for AVP the frame
    # and any decompressed payload. What a queue of received messages should count against a byte
    # bound: the wire size can be thousands of times smaller (compression) or larger (escapes).
    decoded_bytes: int = 0

    @property
    def extra(self) -> dict[str, str]:
        """The application's metadata of an AVP frame (its ``extra`` map without the reserved
        ``m2mwire.*`` correlation keys); empty for text and JSON."""
        if self.avp is None:
            return {}
        return {k: v for k, v in self.avp.metadata.extra.items() if not k.startswith(AVP_RESERVED_PREFIX)}

    def json(self) -> Any:
        """The JSON value (parsing the text if it came as text)."""
        if self.kind == "json":
            return self.value
        if self.text is None:
            raise DecodeError("this message is an AVP frame, not JSON")
        return loads_limited(self.text)


class SentInfo(msgspec.Struct, frozen=True):
    """What send() put on the wire. Token counts (cl100k) only with ``token_stats=True``."""

    algorithm: str
    binary: bool
    original_bytes: int
    wire_bytes: int
    original_tokens: int | None = None
    wire_tokens: int | None = None


# -- receiving ------------------------------------------------------------------------------------


def decode_text_data(payload: DataPayload, limits: Limits, zstd: ZstdSessionState | None) -> Message:
    """The Message of a text DATA payload: its content decoded by prefix (never by ``algorithm``),
    JSON parsed when ``content_type`` says so. ``limits.max_output_bytes`` is already at most the
    negotiated max_payload, so decoded content is bounded by it. Raises M2MError (DecodeError,
    LimitExceeded, TokenizerUnavailable, ...) for content that cannot be delivered."""
    content = payload.content
    wire_bytes = len(content) if content.isascii() else utf8_len(content)
    if zstd is not None and content.startswith(ZSTD_PREFIX):
        text, algorithm = zstd.decode_text(content, limits.max_output_bytes), "zstd"
        original = utf8_len(text)
    elif content.startswith("#") or wire_bytes > min(limits.max_message_bytes, limits.max_output_bytes):
        decoded = decode_wire(content, limits=limits)  # raises for the limits
        text, algorithm = decoded.content, _NAMES[decoded.algorithm]
        original = wire_bytes if text is content else utf8_len(text)
    else:  # no prefix: NONE, decode_wire's first case without its calls (the hot path)
        text, algorithm, original = content, "none", wire_bytes
    held = sys.getsizeof(text)
    if payload.content_type == "json":
        value, cost = parse_json(text, limits=limits)
        return _data_message(
            payload, "json", algorithm, False, wire_bytes, original, text, value, held + cost
        )
    return _data_message(payload, "text", algorithm, False, wire_bytes, original, text, None, held)


# codecs.avp.decode, imported with numpy and protobuf on the first AVP frame (text sessions never
# load them); held here because a function-level import costs ~0.4 us per frame.
_avp_decode: Callable[..., AVPMessage] | None = None


def _load_avp_decode() -> Callable[..., AVPMessage]:
    global _avp_decode
    from m2mwire.codecs.avp import decode

    _avp_decode = decode
    return decode


def decode_binary(
    data: Buffer,
    *,
    mode: str,
    limits: Limits,
    payload_limit: int,
    zstd: ZstdSessionState | None,
    session_id: str | None,
    binary_text: BinaryText | None = None,
) -> Message | Violation:
    """The Message of one binary frame, by its first byte: an AVP frame (``mode`` must be LATENT),
    an M2M v1 frame in binary form, a zstd-context message (when ``zstd`` was negotiated, and for
    ``session_id``), text DATA in binary form (when ``binary_text`` was negotiated) or TokenNative
    binary. A frame that breaks a rule is a Violation; one that cannot be decoded raises M2MError.
    ``payload_limit`` (the negotiated max_payload) bounds a compressed AVP payload before it is
    decompressed."""
    view = data if type(data) is bytes else memoryview(data)  # bytes index and slice as they are
    size = len(view)
    if size == 0:
        return Violation(SessionCode.MALFORMED_MESSAGE, "empty binary frame")
    first = view[0]
    if first == _AVP_FIRST and size > 1 and view[1] == _AVP_SECOND:
        if mode != "LATENT":
            return Violation(
                SessionCode.MODE_VIOLATION, f"AVP frame received but the negotiated mode is {mode}"
            )
        # bytes take avp's quickest input path; a compressed payload is held to max_payload (and a
        # hidden state to its shape) before anything is decompressed
        frame = (_avp_decode or _load_avp_decode())(data, limits=limits, max_output_bytes=payload_limit)
        payload_bytes = len(frame.payload)
        # the payload is a view into the frame unless it was decompressed
        held = size + payload_bytes if frame.header.flags & FLAG_COMPRESSED else size
        # has_extra first: building frame.metadata costs more than decoding the frame
        if frame.has_extra:
            # A parsed map entry costs far more than its bytes on the wire (two str objects and
            # the protobuf's and the dict's slots): a frame of 1-byte keys held ~20x its size
            # while max_queue_bytes counted it at its size (stop 30's attack run).
            held += EXTRA_ENTRY_COST * frame.extra_count
        if frame.has_extra and (
            AVP_REQUEST_ID_KEY in (extra := frame.metadata.extra) or AVP_REPLY_TO_KEY in extra
        ):
            return Message(
                kind="avp",
                algorithm="avp",
                binary=True,
                wire_bytes=size,
                original_bytes=payload_bytes,
                avp=frame,
                request_id=extra.get(AVP_REQUEST_ID_KEY),
                reply_to=extra.get(AVP_REPLY_TO_KEY),
                more=extra.get(AVP_MORE_KEY) == "1",
                decoded_bytes=held,
            )
        return Message(
            kind="avp",
            algorithm="avp",
            binary=True,
            wire_bytes=size,
            original_bytes=payload_bytes,
            avp=frame,
            decoded_bytes=held,
        )
    if first == _M2M_FIRST:
        text = decode_m2m_binary(view, limits=limits)
        return _binary_text(text, "m2m", size)
    if binary_text is not None and first == BINARY_TEXT_KIND:
        frame_session, payload, kind, text = binary_text.decode(view)
        return _enveloped(frame_session, session_id, payload, kind, text, "none", size, limits)
    if zstd is not None and first == zstd.kind:  # 0x5A, or 0x48 with shared history
        frame_session, payload, kind, text = zstd.decode_binary(view, payload_limit)
        return _enveloped(frame_session, session_id, payload, kind, text, "zstd", size, limits)
    if first in _TOKENNATIVE_BINARY_IDS:
        return _binary_text(decompress_binary(view, limits=limits), "tokennative", size)
    zstd_kind = (
        f", {chr(zstd.kind)!r} (zstd context, as negotiated)"
        if zstd is not None
        else " (zstd frames only once zstd is negotiated)"
    )
    text_kind = ", 'T' (text, as negotiated)" if binary_text is not None else ""
    # AVP's magic is two bytes: name both when the first is its 'A'
    start = (
        f"bytes 0x{first:02x} 0x{view[1]:02x}" if first == _AVP_FIRST and size > 1 else f"byte 0x{first:02x}"
    )
    return Violation(
        SessionCode.MALFORMED_MESSAGE,
        f"binary frame starts with {start}: expected 0x00-0x02 (TokenNative), "
        f"'#' (M2M v1), 'AV' (AVP, 41 56){zstd_kind}{text_kind}",
    )


def _enveloped(
    frame_session: str | None,
    session_id: str | None,
    payload: DataPayload | None,
    kind: Literal["text", "json"],
    text: str,
    algorithm: str,
    size: int,
    limits: Limits,
) -> Message | Violation:
    """The Message of a binary DATA message that carries its own envelope (zstd, binary text)."""
    if frame_session != session_id:
        return Violation(
            SessionCode.UNKNOWN_SESSION, f"DATA for session {frame_session!r} on session {session_id!r}"
        )
    held = sys.getsizeof(text)
    value = None
    if kind == "json":
        value, cost = parse_json(text, limits=limits)
        held += cost
    return _data_message(payload, kind, algorithm, True, size, utf8_len(text), text, value, held)


def _binary_text(text: str, algorithm: str, size: int) -> Message:
    return Message(
        kind="text",
        algorithm=algorithm,
        binary=True,
        wire_bytes=size,
        original_bytes=utf8_len(text),
        text=text,
        decoded_bytes=sys.getsizeof(text),
    )


def _data_message(
    payload: DataPayload | None,
    kind: Literal["text", "json"],
    algorithm: str,
    binary: bool,
    wire_bytes: int,
    original: int,
    text: str,
    value: JsonValue,
    decoded_bytes: int,
) -> Message:
    """The Message for a decoded DATA payload, with its request fields when it has any."""
    if payload is None or (payload.request_id is _UNSET and payload.reply_to is _UNSET):
        # plain DATA, the usual case
        return Message(
            kind=kind,
            algorithm=algorithm,
            binary=binary,
            wire_bytes=wire_bytes,
            original_bytes=original,
            text=text,
            value=value,
            decoded_bytes=decoded_bytes,
        )
    request_id, reply_to = payload.request_id, payload.reply_to
    # The ids are held with the message: charged as what they are (a 10 MB request_id on a 1 KiB
    # message was counted as 1 KiB, and 64 of them held ~650 MB against max_queue_bytes).
    for field in (request_id, reply_to, payload.traceparent, payload.tracestate):
        if isinstance(field, str):
            decoded_bytes += sys.getsizeof(field)
    return Message(
        kind=kind,
        algorithm=algorithm,
        binary=binary,
        wire_bytes=wire_bytes,
        original_bytes=original,
        text=text,
        value=value,
        request_id=request_id if isinstance(request_id, str) else None,
        reply_to=reply_to if isinstance(reply_to, str) else None,
        more=payload.more is True,
        traceparent=payload.traceparent if isinstance(payload.traceparent, str) else None,
        tracestate=payload.tracestate if isinstance(payload.tracestate, str) else None,
        decoded_bytes=decoded_bytes,
    )


def zstd_binary_tokens(frame: Buffer) -> int:
    """token_stats for a binary zstd message: the tokens of its #ZS| text form, what the same
    bytes would cost an LLM reading the wire."""
    return estimated_tokens(ZSTD_PREFIX + b64encode(memoryview(frame)[1:]))


# -- sending --------------------------------------------------------------------------------------


def check_payload_size(size: int, limit: int, what: str) -> None:
    """Raise LimitExceeded when ``size`` bytes of ``what`` exceed the negotiated max_payload."""
    if size > limit:
        raise LimitExceeded(
            f"{what} is {size} bytes, over the negotiated max_payload of {limit} bytes",
            limit=limit,
            actual=size,
        )


def correlate(
    payload: DataPayload,
    request_id: str | None,
    reply_to: str | None,
    more: bool,
    trace: Mapping[str, str] | None,
) -> DataPayload:
    """Set a request's or an answer's fields on ``payload`` (docs/PROTOCOL.md "Requests and streams")."""
    if request_id is not None:
        payload.request_id = request_id
    if reply_to is not None:
        payload.reply_to = reply_to
        payload.more = more
    if trace:
        payload.traceparent = trace.get("traceparent", msgspec.UNSET)
        payload.tracestate = trace.get("tracestate", msgspec.UNSET)
    return payload


def avp_extra(
    extra: Mapping[str, str] | None,
    *,
    tensor: bool,
    request_id: str | None = None,
    reply_to: str | None = None,
    more: bool = False,
) -> Mapping[str, str] | None:
    """The ``extra`` map of an AVP frame: the application's own keys, which may not use the
    reserved prefix, plus a request's or an answer's correlation ids (docs/PROTOCOL.md "Requests
    and streams"), which only a frame built here from a tensor (``tensor``) can carry."""
    if extra and any(key.startswith(AVP_RESERVED_PREFIX) for key in extra):
        raise EncodeError(
            f"extra= keys starting with {AVP_RESERVED_PREFIX!r} are reserved for m2mwire's "
            "request correlation; rename them (a received message's .extra leaves them out)"
        )
    if request_id is None and reply_to is None:
        return extra
    if not tensor:
        raise EncodeError(
            "requests and replies carry AVP content as a numpy tensor (its correlation "
            "ids go in the frame's extra map), not as an already-encoded frame"
        )
    ids = dict(extra or {})
    if request_id is not None:
        ids[AVP_REQUEST_ID_KEY] = request_id
    if reply_to is not None:
        ids[AVP_REPLY_TO_KEY] = reply_to
        ids[AVP_MORE_KEY] = "1" if more else "0"
    return ids


def avp_metadata(info: SessionInfo, config: SessionConfig) -> AVPMetadata:
    """The metadata of the AVP frames a session sends: its ids, the peer's agent id and the model
    identity it negotiated latent mode with (one object for all of them: identical metadata keeps
    ``encode_parts`` on its fast path). Loads numpy and protobuf: call it on the first tensor."""
    from m2mwire.codecs.avp import AVPMetadata, CommunicationMode

    identity = config.identity
    return AVPMetadata(
        session_id=info.session_id,
        source_agent_id=config.agent_id,
        target_agent_id=info.peer_agent_id,
        model_id=identity.model_id if identity is not None else "",
        hidden_dim=identity.hidden_dim if identity is not None else 0,
        num_layers=identity.num_layers if identity is not None else 0,
        mode=CommunicationMode.LATENT,
        avp_map_id=info.avp_map_id,
    )


def encode_binary(
    text: str,
    algorithm: Algorithm | None,
    *,
    algorithms: Iterable[Algorithm],
    encoding: Encoding,
    limits: Limits,
    payload_limit: int,
) -> tuple[Algorithm, bytes]:
    """``text`` as one binary frame: TokenNative binary, or with ``algorithm=M2M`` an M2M v1 frame
    in binary form. Raises EncodeError when that form was not negotiated, LimitExceeded when the
    frame is over max_payload."""
    kind = Algorithm.M2M if algorithm is Algorithm.M2M else Algorithm.TOKENNATIVE
    if kind not in algorithms:
        raise EncodeError(
            f"binary=True sends {kind.value} binary frames, but {kind.value} was not negotiated "
            f"(negotiated: {', '.join(a.value for a in algorithms)})"
        )
    if kind is Algorithm.M2M:
        frame = encode_m2m_binary(text, limits=limits)
    else:
        frame = compress_binary(text, encoding=encoding)
    check_payload_size(len(frame), payload_limit, f"{kind.value} binary frame")
    return kind, frame


def encode_text(
    text: str,
    content_type: Literal["text", "json"],
    original: int,
    algorithm: Algorithm | None,
    *,
    algorithms: tuple[Algorithm, ...],
    encoding: Encoding,
    optimize: Optimize,
    session_id: str,
    limits: Limits,
    payload_limit: int,
    correlation: tuple[str | None, str | None, bool, Mapping[str, str] | None] | None = None,
) -> tuple[bytes, str, str, int]:
    """One text DATA message for ``text`` (``original`` UTF-8 bytes): its envelope (UTF-8), the wire
    algorithm's name, the wire string and its size. ``algorithm=None`` selects one for
    ``optimize``; ``correlation`` is (request_id, reply_to, more, trace) for a request or an answer.
    Raises EncodeError for an algorithm not negotiated, LimitExceeded for a message over
    max_payload."""
    if algorithm is None:
        algorithm = select_algorithm(text, allowed=algorithms, optimize=optimize, encoding=encoding)
    elif algorithm not in algorithms:
        raise EncodeError(
            f"algorithm {algorithm.value} was not negotiated for this session "
            f"(negotiated: {', '.join(a.value for a in algorithms)})"
        )
    wire = encode_with(text, algorithm, encoding, limits=limits)
    wire_len = original if wire is text else utf8_len(wire)
    payload = DataPayload(
        algorithm=algorithm, content=wire, original_size=original, content_type=content_type
    )
    if correlation is not None:
        correlate(payload, *correlation)
    envelope = encode_data(payload, session_id)
    if len(envelope) > payload_limit:
        check_payload_size(len(envelope), payload_limit, "DATA message")
    return envelope, _NAMES[algorithm], wire, wire_len


def zstd_message(
    state: ZstdSessionState,
    text: str,
    content_type: Literal["text", "json"],
    original: int,
    *,
    session_id: str,
    payload_limit: int,
    correlation: DataPayload | None,
    explicit: bool,
) -> ZstdMessage | None:
    """``text`` as a zstd-context message, not yet compressed: in the binary form when the peer
    accepts it and it fits, else in the text form (``#ZS|``); None when it cannot go that way and
    automatic selection (``explicit=False``) should choose another algorithm. ``correlation`` holds
    a request's or an answer's fields (None on plain DATA). ``state.wire()`` compresses it.

    Every size check happens here, before compressing: a message compressed into the context must
    be sent, or the peer's context would miss it. Raises LimitExceeded when ``explicit`` and the
    message is too close to max_payload for zstd's worst case."""
    limit = payload_limit
    if state.peer_binary:
        # The whole DATA message goes through the context (see inner_message), bounded like a
        # text message: at most max_payload.
        envelope = state.envelope(content_type, correlation)
        inner = len(envelope) + original
        if inner <= limit and 1 + payload_bound(inner) <= limit:
            return ZstdMessage(envelope + text.encode("utf-8"))
    # The text form: only the content goes through the context, inside a plain DATA envelope.
    # Chosen automatically only from NONE_BELOW bytes on, like every base64 form (below it the
    # base64 payload is longer than the content).
    if not explicit and original < NONE_BELOW:
        return None
    payload = correlation or DataPayload(algorithm="zstd", content="")
    payload.content, payload.original_size, payload.content_type = "", original, content_type
    # The envelope without its content, measured exactly (request and trace fields vary).
    head = len(encode_data(payload, session_id))
    if text_form_bound(original) + head <= limit:
        message = ZstdMessage(text.encode("utf-8"), payload)
        # What wire() would fix (ZstdMessage.size): its envelope holds the #ZS| string as it is
        # (base64: nothing to escape), so the envelope with the content in its place is this long.
        message.size = head + original
        return message
    if explicit:
        raise LimitExceeded(
            f"message content of {original} bytes is too close to the negotiated max_payload of {limit} "
            "bytes for zstd's worst case; send it with algorithm='brotli' or raise max_payload",
            limit=limit,
            actual=original,
        )
    return None


def check_avp_frame(parts: Sequence[Buffer], payload_limit: int) -> int:
    """The size of an encoded AVP frame given as buffers, after checking what the receiver will:
    it starts with the AVP magic and a whole header (EncodeError), it is within max_payload, and
    so is its payload once decompressed, and its metadata is within what a receiver parses
    (LimitExceeded)."""
    size, head = _frame_size_and_head(parts)
    if size < HEADER_SIZE or head[:2] != MAGIC:
        raise EncodeError("send_frame() takes an encoded AVP frame (starting with b'AV')")
    check_payload_size(size, payload_limit, "AVP frame")
    metadata = int.from_bytes(head[8:12], "little")
    if metadata > DEFAULT_LIMITS.max_metadata_bytes:
        raise LimitExceeded(
            f"the AVP frame's metadata is {metadata} bytes, over the {DEFAULT_LIMITS.max_metadata_bytes} "
            "a receiver parses (Limits.max_metadata_bytes): put less in extra=",
            limit=DEFAULT_LIMITS.max_metadata_bytes,
            actual=metadata,
        )
    if head[3] & FLAG_COMPRESSED:
        # The receiver holds the decompressed payload to max_payload: check the same quantity
        # here (read from the zstd header; a compressed frame is small, so joining it is cheap).
        one = parts[0] if len(parts) == 1 else b"".join(parts)
        check_payload_size(payload_size(one), payload_limit, "decompressed AVP payload")
    return size


def _frame_size_and_head(parts: Sequence[Buffer]) -> tuple[int, bytes | bytearray]:
    """The frame's size in bytes and a buffer starting with its header (at least its first
    HEADER_SIZE bytes, or all of a shorter frame).

    Fast path: a first part that is bytes holding the whole header: one bytes frame, or
    encode_parts' output (a bytes head with header and metadata, then the payload as views).
    :func:`_frame_size_and_head_general` gives the same answer for every input
    (tests/session/test_payload.py)."""
    first = parts[0] if parts else b""
    if type(first) is not bytes or len(first) < HEADER_SIZE:
        return _frame_size_and_head_general(parts)
    size = len(first)
    for part in parts[1:]:  # bounded by the parts
        size += part.nbytes if type(part) is memoryview else len(part)  # len: bytes, bytearray
    return size, first


def _frame_size_and_head_general(parts: Sequence[Buffer]) -> tuple[int, bytes | bytearray]:
    size = 0
    head = bytearray()
    for part in parts:  # bounded by the parts
        view = memoryview(part)
        size += view.nbytes
        if len(head) < HEADER_SIZE:  # the header may be split across parts
            head += view.cast("B")[: HEADER_SIZE - len(head)]
    return size, head


def queued_cost(message: Message) -> int:
    """What a received message costs while it waits for the application (max_queue_bytes): what it
    holds in memory once decoded, as the decoder measured it (``Message.decoded_bytes``); for a
    message built without that figure, the larger of its decoded and wire sizes."""
    return message.decoded_bytes or max(message.original_bytes, message.wire_bytes)
