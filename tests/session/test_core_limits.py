"""What a peer can make a session decode is bounded by the negotiated max_payload (issues 11.4, 11.9,
12.4), and the decoded cost of each message is reported for inbox accounting."""

from __future__ import annotations

import struct
import sys
import tracemalloc
from typing import Any

import numpy as np
import pytest
import zstandard

from m2mwire import avp
from m2mwire.codecs.avp import payload_size
from m2mwire.codecs.compressed import encode_brotli
from m2mwire.errors import LimitExceeded
from m2mwire.session.core import SessionProtocol
from m2mwire.session.events import Closed
from m2mwire.session.outputs import CloseTransport
from m2mwire.session.payload import Message
from tests.session.test_core import IDENT, cfg, data_message, drain, pair

MiB = 1 << 20


@pytest.fixture(scope="module")
def gib_zstd() -> bytes:
    """One zstd frame announcing and holding 1 GiB of zeros (~32 KB), built 1 MiB at a time."""
    cobj = zstandard.ZstdCompressor(level=3).compressobj(size=1 << 30)
    zero = bytes(MiB)
    return b"".join([cobj.compress(zero) for _ in range(1024)] + [cobj.flush()])


def _frame_around(payload: bytes, **fields: Any) -> bytes:
    """A compressed AVP frame whose payload is swapped for ``payload`` (its CRC is then wrong)."""
    frame = avp.encode(np.zeros(4, dtype=np.float32), compress=True, **fields)
    header = avp.parse_header(frame)
    meta = frame[avp.HEADER_SIZE : avp.HEADER_SIZE + header.metadata_length]
    return (
        struct.pack("<2sBBII", b"AV", 1, header.flags, len(meta) + len(payload), len(meta)) + meta + payload
    )


def _peak_while(fn: Any) -> int:
    tracemalloc.start()
    try:
        fn()
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def test_a_gib_zstd_bomb_costs_the_session_almost_nothing(gib_zstd: bytes) -> None:
    assert len(gib_zstd) < 64 * 1024 and zstandard.frame_content_size(gib_zstd) == 1 << 30
    bomb = _frame_around(gib_zstd)
    c, s = pair(cfg(identity=IDENT), cfg(identity=IDENT))  # max_payload 16 MiB
    drain(s)
    peak = _peak_while(lambda: s.receive_binary(bomb, 1.0))
    assert peak < 64 * MiB, f"a 1 GiB bomb cost {peak / MiB:.0f} MiB"
    (closed,) = [e for e in drain(s) if isinstance(e, Closed)]
    assert closed.code == "MESSAGE_TOO_BIG" and isinstance(closed.error, LimitExceeded)
    assert "max_payload" in closed.reason
    assert CloseTransport(1009, "MESSAGE_TOO_BIG") in s.data_to_send()


def test_a_hidden_state_bomb_is_refused_by_its_shape_before_decompressing(gib_zstd: bytes) -> None:
    # Under the codec's own 1 GiB default cap the size alone would pass: the shape says 16 bytes.
    bomb = _frame_around(gib_zstd, tensor_shape=(4,))
    errors: list[Exception] = []

    def decode() -> None:
        try:
            avp.decode(bomb)
        except avp.DecodeError as exc:
            errors.append(exc)

    assert _peak_while(decode) < 64 * MiB
    (error,) = errors
    assert "tensor_shape needs 16" in str(error)


def test_send_frame_checks_the_decompressed_size_the_receiver_checks() -> None:
    c, _ = pair(cfg(identity=IDENT, max_payload=1000), cfg(identity=IDENT))
    frame = avp.encode(np.zeros(4096, dtype=np.float32), compress=True)  # 16 KiB in ~40 bytes
    assert len(frame) < 1000 and payload_size(frame) == 16 * 1024
    with pytest.raises(LimitExceeded, match="decompressed AVP payload"):
        c.send_frame([frame], 1.0)
    assert c.data_to_send() == []
    small = avp.encode(np.zeros(64, dtype=np.float32), compress=True)
    c.send_frame([small], 1.0)


def test_brotli_content_past_max_payload_closes_with_message_too_big() -> None:
    c, s = pair(cfg(), cfg(max_payload=4096))
    drain(s)
    wire = encode_brotli("a" * 15_000)
    assert s.receive_text(data_message(s.session_id, True, algorithm="brotli", content=wire), 1.0) is None
    (closed,) = [e for e in drain(s) if isinstance(e, Closed)]
    assert closed.code == "MESSAGE_TOO_BIG" and "4096" in closed.reason


def _received(s: SessionProtocol, **payload: Any) -> Message:
    message = s.receive_text(data_message(s.session_id, True, **payload), 1.0)
    assert message is not None
    return message


def test_messages_carry_their_decoded_cost() -> None:
    c, s = pair(cfg(identity=IDENT), cfg(identity=IDENT))
    drain(s)
    text = _received(s, algorithm="none", content="hello")
    assert text.decoded_bytes == sys.getsizeof("hello")
    brotli = _received(s, algorithm="brotli", content=encode_brotli("b" * 100_000))
    assert brotli.wire_bytes < 100 and brotli.decoded_bytes >= 100_000
    body = "[" + ",".join(["{}"] * 5000) + "]"
    parsed = _received(s, algorithm="none", content=body, content_type="json")
    tracemalloc.start()
    value = parsed.json()
    held = tracemalloc.get_traced_memory()[0]
    tracemalloc.stop()
    assert value == [{}] * 5000
    assert parsed.decoded_bytes >= sys.getsizeof(body) + held  # an upper bound of what it holds
    frame = avp.encode(np.zeros(1024, dtype=np.float32), compress=True)
    message = s.receive_binary(frame, 1.0)
    assert message is not None and message.decoded_bytes == len(frame) + 4096
