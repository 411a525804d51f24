"""Session messages against the existing implementation's vectors, and the liberal reading rules."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from msgspec.structs import asdict

from m2mwire.errors import LimitExceeded, ProtocolError
from m2mwire.schemas.identity import ModelIdentity
from m2mwire.schemas.messages import (
    Capabilities,
    ClosePayload,
    CompressionCaps,
    DataPayload,
    LatentCaps,
    MessageType,
    Rejection,
    SecurityCaps,
    decode_data,
    decode_message,
    encode_data,
    encode_message,
    json_schema,
)
from tests.conftest import REFERENCE_VECTORS

VECTORS: dict[str, Any] = json.loads(REFERENCE_VECTORS.read_text())

RAW_KEYS = [
    "msg_hello_raw",
    "msg_accept_raw",
    "msg_reject_raw",
    "msg_reject2_raw",
    "msg_data_raw",
    "msg_data_sec_raw",
    "msg_ping_raw",
    "msg_pong_raw",
    "msg_close_raw",
]


@pytest.mark.parametrize("key", RAW_KEYS)
def test_reference_messages_parse(key: str) -> None:
    raw = VECTORS[key]
    msg = decode_message(raw)
    ref = json.loads(raw)
    assert msg.type is MessageType(ref["type"])
    assert msg.session_id == ref.get("session_id")
    assert msg.timestamp == ref["timestamp"]


def test_reference_hello_fields() -> None:
    msg = decode_message(VECTORS["msg_hello_raw"])
    caps = msg.payload
    assert isinstance(caps, Capabilities)
    assert caps.version == "3.0"
    assert caps.agent_type == "m2m-rust"
    assert caps.compression.algorithms == ["m2m", "tokennative", "brotli", "none"]
    assert caps.compression.encodings == ["Cl100kBase", "O200kBase"]
    assert caps.security.block_threshold == 0.8
    assert caps.avp is msgspec.UNSET


def test_reference_reject_and_data_payloads() -> None:
    rej = decode_message(VECTORS["msg_reject2_raw"]).payload
    assert rej == Rejection(code="VERSION_MISMATCH", message="Version 1.0 not compatible with 3.0")
    data = decode_message(VECTORS["msg_data_raw"]).payload
    assert isinstance(data, DataPayload)
    assert (data.algorithm, data.content) == ("tokennative", "#TK|C|sk0L/Q4A")
    # extra reference field security_status is ignored, not an error
    sec = decode_message(VECTORS["msg_data_sec_raw"]).payload
    assert isinstance(sec, DataPayload) and sec.algorithm == "m2m"


def _caps(**extra: Any) -> Capabilities:
    return Capabilities(
        version="3.0",
        agent_id="00000000-0000-4000-8000-000000000001",
        agent_type="m2m-rust",
        compression=CompressionCaps(
            algorithms=["m2m", "tokennative", "brotli", "none"],
            max_payload=0,
            streaming=True,
            ml_routing=False,
            encodings=["Cl100kBase", "O200kBase"],
            preferred_encoding="Cl100kBase",
        ),
        security=SecurityCaps(),
        **extra,
    )


def test_our_hello_is_byte_identical_to_reference_shape() -> None:
    # Same values as the reference vector: our serialisation must produce its exact bytes.
    ours = encode_message(MessageType.HELLO, _caps(), timestamp=1705520400000)
    assert ours == VECTORS["msg_hello_raw"].encode()


def test_our_control_messages_match_reference_bytes() -> None:
    assert encode_message(MessageType.PING, session_id="sid", timestamp=1) == VECTORS["msg_ping_raw"].encode()
    assert encode_message(MessageType.PONG, session_id="sid", timestamp=2) == VECTORS["msg_pong_raw"].encode()
    assert (
        encode_message(
            MessageType.REJECT,
            Rejection(code="NO_COMMON_ALGORITHM", message="No common compression algorithm"),
            timestamp=1705520400100,
        )
        == VECTORS["msg_reject_raw"].encode()
    )
    assert (
        encode_message(
            MessageType.DATA,
            DataPayload(algorithm="tokennative", content="#TK|C|sk0L/Q4A"),
            session_id="00000000-0000-4000-8000-00000000abcd",
            timestamp=1705520401000,
        )
        == VECTORS["msg_data_raw"].encode()
    )


@settings(max_examples=200, deadline=None)
@given(
    content=st.text(st.characters(blacklist_categories=("Cs",))),
    session_id=st.text(st.characters(blacklist_categories=("Cs",))),
    algorithm=st.sampled_from(["none", "tokennative", "brotli"]),
    content_type=st.sampled_from(["text", "json"]),
)
def test_data_fast_paths_match_the_general_ones(
    content: str, session_id: str, algorithm: str, content_type: Any
) -> None:
    payload = DataPayload(algorithm=algorithm, content=content, original_size=3, content_type=content_type)
    wire = encode_data(payload, session_id, timestamp=7)
    assert wire == encode_message(MessageType.DATA, payload, session_id=session_id, timestamp=7)
    fast, general = decode_data(wire), decode_message(wire)
    assert fast is not None
    # The fast path's payload is DataPayload's strict subclass: compare the fields.
    assert (fast.session_id, asdict(fast.payload), fast.timestamp) == (
        general.session_id,
        asdict(general.payload),  # type: ignore[arg-type]
        7,
    )


def test_encode_data_reproduces_the_reference_vector() -> None:
    payload = DataPayload(algorithm="tokennative", content="#TK|C|sk0L/Q4A")
    sid = "00000000-0000-4000-8000-00000000abcd"
    assert encode_data(payload, sid, timestamp=1705520401000) == VECTORS["msg_data_raw"].encode()
    fast = decode_data(VECTORS["msg_data_raw"].encode())
    assert fast is not None and asdict(fast.payload) == asdict(payload) and fast.session_id == sid


@pytest.mark.parametrize(
    "raw",
    [
        '{"type":"PING","session_id":"s","payload":{},"timestamp":1}',
        '{"session_id":"s","type":"DATA","payload":{"algorithm":"none","content":"x"},"timestamp":1}',
        '{"type": "DATA","session_id":"s","payload":{"algorithm":"none","content":"x"},"timestamp":1}',
        '{"type":"DATA","session_id":"s","payload":{"algorithm":"none"},"timestamp":1}',
        '{"type":"DATA","session_id":"s","timestamp":1}',
        '{"type":"DATA","session_id":"s","payload":{"algorithm":"none","content":"x"},"timestamp":"soon"}',
        '{"type":"DATA","type":"PING","session_id":"s","payload":{"algorithm":"none","content":"x"}}',
        '{"type":"DATA",',
    ],
)
def test_decode_data_leaves_everything_else_to_decode_message(raw: str) -> None:
    # None is "not mine": the general parser then accepts it or reports the error with its code.
    assert decode_data(raw.encode()) is None


def test_decode_data_leaves_oversized_messages_to_the_limit_check() -> None:
    from m2mwire.codecs.limits import Limits

    raw = b'{"type":"DATA","session_id":"s","payload":{"algorithm":"none","content":"xxxx"},"timestamp":1}'
    assert decode_data(raw, limits=Limits(max_message_bytes=len(raw))) is not None
    assert decode_data(raw, limits=Limits(max_message_bytes=len(raw) - 1)) is None
    with pytest.raises(LimitExceeded):
        decode_message(raw, limits=Limits(max_message_bytes=len(raw) - 1))


def test_hello_has_every_field_the_reference_requires() -> None:
    ident = ModelIdentity(
        model_family="llama", model_id="m", model_hash="ab" * 32, hidden_dim=8, num_layers=2
    )
    text = encode_message(MessageType.HELLO, _caps(avp=LatentCaps(identity=ident)))
    obj = json.loads(text)
    assert "session_id" not in obj  # omitted, not null
    payload = obj["payload"]
    for key in ("version", "agent_id", "agent_type", "compression", "security"):
        assert key in payload
    for key in ("algorithms", "max_payload", "streaming", "ml_routing"):
        assert key in payload["compression"]
    for key in ("threat_detection", "blocking_mode", "block_threshold"):
        assert key in payload["security"]
    assert payload["avp"]["identity"]["model_hash"] == "ab" * 32
    # and it parses back
    back = decode_message(text).payload
    assert isinstance(back, Capabilities) and isinstance(back.avp, LatentCaps)
    assert back.avp.identity == ident


def test_docs_flat_hello_is_understood() -> None:
    doc = {
        "type": "HELLO",
        "session_id": None,
        "payload": {
            "version": "1.0",
            "algorithms": ["TOKEN", "TOKEN_NATIVE", "BROTLI"],
            "encodings": ["CL100K_BASE", "O200K_BASE"],
            "preferred_encoding": "O200K_BASE",
            "security_scanning": True,
            "max_payload_size": 1048576,
            "supports_streaming": True,
            "session_timeout_ms": 300000,
        },
        "timestamp": 1705520400000,
    }
    msg = decode_message(json.dumps(doc))
    caps = msg.payload
    assert isinstance(caps, Capabilities)
    assert msg.session_id is None
    assert caps.version == "1.0"
    assert caps.compression.algorithms == ["TOKEN", "TOKEN_NATIVE", "BROTLI"]
    assert caps.compression.max_payload == 1048576
    assert caps.compression.preferred_encoding == "O200K_BASE"
    assert caps.security.threat_detection is True


def test_docs_close_with_reason_is_read() -> None:
    msg = decode_message(
        '{"type":"CLOSE","session_id":"s","payload":{"reason":"done","message":"bye"},"timestamp":1}'
    )
    assert msg.payload == ClosePayload(reason="done", message="bye")


def test_missing_payload_on_ping_is_fine_and_timestamp_optional() -> None:
    msg = decode_message('{"type":"PING","session_id":"s"}')
    assert msg.type is MessageType.PING and msg.timestamp == 0


def test_unknown_type_is_reported_not_an_error() -> None:
    msg = decode_message('{"type":"ping","payload":{},"timestamp":1}')
    assert msg.type is None and msg.type_name == "ping"


@pytest.mark.parametrize(
    "raw",
    [
        "not json",
        "[1,2]",
        '{"payload":{},"timestamp":1}',  # no type
        '{"type":"HELLO","payload":{},"timestamp":1}',  # empty caps: the reference would call this Empty
        '{"type":"HELLO","payload":{"version":"3.0"},"timestamp":1}',
        '{"type":"REJECT","payload":{"message":"x"},"timestamp":1}',
        '{"type":"DATA","session_id":"s","payload":{"algorithm":"none"},"timestamp":1}',
        '{"type":"DATA","session_id":"s","timestamp":1}',
        '{"type":"HELLO","payload":"str","timestamp":1}',
        '{"type":"DATA","session_id":"s","payload":{"algorithm":"none","content":"x"},"timestamp":"soon"}',
    ],
)
def test_shapeless_messages_are_protocol_errors(raw: str) -> None:
    with pytest.raises(ProtocolError) as info:
        decode_message(raw)
    assert info.value.code == "MALFORMED_MESSAGE"


def test_oversized_message_rejected_before_parsing() -> None:
    from m2mwire.codecs.limits import Limits

    with pytest.raises(LimitExceeded):
        decode_message(
            '{"type":"PING","payload":{},"timestamp":1}' + " " * 100, limits=Limits(max_message_bytes=50)
        )


def test_json_schema_exported_file_is_current() -> None:
    exported = Path(__file__).resolve().parents[2] / "m2mwire" / "schemas" / "session.schema.json"
    regenerate = "python -m m2mwire schema -o m2mwire/schemas/session.schema.json"
    assert json.loads(exported.read_text()) == json_schema(), f"stale: {regenerate}"
    defs = json_schema()["$defs"]
    assert {"Envelope", "Capabilities", "DataPayload", "Rejection", "ClosePayload"} <= set(defs)


def _general_data(data: bytes) -> Any:
    """The general path a received text message takes when decode_data declines: one UTF-8 check
    of the whole message, then decode_message. Returns its DATA payload, or None."""
    try:
        data.decode("utf-8")
        decoded = decode_message(data)
    except (UnicodeDecodeError, ProtocolError, LimitExceeded):
        return None
    return decoded if decoded.type is MessageType.DATA else None


_ENVELOPES = st.builds(
    lambda content, sid, extra: (encode_data(DataPayload(algorithm="none", content=content), sid, 7), extra),
    st.text(),
    st.text(st.characters(blacklist_categories=("Cs",)), max_size=8),
    st.none() | st.binary(max_size=8),
)


@settings(max_examples=400, deadline=None)
@given(
    envelope=_ENVELOPES,
    where=st.sampled_from(["none", "payload", "envelope", "splice"]),
    cut=st.integers(min_value=0, max_value=200),
    splice=st.binary(min_size=1, max_size=4),
)
def test_decode_data_returns_only_utf8_it_validated_and_agrees_with_the_general_path(
    envelope: tuple[bytes, bytes | None], where: str, cut: int, splice: bytes
) -> None:
    """decode_data is the received DATA fast path and its decode is the message's one UTF-8 check:
    whatever it returns must be valid UTF-8 throughout (including in fields it does not read, where
    msgspec would skip bytes unchecked) and equal to what the general path decodes; a plain DATA
    message of ours always takes it. Bytes are spliced into the content, into unknown fields of the
    payload and of the envelope, and anywhere at all."""
    data, extra = envelope
    if where == "payload" and extra is not None:
        data = data.replace(b'"payload":{', b'"payload":{"x":"' + extra.replace(b'"', b"") + b'",', 1)
    elif where == "envelope" and extra is not None:
        data = data.replace(b'"payload":', b'"x":"' + extra.replace(b'"', b"") + b'","payload":', 1)
    elif where == "splice":
        at = min(cut, len(data))
        data = data[:at] + splice + data[at:]
    fast = decode_data(data)
    general = _general_data(data)
    if fast is not None:
        data.decode("utf-8")  # raises if the fast path let invalid UTF-8 through
        assert general is not None
        assert (fast.session_id, asdict(fast.payload)) == (general.session_id, asdict(general.payload))
    if where == "none" or (extra is None and where != "splice"):
        assert fast is not None  # our own DATA, untouched, is the fast path's case
