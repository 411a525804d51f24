"""The AVP fast paths against the general paths they shortcut: same bytes, same results, same errors.

Encoder: ``_fast_parts`` (a contiguous little-endian array and a HIDDEN_STATE metadata object, no
overrides, no compression) against ``_general_parts``, which takes every input. Decoder: the
known-prefix path (``_decode_known``: a stream's repeated header + metadata, parsed once) against a
full decode (``_decode_full``, the general path alone), over valid, truncated,
corrupted and extended frames. benchmarks/bench_avp.py --paths measures what each fast path saves.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from m2mwire import avp
from m2mwire.codecs import avp as codec
from m2mwire.codecs.limits import DEFAULT_LIMITS

DTYPES = ["<f4", "<f2", "i1", ">f4", ">f2", "<u2", "<f8"]
TEXT = st.text(st.characters(codec="utf-8"), max_size=12)


def outcome(fn: Any, *args: Any, **kwargs: Any) -> tuple[str, Any]:
    try:
        return "ok", fn(*args, **kwargs)
    except Exception as exc:  # compared by type and message: both paths must raise the same
        return "error", (type(exc).__name__, str(exc))


@st.composite
def arrays(draw: st.DrawFn) -> np.ndarray[Any, Any]:
    shape = tuple(draw(st.lists(st.integers(0, 5), min_size=0, max_size=3)))
    arr = np.arange(int(np.prod(shape)), dtype=draw(st.sampled_from(DTYPES))).reshape(shape)
    if draw(st.booleans()) and arr.ndim and arr.shape[-1] > 1:
        arr = arr[..., ::2]  # not C-contiguous: the fast path must step aside
    return arr


@st.composite
def metadata(draw: st.DrawFn, shape: tuple[int, ...]) -> avp.AVPMetadata:
    tensor_shape = draw(
        st.sampled_from([(), shape, (max(1, int(np.prod(shape))),), (3, 7)])
    )  # none, the array's, flattened, wrong
    return avp.AVPMetadata(
        session_id=draw(TEXT),
        model_id=draw(TEXT),
        hidden_dim=draw(st.integers(0, 5000)),
        num_layers=draw(st.integers(0, 80)),
        payload_type=draw(st.sampled_from(list(avp.PayloadType))),
        dtype=draw(st.sampled_from(list(avp.DataType))),
        tensor_shape=tensor_shape,
        mode=draw(st.sampled_from([avp.CommunicationMode.LATENT, avp.CommunicationMode.JSON])),
        avp_map_id=draw(st.sampled_from(["", "vocab:0123456789abcdef"])),
        extra=draw(st.dictionaries(TEXT, TEXT, max_size=3)),
    )


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_fast_encoder_writes_what_the_general_one_writes(data: st.DataObject) -> None:
    arr = data.draw(arrays())
    md = data.draw(metadata(arr.shape))
    fast = outcome(codec._fast_parts, arr, md)
    general = outcome(codec._general_parts, arr, md, False, {})
    if fast == ("ok", None):
        return  # the fast path does not apply: encode_parts takes the general one
    if fast[0] == "ok":
        assert general[0] == "ok", (fast, general)
        assert b"".join(fast[1]) == b"".join(general[1])
        assert [bytes(p) for p in fast[1][1:]] == [bytes(p) for p in general[1][1:]]  # same pieces
    else:
        assert fast == general


def test_the_fast_encoder_applies_to_the_usual_frame() -> None:
    """The property above is not vacuous: the common case does take the fast path."""
    md = avp.AVPMetadata(model_id="m", hidden_dim=8, tensor_shape=(2, 4), extra={"k": "v"})
    for dtype in ("<f4", "<f2", "i1"):
        parts = codec._fast_parts(np.ones((2, 4), dtype=dtype), md)
        assert parts is not None
        assert b"".join(parts) == b"".join(codec._general_parts(np.ones((2, 4), dtype=dtype), md, False, {}))


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_one_metadata_object_through_a_stream_of_arrays(data: st.DataObject) -> None:
    """The fast encoder keeps the last frame head on the metadata object (the session sends every
    tensor with one): each frame of a stream whose shape, dtype and content vary must still be
    what the general encoder writes."""
    md = avp.AVPMetadata(
        session_id=data.draw(TEXT),
        model_id=data.draw(TEXT),
        avp_map_id=data.draw(st.sampled_from(["", "vocab:0123456789abcdef"])),
        extra=data.draw(st.dictionaries(TEXT, TEXT, max_size=2)),
    )
    for _ in range(data.draw(st.integers(1, 6))):
        n = data.draw(st.integers(0, 6))
        dtype = data.draw(st.sampled_from(["<f4", "<f2", "i1"]))
        # A drawn offset varies the content, hence the checksum (and its varint length).
        arr = (np.arange(n) + data.draw(st.integers(0, 60000))).astype(dtype)
        fast = codec._fast_parts(arr, md)
        assert fast is not None
        assert b"".join(fast) == b"".join(codec._general_parts(arr, md, False, {}))


def test_the_cached_frame_head_is_used_and_replaced() -> None:
    """The property above is not vacuous: same-shaped frames reuse the head, another size
    replaces it."""
    md = avp.AVPMetadata(model_id="m")
    heads = []
    for arr in (np.full(4, 3, np.float32), np.full(4, 7, np.float32), np.full(6, 7, np.float32)):
        checksum = avp.crc32(arr.tobytes())
        assert checksum >= 1 << 28  # the cached case: a 5-byte checksum varint
        fast = codec._fast_parts(arr, md)
        assert fast is not None
        assert b"".join(fast) == b"".join(codec._general_parts(arr, md, False, {}))
        heads.append(md._head)
    assert heads[0] is heads[1]
    assert heads[2] is not heads[1]


def summary(msg: avp.AVPMessage) -> tuple[Any, ...]:
    return (
        msg.header,
        bytes(msg.raw),
        bytes(msg.payload),
        msg.payload_type,
        msg.dtype,
        msg.tensor_shape,
        msg.metadata,
        msg.metadata.payload_checksum,
        msg.metadata.compression,
    )


def full_decode(frame: bytes) -> tuple[Any, ...]:
    return summary(codec._decode_full(memoryview(frame), DEFAULT_LIMITS.max_metadata_bytes, None, False))


def stream_decode(frame: bytes) -> tuple[Any, ...]:
    return summary(avp.decode(frame))


@st.composite
def frames(draw: st.DrawFn) -> tuple[bytes, bytes]:
    """(a valid frame, the frame to decode: itself, or truncated, corrupted or extended)."""
    n = draw(st.integers(0, 64))
    dtype = draw(st.sampled_from(["<f4", "<f2", "i1"]))
    arr = np.arange(n, dtype=dtype)
    md = draw(metadata((n,)))
    md = avp.AVPMetadata(
        **{
            f: getattr(md, f) for f in ("session_id", "model_id", "hidden_dim", "mode", "avp_map_id", "extra")
        },
        tensor_shape=draw(st.sampled_from([(), (n,)])),
    )
    valid = avp.encode(arr, md, compress=draw(st.sampled_from([False, False, 1])))
    change = draw(st.sampled_from(["none", "truncate", "flip", "extend", "payload"]))
    frame = bytearray(valid)
    if change == "truncate":
        del frame[draw(st.integers(0, len(frame) - 1)) :]
    elif change == "flip":
        frame[draw(st.integers(0, len(frame) - 1))] ^= draw(st.integers(1, 255))
    elif change == "extend":
        frame += draw(st.binary(min_size=1, max_size=8))
    elif change == "payload" and n:  # same prefix and length, another payload: the known path's case
        frame[-1] ^= draw(st.integers(1, 255))
    return valid, bytes(frame)


@settings(max_examples=500, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(pair=frames())
def test_known_prefix_decoder_agrees_with_the_full_decoder(pair: tuple[bytes, bytes]) -> None:
    valid, frame = pair
    for _ in range(2):  # seen once, then a template: the next decode may take the known path
        avp.decode(valid)
    assert outcome(stream_decode, frame) == outcome(full_decode, frame)


def test_the_known_prefix_path_is_taken() -> None:
    """The property above is not vacuous: after two decodes a stream frame skips protobuf."""
    md = avp.AVPMetadata(model_id="m", tensor_shape=(4,))
    first = avp.encode(np.zeros(4, np.float32), md)
    for _ in range(2):
        avp.decode(first)
    other = avp.encode(np.ones(4, np.float32), md)
    assert type(codec._decode_known(memoryview(other), DEFAULT_LIMITS.max_metadata_bytes)) is avp.AVPMessage
    assert stream_decode(other) == full_decode(other)
