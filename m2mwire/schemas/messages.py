"""Session messages: the JSON envelope and its payloads, as msgspec Structs.

The envelope is the one the existing M2M implementation emits (``type``, ``session_id`` omitted on
HELLO/REJECT, ``payload``, ``timestamp`` in ms), so our messages parse as theirs and theirs as ours.
Reading is liberal: the docs' dialect (flat HELLO, ``TOKEN_NATIVE``, ``CL100K_BASE``, version "1.x")
is understood too, unknown fields are ignored, unknown message types are reported as such, and a
payload that matches no shape is a :class:`~m2mwire.errors.ProtocolError` (never silently "empty").
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from enum import StrEnum
from typing import Any, Literal

import msgspec

from m2mwire.codecs.limits import DEFAULT_LIMITS, Limits
from m2mwire.codecs.utf8 import utf8_len
from m2mwire.errors import LimitExceeded, ProtocolError
from m2mwire.schemas.codes import RejectCode as RejectCode  # its home until the codes had a module
from m2mwire.schemas.identity import ModelIdentity

__all__ = [
    "PROTOCOL_VERSION",
    "TOO_DEEP",
    "AckPayload",
    "Capabilities",
    "ClosePayload",
    "CompressionCaps",
    "DataPayload",
    "Envelope",
    "LatentCaps",
    "MessageType",
    "Rejection",
    "ResumeCaps",
    "SecurityCaps",
    "ZstdCaps",
    "decode_data",
    "decode_data_bytes",
    "decode_message",
    "encode_data",
    "encode_data_bytes",
    "encode_message",
    "now_ms",
]

PROTOCOL_VERSION = "3.0"


class MessageType(StrEnum):
    HELLO = "HELLO"
    ACCEPT = "ACCEPT"
    REJECT = "REJECT"
    DATA = "DATA"
    PING = "PING"
    PONG = "PONG"
    CLOSE = "CLOSE"
    ACK = "ACK"  # ours, only on sessions that negotiated ``resume`` (docs/PROTOCOL.md "Resume")


class ZstdCaps(msgspec.Struct, kw_only=True):
    """Session-context zstd parameters, the extra ``compression.zstd`` object (docs/PROTOCOL.md).

    HELLO: the client's offer; ACCEPT: what was agreed (the window, the one dictionary used, or
    none) plus whether the server accepts the binary form. Peers that do not know zstd ignore it.
    """

    window: int = 0  # bytes, a power of two; 0 or absent = the default (1 MiB)
    binary: bool = True  # this peer accepts the binary form (0x5A); False asks for "#ZS|" text
    dictionaries: list[str] = msgspec.field(default_factory=list)  # SHA-256 (hex) of each dictionary
    # Shared history (0x48 messages, docs/CODECS.md section 8): HELLO offers it, ACCEPT says it is
    # used. Absent (an older peer) = False: that session keeps one context per direction (0x5A).
    history: bool = False


class CompressionCaps(msgspec.Struct, kw_only=True):
    algorithms: list[str]
    max_payload: int = 0  # 0 = no limit announced (the reference's default)
    streaming: bool = False
    ml_routing: bool = False
    encodings: list[str] = msgspec.field(default_factory=list)
    preferred_encoding: str = ""  # absent: no preference (we always send one)
    zstd: ZstdCaps | msgspec.UnsetType = msgspec.UNSET  # ours; only when zstd is offered


class SecurityCaps(msgspec.Struct, kw_only=True):
    threat_detection: bool = False
    model_version: str | None = None
    blocking_mode: bool = False
    block_threshold: float = 0.8


class LatentCaps(msgspec.Struct, kw_only=True, omit_defaults=True):
    """AVP latent-mode negotiation, carried as the extra capabilities field ``avp``.

    HELLO carries the sender's model ``identity``; ACCEPT carries the server's identity plus the
    resolved ``mode`` ("LATENT" or "JSON"), the ``reason`` and, where one applies, ``avp_map_id``.
    """

    identity: ModelIdentity | None = None
    mode: Literal["LATENT", "JSON"] | None = None
    reason: str | None = None
    avp_map_id: str = ""


class ResumeCaps(msgspec.Struct, kw_only=True, omit_defaults=True):
    """The ``resume`` capability (docs/PROTOCOL.md "Resume").

    HELLO offers it with ``buffer``; an ACCEPT that grants it adds the secret ``token``. A HELLO that
    resumes a session adds ``session_id``, ``token`` and ``received``; its ACCEPT answers with the
    server's ``received``. ``received`` counts the DATA messages (text and binary) received so far.
    """

    buffer: int = 0  # bytes of unacknowledged DATA the sender of this message retains at most
    token: str | None = None
    session_id: str | None = None
    received: int | None = None


class AckPayload(msgspec.Struct, kw_only=True):
    """ACK payload: the cumulative count of DATA messages received in the ACK sender's direction."""

    received: int


class Capabilities(msgspec.Struct, kw_only=True):
    version: str
    agent_id: str
    agent_type: str
    compression: CompressionCaps
    security: SecurityCaps = msgspec.field(default_factory=SecurityCaps)
    extensions: dict[str, str] = msgspec.field(default_factory=dict)
    avp: LatentCaps | msgspec.UnsetType = msgspec.UNSET  # ours; absent unless latent mode is offered
    # Ours, HELLO only: the client's credential for the server's admission check (``on_hello``).
    token: str | msgspec.UnsetType = msgspec.UNSET
    # Ours, HELLO only: the client's W3C trace context, so the server's session span joins its trace.
    traceparent: str | msgspec.UnsetType = msgspec.UNSET
    tracestate: str | msgspec.UnsetType = msgspec.UNSET
    resume: ResumeCaps | msgspec.UnsetType = msgspec.UNSET  # ours: absent unless resume is offered
    # Ours: true when the sender takes large text DATA in binary form (docs/PROTOCOL.md §4, kind
    # 'T': the envelope line, a line feed, the content's UTF-8 bytes, no JSON escaping).
    binary_text: bool | msgspec.UnsetType = msgspec.UNSET


class Rejection(msgspec.Struct, kw_only=True):
    code: str
    message: str = ""


class DataPayload(msgspec.Struct, kw_only=True):
    """DATA payload. ``content_type`` is ours ("json" or "text"); other implementations ignore it."""

    algorithm: str
    content: str
    original_size: int | msgspec.UnsetType = msgspec.UNSET
    content_type: Literal["text", "json"] | msgspec.UnsetType = msgspec.UNSET
    # Ours, for requests and streams (docs/PROTOCOL.md "Requests and streams"); absent on plain DATA,
    # ignored by peers that do not know them. ``request_id``: the sender expects an answer;
    # ``reply_to``: this answers that request; ``more``: true on a stream part, false/absent on the
    # last (or only) answer.
    request_id: str | msgspec.UnsetType = msgspec.UNSET
    reply_to: str | msgspec.UnsetType = msgspec.UNSET
    more: bool | msgspec.UnsetType = msgspec.UNSET
    # Ours, on requests: the W3C trace context of the asking span (OpenTelemetry).
    traceparent: str | msgspec.UnsetType = msgspec.UNSET
    tracestate: str | msgspec.UnsetType = msgspec.UNSET


class ClosePayload(msgspec.Struct, kw_only=True):
    """CLOSE payload. The reference sends ``{}``; the docs add reason/message, which we send."""

    reason: str | msgspec.UnsetType = msgspec.UNSET
    message: str | msgspec.UnsetType = msgspec.UNSET


class Envelope(msgspec.Struct, kw_only=True):
    """One session message. Field order is the reference's: type, session_id, payload, timestamp.

    ``session_id`` is omitted entirely (not null) when unset, as the reference does on HELLO/REJECT.
    """

    type: str
    session_id: str | msgspec.UnsetType = msgspec.UNSET
    payload: Any = msgspec.UNSET
    timestamp: int


class _RawEnvelope(msgspec.Struct, kw_only=True):
    type: str
    session_id: str | None = None
    payload: msgspec.Raw = msgspec.Raw(b"")  # empty = absent; decoded once the type is known
    timestamp: int | None = None


# The docs' flat HELLO: {version, algorithms, encodings?, preferred_encoding?, max_payload_size, ...}
class _FlatHello(msgspec.Struct, kw_only=True):
    version: str
    algorithms: list[str]
    encodings: list[str] = msgspec.field(default_factory=list)
    preferred_encoding: str | None = None
    max_payload_size: int = 0
    supports_streaming: bool = False
    security_scanning: bool = False
    agent_id: str = ""
    agent_type: str = ""


class DataEnvelope(msgspec.Struct, kw_only=True):
    """A DATA message decoded in one pass (see :func:`decode_data`)."""

    type: str
    session_id: str | None = None
    payload: DataPayload
    timestamp: int | None = None


# decode_data's shapes: the same fields, with no unknown ones allowed. msgspec validates the UTF-8
# of every string it builds but skips an unknown field's bytes unchecked, so only when every field
# is known has a successful decode checked every byte of the message (outside strings only ASCII
# JSON syntax can parse). That makes the decode the one UTF-8 check of a received DATA message.
class _StrictDataPayload(DataPayload, forbid_unknown_fields=True):
    pass


class _StrictDataEnvelope(DataEnvelope, forbid_unknown_fields=True):
    payload: _StrictDataPayload


def now_ms() -> int:
    return time.time_ns() // 1_000_000


_TYPES: dict[str, MessageType] = {t.value: t for t in MessageType}
_TYPE_NAMES: dict[MessageType, str] = {t: t.value for t in MessageType}  # Enum.value is slow
_encoder = msgspec.json.Encoder()
_raw_decoder = msgspec.json.Decoder(_RawEnvelope)
_caps_decoder = msgspec.json.Decoder(Capabilities)
_flat_decoder = msgspec.json.Decoder(_FlatHello)
_reject_decoder = msgspec.json.Decoder(Rejection)
_data_decoder = msgspec.json.Decoder(DataPayload)
_close_decoder = msgspec.json.Decoder(ClosePayload)
_ack_decoder = msgspec.json.Decoder(AckPayload)
_strict_data_decoder = msgspec.json.Decoder(_StrictDataEnvelope)
# How every DATA message starts, ours and the reference's (both emit ``type`` first).
_DATA_START = b'{"type":"DATA",'
# msgspec parses (and skips unknown fields) recursively and raises RecursionError near the
# interpreter's recursion limit (~1,000 levels): such a message is malformed, not a crash.
TOO_DEEP = "session message is nested too deeply to parse (about 1,000 levels or more)"


def encode_message(
    type_: MessageType, payload: Any = None, *, session_id: str | None = None, timestamp: int | None = None
) -> bytes:
    """Serialise one message as compact JSON text, in UTF-8 (what a text message carries).
    ``session_id=None`` omits the key."""
    if payload is None and type_ in (MessageType.PING, MessageType.PONG, MessageType.CLOSE):
        payload = {}
    env = Envelope(
        type=_TYPE_NAMES[type_],
        session_id=msgspec.UNSET if session_id is None else session_id,
        payload=msgspec.UNSET if payload is None else payload,
        timestamp=now_ms() if timestamp is None else timestamp,
    )
    return _encoder.encode(env)


def decode_data(data: bytes, *, limits: Limits = DEFAULT_LIMITS) -> DataEnvelope | None:
    """Parse a DATA message (a text message's UTF-8 bytes, not yet validated) in one pass, or
    return None to leave it to :func:`decode_message`.

    DATA is the per-message case; :func:`decode_message` takes two passes (envelope, then payload
    by type). A returned envelope also means ``data`` is valid UTF-8 throughout (see
    ``_StrictDataEnvelope``). None means anything else (another type, a different key order, a
    field we do not know, invalid UTF-8, an error), which the caller then checks and parses with
    :func:`decode_message`, and reports properly.
    """
    if not data.startswith(_DATA_START) or len(data) > limits.max_message_bytes:
        return None
    try:
        env = _strict_data_decoder.decode(data)
    except (msgspec.DecodeError, UnicodeError, RecursionError):
        return None  # decode_message reports it
    return env if env.type == "DATA" else None


def decode_data_bytes(data: bytes) -> DataEnvelope:
    """Parse a DATA message given as UTF-8 bytes (a zstd-context binary message decompresses to one).

    Raises ProtocolError(code="MALFORMED_MESSAGE") for anything but a DATA message.
    """
    try:
        env = _strict_data_decoder.decode(data)
    except msgspec.DecodeError as exc:
        raise ProtocolError(f"not a DATA message: {exc}", code="MALFORMED_MESSAGE") from None
    if env.type != "DATA":
        raise ProtocolError(f"a {env.type[:20]!r} message where only DATA may be", code="MALFORMED_MESSAGE")
    return env


class _UntimedDataEnvelope(msgspec.Struct, kw_only=True):
    type: str
    session_id: str
    payload: DataPayload


def encode_data_bytes(payload: DataPayload, session_id: str) -> bytes:
    """A DATA message as UTF-8 bytes *without* ``timestamp``: what a zstd-context binary message
    compresses (receivers accept messages without it; in context it would cost ~2 bytes each)."""
    return _encoder.encode(_UntimedDataEnvelope(type="DATA", session_id=session_id, payload=payload))


def encode_data(payload: DataPayload, session_id: str, timestamp: int | None = None) -> bytes:
    """``encode_message(MessageType.DATA, payload, session_id=...)`` without its generality."""
    ts = time.time_ns() // 1_000_000 if timestamp is None else timestamp
    return _encoder.encode(Envelope(type="DATA", session_id=session_id, payload=payload, timestamp=ts))


class Decoded(msgspec.Struct, frozen=True):
    """A parsed message: ``type`` is None for a type we do not know (the caller ignores it)."""

    type: MessageType | None
    type_name: str
    session_id: str | None
    payload: Capabilities | Rejection | DataPayload | ClosePayload | AckPayload | None
    timestamp: int


def decode_message(text: str | bytes, *, limits: Limits = DEFAULT_LIMITS) -> Decoded:
    """Parse one envelope. Raises ProtocolError(code="MALFORMED_MESSAGE") when it matches no shape."""
    size = utf8_len(text) if isinstance(text, str) else len(text)
    if size > limits.max_message_bytes:
        raise LimitExceeded(
            f"session message is {size} bytes, over the limit of {limits.max_message_bytes} bytes",
            limit=limits.max_message_bytes,
            actual=size,
        )
    try:
        raw = _raw_decoder.decode(text)
        mtype = _TYPES.get(raw.type)
        payload: Capabilities | Rejection | DataPayload | ClosePayload | AckPayload | None = None
        if mtype is not None:
            payload = _decode_payload(mtype, raw.payload)
    except (msgspec.DecodeError, UnicodeError) as exc:
        raise ProtocolError(f"not a session message: {exc}", code="MALFORMED_MESSAGE") from exc
    except RecursionError:
        raise ProtocolError(TOO_DEEP, code="MALFORMED_MESSAGE") from None
    return Decoded(
        type=mtype,
        type_name=raw.type,
        session_id=raw.session_id,
        payload=payload,
        timestamp=raw.timestamp if raw.timestamp is not None else 0,
    )


def _decode_payload(
    mtype: MessageType, raw: msgspec.Raw
) -> Capabilities | Rejection | DataPayload | ClosePayload | AckPayload | None:
    if mtype is MessageType.DATA and raw:  # the hot path first
        try:
            return _data_decoder.decode(raw)
        except msgspec.DecodeError as exc:
            message = f"DATA payload matches no known shape: {exc}"
            raise ProtocolError(message, code="MALFORMED_MESSAGE") from exc
    if mtype in (MessageType.PING, MessageType.PONG):
        return None  # payload is {} or absent; content is irrelevant
    if not raw or bytes(raw) == b"null":
        if mtype is MessageType.CLOSE:
            return ClosePayload()
        raise ProtocolError(f"{mtype.value} message has no payload", code="MALFORMED_MESSAGE")
    try:
        if mtype in (MessageType.HELLO, MessageType.ACCEPT):
            return _decode_caps(raw)
        if mtype is MessageType.REJECT:
            return _reject_decoder.decode(raw)
        if mtype is MessageType.DATA:
            return _data_decoder.decode(raw)
        if mtype is MessageType.ACK:
            return _ack_decoder.decode(raw)
        return _close_decoder.decode(raw)
    except msgspec.DecodeError as exc:
        raise ProtocolError(
            f"{mtype.value} payload matches no known shape: {exc}", code="MALFORMED_MESSAGE"
        ) from exc


def _decode_caps(raw: msgspec.Raw) -> Capabilities:
    try:
        return _caps_decoder.decode(raw)
    except msgspec.DecodeError as nested_error:
        try:
            flat = _flat_decoder.decode(raw)
        except msgspec.DecodeError:
            raise nested_error from None
    # The docs' flat shape: map it onto the nested capabilities object.
    return Capabilities(
        version=flat.version,
        agent_id=flat.agent_id,
        agent_type=flat.agent_type,
        compression=CompressionCaps(
            algorithms=flat.algorithms,
            max_payload=flat.max_payload_size,
            streaming=flat.supports_streaming,
            encodings=flat.encodings,
            preferred_encoding=flat.preferred_encoding or "",
        ),
        security=SecurityCaps(threat_detection=flat.security_scanning),
    )


def json_schema() -> dict[str, Any]:
    """JSON Schema (2020-12) of every session message, for other implementers."""
    schema_types: Iterable[type[Any]] = (
        Envelope,
        Capabilities,
        Rejection,
        DataPayload,
        ClosePayload,
        AckPayload,
    )
    (_, components) = msgspec.json.schema_components(list(schema_types), ref_template="#/$defs/{name}")
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "title": "m2mwire session messages",
        "description": (
            "Envelope {type, session_id?, payload?, timestamp}. payload is Capabilities for HELLO/ACCEPT, "
            "Rejection for REJECT, DataPayload for DATA, ClosePayload for CLOSE, AckPayload for ACK "
            "and {} for PING/PONG."
        ),
        "$ref": "#/$defs/Envelope",
        "$defs": components,
    }
