"""AVP frame codec: byte-exact vectors, round trips, zero copy, and every strictness decision."""

from __future__ import annotations

import copy
import dataclasses
import itertools
import pickle
import struct
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import zstandard
from hypothesis import given, settings
from hypothesis import strategies as st

from m2mwire import avp
from m2mwire.codecs import avp as codec
from m2mwire.codecs import avpframe, checksum
from m2mwire.codecs.limits import DEFAULT_LIMITS, Limits
from m2mwire.errors import ChecksumMismatch, DecodeError, EncodeError, LimitExceeded
from m2mwire.schemas import avp_pb2

# Byte-exact vectors (avp-reference.md section 2).
SPEC_V1 = bytes.fromhex(
    "415601002a0000001a00000012076167656e742d61220a746573742d6d6f64656c28044a0104"
    "cdcccc3dcdcc4c3e9a99993ecdcccc3e"
)
SPEC_V2 = bytes.fromhex("415601000d0000000500000028024a01020000803f00000040")
SDK_V1 = bytes.fromhex(
    "41560100300000002000000012076167656e742d61220a746573742d6d6f64656c28044a010478c4d3a29c0a"
    "cdcccc3dcdcc4c3e9a99993ecdcccc3e"
)
SDK_V2 = bytes.fromhex("41560100130000000b00000028024a010278f6cafef1020000803f00000040")
SDK_V2_ZSTD = bytes.fromhex(
    "41560101220000001100000028024a01025a047a73746478f6cafef10228b52ffd20084100000000803f00000040"
)
SDK_KV_MAP_ZSTD = bytes.fromhex(
    "415601073900000028000000380140015a047a7374646a16766f6361623a61626364656631323334353637383930"
    "78e9be8ba90628b52ffd20084100000000000000000000"
)
SDK_ALL_FIELDS = bytes.fromhex(
    "415601062f0000002d0000000a0273311201611a016222016d28083002380140024a0301020350016a0178"
    "72060a016b120176789285b1b60b0102"
)
SDK_EMPTY = bytes.fromhex("4156010002000000020000007800")

V1_VALUES = np.array([0.1, 0.2, 0.3, 0.4], dtype=np.float32)


def frame(flags: int, meta: bytes, body: bytes, *, payload_length: int | None = None) -> bytes:
    """A hand-made frame (header fields can lie)."""
    plen = len(meta) + len(body) if payload_length is None else payload_length
    return struct.pack("<2sBBII", b"AV", 1, flags, plen, len(meta)) + meta + body


def meta_bytes(**fields: Any) -> bytes:
    data: bytes = avp_pb2.Metadata(**fields).SerializeToString(deterministic=True)
    return data


# --------------------------------------------------------------------------------------------------
# Byte-exact encoding


def test_encode_v1_matches_sdk_bytes() -> None:
    out = avp.encode(V1_VALUES, source_agent_id="agent-a", model_id="test-model", hidden_dim=4)
    assert out == SDK_V1


def test_encode_v2_with_metadata_object() -> None:
    md = avp.AVPMetadata(hidden_dim=2, tensor_shape=(2,))
    assert avp.encode(np.array([1.0, 2.0], dtype=np.float32).tobytes(), md) == SDK_V2
    assert avp.encode_hidden_state(np.array([1.0, 2.0], dtype=np.float32)) == SDK_V2


@pytest.mark.parametrize("level", [True, 1, 3, 19])
def test_encode_v2_zstd_matches_sdk_bytes(level: bool | int) -> None:
    assert avp.encode_hidden_state(np.array([1.0, 2.0], dtype=np.float32), compress=level) == SDK_V2_ZSTD


def test_encode_kv_map_zstd_matches_sdk_bytes() -> None:
    out = avp.encode(
        bytes(8), payload_type="KV_CACHE", dtype="float16", avp_map_id="vocab:abcdef1234567890", compress=1
    )
    assert out == SDK_KV_MAP_ZSTD
    assert out[3] == 0x07


# Every metadata field set (the SDK's all-fields vector).
ALL_FIELDS = avp.AVPMetadata(
    session_id="s1",
    source_agent_id="a",
    target_agent_id="b",
    model_id="m",
    hidden_dim=8,
    num_layers=2,
    payload_type=avp.PayloadType.KV_CACHE,
    dtype=avp.DataType.BFLOAT16,
    tensor_shape=(1, 2, 3),
    mode=avp.CommunicationMode.JSON,
    avp_map_id="x",
    extra={"k": "v"},
)


def test_encode_all_fields_matches_sdk_bytes() -> None:
    md = ALL_FIELDS
    assert avp.encode(b"\x01\x02", md) == SDK_ALL_FIELDS


def test_encode_empty_payload_writes_checksum_zero() -> None:
    assert avp.encode(b"") == SDK_EMPTY
    assert avp.encode_parts(b"") == [SDK_EMPTY]


def test_metadata_object_fields_ignored_by_encoder() -> None:
    """compression and payload_checksum describe a received frame; the encoder writes its own."""
    md = avp.AVPMetadata(hidden_dim=2, tensor_shape=(2,), compression="zstd", payload_checksum=7)
    assert avp.encode(np.array([1.0, 2.0], dtype=np.float32), md) == SDK_V2


def test_keyword_fields_override_metadata_object() -> None:
    md = avp.AVPMetadata(model_id="old", hidden_dim=4)
    msg = avp.decode(avp.encode(V1_VALUES, md, model_id="test-model", source_agent_id="agent-a"))
    assert msg.metadata.model_id == "test-model"
    assert msg.metadata.hidden_dim == 4
    assert msg.raw.tobytes() == SDK_V1


# --------------------------------------------------------------------------------------------------
# Decoding the vectors


def test_decode_spec_vectors_without_checksum() -> None:
    msg = avp.decode(SPEC_V1)
    assert msg.metadata.source_agent_id == "agent-a"
    assert msg.metadata.model_id == "test-model"
    assert msg.metadata.payload_checksum is None
    np.testing.assert_array_equal(msg.tensor(), V1_VALUES)
    np.testing.assert_array_equal(avp.decode(SPEC_V2).tensor(), [1.0, 2.0])


@pytest.mark.parametrize("data", [SDK_V1, SDK_V2, SDK_V2_ZSTD, SDK_KV_MAP_ZSTD, SDK_ALL_FIELDS, SDK_EMPTY])
def test_decode_sdk_vectors_and_reencode(data: bytes) -> None:
    msg = avp.decode(data)
    md = msg.metadata
    assert md.payload_checksum == zlib.crc32(msg.payload)
    level = 1 if msg.header.compressed else False
    assert avp.encode(msg.payload, md, compress=level) == data


def test_decode_all_fields_metadata() -> None:
    md = avp.decode(SDK_ALL_FIELDS).metadata
    assert md == dataclasses.replace(ALL_FIELDS, payload_checksum=zlib.crc32(b"\x01\x02"))
    header = avp.decode(SDK_ALL_FIELDS).header
    assert (header.compressed, header.has_map, header.is_kv_cache) == (False, True, True)
    assert header.frame_length == len(SDK_ALL_FIELDS)


def test_decode_compressed_sets_compression_field() -> None:
    msg = avp.decode(SDK_V2_ZSTD)
    assert msg.metadata.compression == "zstd"
    assert msg.header.compressed
    np.testing.assert_array_equal(msg.tensor(), [1.0, 2.0])


# --------------------------------------------------------------------------------------------------
# Round trips and dtypes


@pytest.mark.parametrize("dtype", ["float32", "float16", "int8"])
@pytest.mark.parametrize("compress", [False, True])
@pytest.mark.parametrize("shape", [(7,), (2, 3, 4), (0,), (1, 4096)])
def test_round_trip_numpy(dtype: str, compress: bool, shape: tuple[int, ...]) -> None:
    rng = np.random.default_rng(1)
    arr = (rng.standard_normal(shape) * 50).astype(dtype)
    msg = avp.decode(avp.encode_hidden_state(arr, model_id="m", compress=compress))
    assert msg.metadata.dtype is avp.DataType.parse(dtype)
    assert msg.metadata.tensor_shape == shape
    assert msg.metadata.hidden_dim == shape[-1]
    out = msg.tensor()
    assert out.dtype == np.dtype(dtype)
    np.testing.assert_array_equal(out, arr)
    np.testing.assert_array_equal(msg.to_float32(), arr.astype(np.float32))


def test_bfloat16_as_uint16_words() -> None:
    values = np.array([1.0, -2.5, 3.140625, 0.0, np.inf], dtype=np.float32)
    words = avp.float32_to_bfloat16(values)
    with pytest.raises(EncodeError, match="bfloat16"):
        avp.encode(words)
    msg = avp.decode(avp.encode(words, dtype="bfloat16"))
    assert msg.metadata.dtype is avp.DataType.BFLOAT16
    assert msg.tensor().dtype == np.dtype("<u2")
    np.testing.assert_array_equal(msg.tensor(), words)
    np.testing.assert_array_equal(msg.to_float32(), values)


def test_dtype_named_bfloat16_is_taken_without_asking() -> None:
    """ml_dtypes (not a dependency) names its dtype "bfloat16"; only kind, itemsize and name are read."""

    class Dtype:
        kind, itemsize, name = "V", 2, "bfloat16"

    class Array:
        dtype = Dtype()

    assert avpframe.array_dtype(Array(), None) is avp.DataType.BFLOAT16  # type: ignore[arg-type]


def test_float32_to_bfloat16_rounding() -> None:
    bits = np.array(
        [0x3F800000, 0x3F808000, 0x3F818000, 0x3F808001, 0x7F7FFFFF, 0x7FC00001, 0xFF800000, 0x00000001],
        dtype=np.uint32,
    )
    words = avp.float32_to_bfloat16(bits.view(np.float32))
    # exact, tie to even (down), tie to even (up), above tie, overflow to inf, NaN stays NaN, -inf, tiny
    assert words.tolist() == [0x3F80, 0x3F80, 0x3F82, 0x3F81, 0x7F80, 0x7FC0, 0xFF80, 0x0000]
    assert np.isnan(avp.bfloat16_to_float32(words)[5])


def test_big_endian_and_non_contiguous_arrays_are_converted() -> None:
    arr = np.arange(12, dtype=">f4").reshape(3, 4)
    msg = avp.decode(avp.encode(arr))
    np.testing.assert_array_equal(msg.tensor(), arr)
    assert msg.raw.tobytes() == avp.encode(arr.astype("<f4"))
    t = np.arange(12, dtype=np.float32).reshape(3, 4).T
    np.testing.assert_array_equal(avp.decode(avp.encode(t)).tensor(), t)


def test_explicit_tensor_shape_must_match_size() -> None:
    arr = np.zeros(12, dtype=np.float32)
    assert avp.decode(avp.encode(arr, tensor_shape=[3, 4])).tensor().shape == (3, 4)
    with pytest.raises(EncodeError, match="tensor_shape"):
        avp.encode(arr, tensor_shape=[5])
    with pytest.raises(EncodeError, match="tensor_shape"):
        avp.encode(b"\x00" * 6, tensor_shape=[2])


@pytest.mark.parametrize(
    ("payload", "kwargs", "exc"),
    [
        (np.zeros(3, dtype=np.float64), {}, EncodeError),
        (np.zeros(3, dtype=np.int32), {}, EncodeError),
        (np.zeros(3, dtype=np.float16), {"dtype": "float32"}, EncodeError),
        (np.zeros(3, dtype=np.float32), {"payload_type": "KV_CACHE", "tensor_shape": (1,)}, None),
        (b"", {"extra": {"k": 1}}, EncodeError),
        (b"", {"hidden_dim": -1}, EncodeError),
        (b"", {"num_layers": 2**32}, EncodeError),
        (b"", {"dtype": "float64"}, EncodeError),
        (b"", {"mode": "HYBRID"}, EncodeError),
        ("text", {}, TypeError),
    ],
)
def test_encode_rejects(payload: Any, kwargs: dict[str, Any], exc: type[Exception] | None) -> None:
    if exc is None:  # a KV payload given as an array is opaque bytes: the shape is not checked
        avp.encode(payload, **kwargs)
        return
    with pytest.raises(exc):
        avp.encode(payload, **kwargs)


def test_encode_rejects_bad_zstd_level() -> None:
    with pytest.raises(EncodeError, match="zstd"):
        avp.encode(b"abc", compress=99)


def test_metadata_normalises_spellings() -> None:
    md = avp.AVPMetadata(payload_type=1, dtype="bf16", mode="JSON_MODE", tensor_shape=[2, 3])  # type: ignore[arg-type]
    assert md.payload_type is avp.PayloadType.KV_CACHE
    assert md.dtype is avp.DataType.BFLOAT16
    assert md.mode is avp.CommunicationMode.JSON
    assert md.tensor_shape == (2, 3)
    with pytest.raises(TypeError):
        md.extra["x"] = "y"  # type: ignore[index]


def test_metadata_pickles_and_copies() -> None:
    md = avp.decode(SDK_ALL_FIELDS).metadata
    assert pickle.loads(pickle.dumps(md)) == md
    assert copy.deepcopy(md) == md
    assert copy.copy(md) == md
    assert dataclasses.replace(md, model_id="n").extra == {"k": "v"}


@settings(max_examples=150, deadline=None)
@given(
    session_id=st.text(max_size=20),
    model_id=st.text(max_size=40),
    hidden_dim=st.integers(0, 2**32 - 1),
    num_layers=st.integers(0, 2**32 - 1),
    payload_type=st.sampled_from(avp.PayloadType),
    dtype=st.sampled_from(avp.DataType),
    shape=st.lists(st.integers(0, 2**32 - 1), max_size=4),
    mode=st.sampled_from([avp.CommunicationMode.LATENT, avp.CommunicationMode.JSON]),
    map_id=st.text(max_size=20),
    extra=st.dictionaries(st.text(max_size=8), st.text(max_size=8), max_size=4),
    payload=st.binary(max_size=64),
    compressed=st.booleans(),
)
def test_metadata_bytes_equal_protobuf_serialization(
    session_id: str,
    model_id: str,
    hidden_dim: int,
    num_layers: int,
    payload_type: avp.PayloadType,
    dtype: avp.DataType,
    shape: list[int],
    mode: avp.CommunicationMode,
    map_id: str,
    extra: dict[str, str],
    payload: bytes,
    compressed: bool,
) -> None:
    """The cached fields-1-14 prefix plus a hand-written field 15 equals protobuf's own bytes."""
    md = avp.AVPMetadata(
        session_id=session_id,
        model_id=model_id,
        hidden_dim=hidden_dim,
        num_layers=num_layers,
        payload_type=payload_type,
        dtype=dtype,
        tensor_shape=tuple(shape),
        mode=mode,
        avp_map_id=map_id,
        extra=extra,
    )
    crc = zlib.crc32(payload)
    fields: dict[str, Any] = dict(
        session_id=session_id,
        model_id=model_id,
        hidden_dim=hidden_dim,
        num_layers=num_layers,
        payload_type=int(payload_type),
        dtype=int(dtype),
        tensor_shape=shape,
        mode=int(mode),
        avp_map_id=map_id,
        extra=extra,
        payload_checksum=crc,
    )
    if compressed:
        fields["compression"] = "zstd"
    expected = meta_bytes(**fields)
    for _ in range(2):  # second time from the cache
        assert bytes(avpframe.metadata_bytes(md, dtype, tuple(shape), compressed, crc)) == expected
    # and a KV frame with opaque payload round-trips through decode
    if payload_type is avp.PayloadType.KV_CACHE:
        msg = avp.decode(avp.encode(payload, md, compress=compressed))
        assert msg.metadata.extra == extra
        assert msg.metadata.tensor_shape == tuple(shape)
        assert msg.payload.tobytes() == payload


# --------------------------------------------------------------------------------------------------
# Zero copy


def test_encode_parts_does_not_copy_the_tensor() -> None:
    arr = np.arange(1024, dtype=np.float32)
    parts = avp.encode_parts(arr, model_id="m")
    assert len(parts) == 2
    assert isinstance(parts[1], memoryview)
    assert np.shares_memory(np.frombuffer(parts[1], dtype=np.uint8), arr)
    assert b"".join(parts) == avp.encode(arr, model_id="m")


def test_decode_payload_and_tensor_are_views_of_the_input() -> None:
    arr = np.arange(1024, dtype=np.float16)
    data = bytearray(avp.encode(arr))
    msg = avp.decode(data)
    assert msg.payload.obj is data
    t = msg.tensor()
    assert np.shares_memory(t, np.frombuffer(data, dtype=np.uint8))
    assert t.flags.writeable  # a view of the caller's bytearray
    assert not avp.decode(bytes(data)).tensor().flags.writeable


@pytest.mark.parametrize("kind", ["bytes", "bytearray", "memoryview", "ndarray", "memoryview_f"])
def test_decode_accepts_buffer_types(kind: str) -> None:
    data = avp.encode(V1_VALUES)
    source: Any = {
        "bytes": data,
        "bytearray": bytearray(data),
        "memoryview": memoryview(data),
        "ndarray": np.frombuffer(data, dtype=np.uint8),
        "memoryview_f": memoryview(bytearray(data) + bytearray(2)).cast("B")[: len(data)],
    }[kind]
    np.testing.assert_array_equal(avp.decode(source).tensor(), V1_VALUES)


def test_decode_rejects_str_and_strided_buffers() -> None:
    with pytest.raises(TypeError):
        avp.decode("AV")  # type: ignore[arg-type]
    with pytest.raises(DecodeError, match="contiguous"):
        avp.decode(memoryview(SDK_V1 + SDK_V1)[::2])
    with pytest.raises(EncodeError, match="contiguous"):
        avp.encode(memoryview(b"abcdef")[::2])


# --------------------------------------------------------------------------------------------------
# Malformed input the SDK rejects too (avp-reference 1.7)


def _sdk_rejected() -> Iterator[tuple[str, bytes]]:
    good = SDK_V1
    yield "empty", b""
    yield "short", good[:11]
    yield "bad magic", b"XY" + good[2:]
    yield "reversed magic", b"VA" + good[2:]
    yield "version 0", good[:2] + b"\x00" + good[3:]
    yield "version 2", good[:2] + b"\x02" + good[3:]
    yield "truncated", good[:-1]
    flipped = bytearray(good)
    flipped[-1] ^= 0x01
    yield "payload bit flip", bytes(flipped)
    yield "dtype 4", frame(0, meta_bytes(dtype=4), b"")
    yield "payload_type 2", frame(0, meta_bytes(payload_type=2), b"")
    yield "mode 2", frame(0, meta_bytes(mode=2), b"")
    yield "metadata longer than payload", struct.pack("<2sBBII", b"AV", 1, 0, 2, 30) + b"\x00" * 2
    yield "garbage protobuf", frame(0, b"\xff\xff\xff\xff", b"")
    yield "compressed flag on raw bytes", frame(1, meta_bytes(compression="zstd"), b"not zstd at all")
    stream = zstandard.ZstdCompressor().compressobj()
    unsized = stream.compress(b"abcd" * 10) + stream.flush()
    yield "zstd frame without content size", frame(1, meta_bytes(compression="zstd"), unsized)


SDK_REJECTED = list(_sdk_rejected())


@pytest.mark.parametrize(("name", "data"), SDK_REJECTED, ids=[n for n, _ in SDK_REJECTED])
def test_rejects_what_the_sdk_rejects(name: str, data: bytes) -> None:
    with pytest.raises(DecodeError):
        avp.decode(data)


def test_checksum_mismatch_is_its_own_class() -> None:
    data = bytearray(SDK_V1)
    data[-1] ^= 0x80
    with pytest.raises(ChecksumMismatch, match="checksum"):
        avp.decode(data)


def test_explicit_zero_checksum_is_verified() -> None:
    assert avp.decode(frame(0, meta_bytes(payload_checksum=0), b"")).metadata.payload_checksum == 0
    with pytest.raises(ChecksumMismatch):
        avp.decode(frame(0, meta_bytes(payload_checksum=0), b"x"))


def test_absent_checksum_is_not_verified() -> None:
    assert avp.decode(frame(0, b"", b"anything")).payload.tobytes() == b"anything"


def test_checksum_over_compressed_bytes_is_rejected() -> None:
    packed = zstandard.ZstdCompressor().compress(b"hello" * 20)
    meta = meta_bytes(compression="zstd", payload_checksum=zlib.crc32(packed))
    with pytest.raises(ChecksumMismatch):
        avp.decode(frame(1, meta, packed))


def test_header_only_frame_is_all_defaults() -> None:
    msg = avp.decode(frame(0, b"", b""))
    assert msg.metadata == avp.AVPMetadata()
    assert msg.tensor().size == 0


def test_unknown_protobuf_fields_are_skipped() -> None:
    old_confidence = b"\x65" + struct.pack("<f", 0.5)  # field 12 float (SDK 0.1/0.2)
    field16 = b"\x80\x01\x05"
    msg = avp.decode(frame(0, meta_bytes(model_id="m") + old_confidence + field16, b""))
    assert msg.metadata.model_id == "m"


# --------------------------------------------------------------------------------------------------
# Where we are stricter than the SDK (each accepted by the SDK; see tests/interop)


def test_trailing_bytes_rejected_unless_allowed() -> None:
    data = SDK_V1 + b"junk!"
    with pytest.raises(DecodeError, match="after its end"):
        avp.decode(data)
    msg = avp.decode(data, allow_trailing=True)
    assert msg.raw.tobytes() == SDK_V1
    assert avp.frame_length(data) == len(SDK_V1)
    assert avp.frame_length(data[:12]) == len(SDK_V1)


def test_two_frames_concatenated_split_with_frame_length() -> None:
    data = SDK_V1 + SDK_V2
    with pytest.raises(DecodeError):
        avp.decode(data)
    n = avp.frame_length(data)
    assert avp.decode(data[:n]).raw.tobytes() == SDK_V1
    assert avp.decode(memoryview(data)[n:]).raw.tobytes() == SDK_V2


@pytest.mark.parametrize("bit", range(3, 8))
def test_reserved_flag_bits_rejected(bit: int) -> None:
    data = bytearray(SDK_V1)
    data[3] |= 1 << bit
    with pytest.raises(DecodeError, match="reserved"):
        avp.decode(data)
    with pytest.raises(DecodeError, match="reserved"):
        avp.frame_length(data)


def test_kv_flag_must_match_payload_type() -> None:
    with pytest.raises(DecodeError, match="KV-cache flag"):
        avp.decode(frame(0x04, meta_bytes(payload_checksum=0), b""))
    with pytest.raises(DecodeError, match="KV-cache flag"):
        avp.decode(frame(0x00, meta_bytes(payload_type=1, payload_checksum=0), b""))


def test_has_map_flag_must_match_map_id() -> None:
    with pytest.raises(DecodeError, match="has-map"):
        avp.decode(frame(0x02, meta_bytes(payload_checksum=0), b""))
    with pytest.raises(DecodeError, match="has-map"):
        avp.decode(frame(0x00, meta_bytes(avp_map_id="vocab:x", payload_checksum=0), b""))


def test_compression_field_must_match_flag() -> None:
    with pytest.raises(DecodeError, match="compressed flag is clear"):
        avp.decode(frame(0, meta_bytes(compression="zstd", payload_checksum=0), b""))
    packed = zstandard.ZstdCompressor().compress(b"abc")
    with pytest.raises(DecodeError, match="unsupported AVP compression"):
        avp.decode(frame(1, meta_bytes(compression="lz4"), packed))
    # Absent (old encoders) or empty-when-uncompressed are fine.
    assert avp.decode(frame(1, b"", packed)).payload.tobytes() == b"abc"
    assert avp.decode(frame(0, meta_bytes(compression=""), b"abc")).payload.tobytes() == b"abc"


def test_metadata_length_over_payload_length_is_our_decode_error() -> None:
    data = struct.pack("<2sBBII", b"AV", 1, 0, 4, 5) + b"\x00" * 4
    with pytest.raises(DecodeError, match="metadata_length 5 is larger than payload_length 4"):
        avp.decode(data)


@pytest.mark.parametrize("tail", [b"x", None])
def test_data_after_the_zstd_frame_rejected(tail: bytes | None) -> None:
    cctx = zstandard.ZstdCompressor()
    packed = cctx.compress(b"abcd" * 10)
    body = packed + (tail if tail is not None else cctx.compress(b"more"))
    meta = meta_bytes(compression="zstd", payload_checksum=zlib.crc32(b"abcd" * 10))
    assert avp.decode(frame(1, meta, packed)).payload.tobytes() == b"abcd" * 10
    with pytest.raises(DecodeError, match="zstd"):
        avp.decode(frame(1, meta, body))


def test_data_after_an_empty_zstd_frame_rejected() -> None:
    empty = zstandard.ZstdCompressor().compress(b"")
    meta = meta_bytes(compression="zstd", payload_checksum=0)
    assert avp.decode(frame(1, meta, empty)).payload.tobytes() == b""
    with pytest.raises(DecodeError, match="after its"):
        avp.decode(frame(1, meta, empty + b"junk"))


def test_hidden_state_size_must_match_shape() -> None:
    meta = meta_bytes(tensor_shape=[3], payload_checksum=zlib.crc32(b"\x00" * 8))
    with pytest.raises(DecodeError, match="tensor_shape"):
        avp.decode(frame(0, meta, b"\x00" * 8))
    huge = meta_bytes(tensor_shape=[2**32 - 1] * avpframe.MAX_TENSOR_DIMS, payload_checksum=0)
    with pytest.raises(DecodeError, match="more than 0 bytes"):
        avp.decode(frame(0, huge, b""))
    # KV frames: tensor_shape is not a payload shape (the SDK's all-fields vector has [1,2,3] on 2 bytes).
    assert avp.decode(SDK_ALL_FIELDS).payload.tobytes() == b"\x01\x02"


@pytest.mark.parametrize("payload_type", [0, 1])
def test_a_shape_of_more_than_max_tensor_dims_is_refused_both_ways(payload_type: int) -> None:
    """65,000 dimensions of 1 (a 64 KiB shape) cost 2.5 ms per frame to check and copy, ~40x plain
    traffic, and were held as tuples beyond what max_queue_bytes counted (stop 33's attack run)."""
    most = avpframe.MAX_TENSOR_DIMS
    ok = meta_bytes(
        tensor_shape=[1] * most, payload_type=payload_type, payload_checksum=zlib.crc32(b"\x00" * 4)
    )
    flags = 4 if payload_type else 0
    assert avp.decode(frame(flags, ok, b"\x00" * 4)).metadata.tensor_shape == (1,) * most
    for dims in (most + 1, 65_000):
        meta = meta_bytes(
            tensor_shape=[1] * dims, payload_type=payload_type, payload_checksum=zlib.crc32(b"\x00" * 4)
        )
        with pytest.raises(DecodeError, match="MAX_TENSOR_DIMS"):
            avp.decode(frame(flags, meta, b"\x00" * 4))
    with pytest.raises(EncodeError, match="MAX_TENSOR_DIMS"):
        avp.encode(np.zeros(1, np.float32), tensor_shape=[1] * (most + 1))


def test_tensor_on_odd_sized_payload_without_shape() -> None:
    msg = avp.decode(frame(0, b"", b"abc"))
    with pytest.raises(DecodeError, match="whole number"):
        msg.tensor()


def test_wrong_accessor_for_payload_type() -> None:
    with pytest.raises(ValueError, match="kv_cache"):
        avp.decode(SDK_ALL_FIELDS).tensor()
    with pytest.raises(ValueError, match="tensor"):
        avp.decode(SDK_V1).kv_cache()


# --------------------------------------------------------------------------------------------------
# Limits


def test_decompressed_size_capped_before_allocation() -> None:
    # A zstd frame header announcing 1 TiB (single segment, 8-byte content size) and nothing else.
    bomb = b"\x28\xb5\x2f\xfd" + bytes([0xE0]) + struct.pack("<Q", 1 << 40)
    assert zstandard.frame_content_size(bomb) == 1 << 40
    with pytest.raises(LimitExceeded) as info:
        avp.decode(frame(1, meta_bytes(compression="zstd"), bomb))
    assert info.value.limit == avp.DEFAULT_MAX_OUTPUT_BYTES
    data = avp.encode(bytes(4096), compress=True)
    with pytest.raises(LimitExceeded):
        avp.decode(data, max_output_bytes=4095)
    assert len(avp.decode(data, max_output_bytes=4096).payload) == 4096


def test_metadata_size_capped_by_limits() -> None:
    data = avp.encode(b"", model_id="m" * 100)
    with pytest.raises(LimitExceeded):
        avp.decode(data, limits=Limits(max_message_bytes=50))
    assert avp.decode(data, limits=Limits(max_message_bytes=200)).metadata.model_id == "m" * 100


def test_encode_refuses_payload_length_over_u32(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(codec, "MAX_PAYLOAD_LENGTH", 10)  # the fast path's check
    monkeypatch.setattr(avpframe, "MAX_PAYLOAD_LENGTH", 10)  # the general path's
    with pytest.raises(EncodeError, match="u32"):
        avp.encode(b"0123456789")


# --------------------------------------------------------------------------------------------------
# CRC-32: avp.crc32 (libdeflate via `deflate`, zlib below 64 bytes) must be zlib.crc32 exactly

CRC_SIZES = [0, 1, 17, 63, 64, 65, 4095, 8192, 16384 + 5, (1 << 20) + 3]


@settings(max_examples=300, deadline=None)
@given(data=st.binary(max_size=2000), value=st.integers(0, 0xFFFF_FFFF))
def test_crc32_is_zlib_crc32(data: bytes, value: int) -> None:
    assert avp.crc32(data) == zlib.crc32(data)
    assert avp.crc32(data, value) == zlib.crc32(data, value)
    assert avp.crc32(memoryview(data), value) == zlib.crc32(data, value)


def test_crc32_check_value() -> None:
    assert avp.crc32(b"123456789") == 0xCBF43926
    assert avp.crc32(b"123456789" * 8) == zlib.crc32(b"123456789" * 8)  # past the zlib cut-over
    with pytest.raises(TypeError):
        avp.crc32("123456789")  # type: ignore[arg-type]


@pytest.mark.parametrize("size", CRC_SIZES)
@pytest.mark.parametrize("offset", [0, 1, 3, 7])
def test_crc32_of_every_buffer_kind(size: int, offset: int) -> None:
    data = np.random.default_rng(size + offset).bytes(size + offset)
    expected = zlib.crc32(data[offset:])
    buffers: list[Any] = [
        data[offset:],
        bytearray(data)[offset:],
        memoryview(data)[offset:],  # read-only slice of bytes
        memoryview(bytearray(data))[offset:],  # writable slice
        np.frombuffer(data, dtype=np.uint8)[offset:],
    ]
    for buf in buffers:
        assert avp.crc32(buf) == expected, type(buf)
    if size % 4 == 0:  # multi-byte items: len() counts items, the CRC covers every byte
        floats = np.frombuffer(data[offset:], dtype=np.float32)
        assert avp.crc32(floats) == avp.crc32(memoryview(floats)) == expected
        assert avp.crc32(floats.reshape(1, -1)) == expected  # len() == 1
    frame = avp.encode(data[offset:], model_id="m")
    for source in (frame, bytearray(frame), memoryview(b"xx" + frame)[2:]):
        assert avp.decode(source).metadata.payload_checksum == expected


def test_crc32_small_cut_over_counts_bytes(monkeypatch: pytest.MonkeyPatch) -> None:
    """zlib is used below 64 *bytes*: a 2-D array with few rows still goes to libdeflate."""
    used: list[str] = []
    monkeypatch.setattr(checksum, "_zlib_crc32", lambda d, v: used.append("zlib") or zlib.crc32(d, v))
    monkeypatch.setattr(checksum, "deflate_crc32", lambda d, v: used.append("deflate") or zlib.crc32(d, v))
    wide = np.ones((2, 4096), dtype=np.float32)
    assert avp.crc32(wide) == zlib.crc32(wide)
    assert avp.crc32(np.float32(1.5)) == zlib.crc32(np.float32(1.5))
    assert avp.crc32(np.array(2.5, dtype=np.float32)) == zlib.crc32(np.array(2.5, dtype=np.float32))
    assert avp.crc32(b"x" * 63) == zlib.crc32(b"x" * 63)
    assert avp.crc32(memoryview(b"x" * 64)) == zlib.crc32(b"x" * 64)
    assert used == ["deflate", "zlib", "zlib", "zlib", "deflate"]


def test_crc32_running_value_across_pieces() -> None:
    rng = np.random.default_rng(11)
    data = rng.bytes(3 << 20)
    cuts = sorted({0, len(data), *(int(c) for c in rng.integers(0, len(data), 40)), 5, 22, 86, 150})
    crc = 0
    for start, end in itertools.pairwise(cuts):  # pieces from 1 byte to ~1 MiB
        crc = avp.crc32(memoryview(data)[start:end], crc)
    assert crc == zlib.crc32(data)
    chunks = [rng.bytes(n) for n in (17, 3 << 20, 1, 5 << 20, 777, 0, 1 << 20)]
    assert checksum.crc32_chunks([memoryview(c) for c in chunks]) == zlib.crc32(b"".join(chunks))


@pytest.mark.parametrize(
    "buf",
    [
        np.arange(64, dtype=np.float32)[::2],
        np.asfortranarray(np.ones((8, 8), dtype=np.float32)),
        memoryview(bytes(256))[::2],
        memoryview(bytes(16))[::2],
    ],
    ids=["strided-array", "fortran-array", "strided-view", "small-strided-view"],
)
def test_crc32_rejects_non_contiguous_like_zlib(buf: Any) -> None:
    with pytest.raises((BufferError, ValueError)) as zlib_error:
        zlib.crc32(buf)
    with pytest.raises(zlib_error.type):
        avp.crc32(buf)


def test_big_payload_checksums() -> None:
    big = np.random.default_rng(9).bytes(9 << 20)
    msg = avp.decode(avp.encode(big))
    assert msg.metadata.payload_checksum == zlib.crc32(big)
    bad = bytearray(avp.encode(big))
    bad[-1] ^= 1
    with pytest.raises(ChecksumMismatch):
        avp.decode(bad)


def test_multi_buffer_compression_is_one_sized_frame() -> None:
    rng = np.random.default_rng(3)
    chunks = [memoryview(rng.integers(0, 4, n, dtype=np.uint8).tobytes()) for n in (17, 300_000, 5, 70_000)]
    total = sum(len(c) for c in chunks)
    packed = b"".join(avpframe.compress_chunks(chunks, total, 3))
    params = zstandard.get_frame_parameters(packed)
    assert params.content_size == total
    assert zstandard.ZstdDecompressor().decompress(packed, allow_extra_data=False) == b"".join(chunks)
    assert packed == zstandard.ZstdCompressor(level=3).compress(b"".join(chunks))


@pytest.mark.parametrize("dtype", ["float32", "float16", "int8"])
def test_fast_path_equals_general_path(dtype: str) -> None:
    """encode(array, metadata) takes a shortcut; keyword overrides force the general path."""
    arr = (np.random.default_rng(2).standard_normal((2, 64)) * 9).astype(dtype)
    for md in (
        avp.AVPMetadata(model_id="m", hidden_dim=64, extra={"a": "b"}),
        avp.AVPMetadata(model_id="m", hidden_dim=64, tensor_shape=(128,), avp_map_id="vocab:1"),
    ):
        fast = avp.encode_parts(arr, md)
        general = avp.encode_parts(arr, md, model_id="m")
        assert b"".join(fast) == b"".join(general) == avp.encode(arr, md)
        assert b"".join(avp.encode_hidden_state_parts(arr, md)) == b"".join(general)
        assert avp.decode(avp.encode(arr, md)).tensor().tobytes() == arr.tobytes()


def test_fast_path_declines_what_it_does_not_handle() -> None:
    words = avp.float32_to_bfloat16(np.ones(4, dtype=np.float32))
    md_bf16 = avp.AVPMetadata(dtype=avp.DataType.BFLOAT16)
    assert avp.decode(avp.encode(words, md_bf16)).metadata.dtype is avp.DataType.BFLOAT16
    strided = np.arange(16, dtype=np.float32)[::2]
    np.testing.assert_array_equal(avp.decode(avp.encode(strided, avp.AVPMetadata())).tensor(), strided)
    with pytest.raises(EncodeError, match="dtype=FLOAT16"):
        avp.encode(np.ones(4, dtype=np.float32), avp.AVPMetadata(dtype=avp.DataType.FLOAT16))
    with pytest.raises(EncodeError, match="tensor_shape"):
        avp.encode(np.ones(4, dtype=np.float32), avp.AVPMetadata(tensor_shape=(5,)))


# --------------------------------------------------------------------------------------------------
# A stream of frames: the parsed metadata prefix is reused (codec._decode_known), and must decode
# exactly as the full path (codec._decode_full) does.


def full_decode(data: bytes) -> avp.AVPMessage:
    """The general path alone, with the default limits (it never learns a template)."""
    return codec._decode_full(memoryview(data), DEFAULT_LIMITS.max_metadata_bytes, None, False)


def _outcome(data: bytes, *, full: bool = False) -> tuple[Any, ...]:
    try:
        msg = full_decode(data) if full else avp.decode(data)
    except (DecodeError, LimitExceeded) as exc:
        return (type(exc), str(exc))
    return (msg.raw.tobytes(), msg.payload.tobytes(), msg.header, msg.metadata, msg.tensor_shape, msg.dtype)


def _varint(value: int, width: int | None = None) -> bytes:
    """``value`` as a protobuf varint; ``width`` pads it (non-minimal, still valid) to that many bytes."""
    out = bytearray()
    while True:
        low, value = value & 0x7F, value >> 7
        if value == 0 and (width is None or len(out) + 1 >= width):
            out.append(low)
            return bytes(out)
        out.append(low | 0x80)


def test_stream_reuses_the_parsed_prefix_and_checks_every_crc() -> None:
    rng = np.random.default_rng(5)
    md = avp.AVPMetadata(session_id="s", model_id="m", hidden_dim=16, extra={"k": "v"})
    tensors = [rng.standard_normal(16).astype(np.float32) for _ in range(6)]
    frames = [avp.encode(t, md) for t in tensors]
    pbs = []
    for t, f in zip(tensors, frames, strict=True):
        msg = avp.decode(f)
        np.testing.assert_array_equal(msg.tensor(), t)
        assert msg.metadata == full_decode(f).metadata  # the full path
        assert msg.metadata.payload_checksum == zlib.crc32(t.tobytes())
        pbs.append(msg._pb)
    assert pbs[2] is pbs[3] is pbs[5]  # decoded from the template learnt on the second frame
    assert pbs[0] is not pbs[1]
    bad = bytearray(frames[4])
    bad[-1] ^= 1  # same header and prefix, corrupted payload
    with pytest.raises(ChecksumMismatch, match="checksum mismatch"):
        avp.decode(bad)


def test_one_off_frames_neither_grow_memory_nor_evict_a_stream_template() -> None:
    md = avp.AVPMetadata(session_id="steady")
    steady = [avp.encode(np.full(4, i, dtype=np.float32), md) for i in range(4)]
    for f in steady[:3]:
        avp.decode(f)
    template_pb = avp.decode(steady[2])._pb
    for i in range(3 * codec._SLOTS):  # every metadata different: first sightings only
        avp.decode(avp.encode(np.zeros(4, dtype=np.float32), session_id=f"one-off-{i}"))
    assert len(codec._SEEN) <= codec._SLOTS and len(codec._TEMPLATES) <= codec._SLOTS
    assert avp.decode(steady[3])._pb is template_pb


@pytest.mark.parametrize(
    ("meta", "checksum"),
    [
        (meta_bytes(model_id="abx\x05"), None),  # ends with 78 05 inside the string
        (meta_bytes(model_id="m") + b"\x82\x01\x03\x78\x85\x01", None),  # inside unknown field 16
        (meta_bytes(model_id="m", payload_checksum=7) + b"\x82\x01\x02\x78\x05", 7),
    ],
)
def test_checksum_look_alike_inside_a_field_is_not_a_template(meta: bytes, checksum: int | None) -> None:
    """Metadata that merely ends like field 15 does not end with a checksum: the prefix before
    the look-alike does not parse on its own, so no template is made and nothing is misread (a
    wrong template would check a CRC read from the look-alike bytes from the third frame on)."""
    for body in (b"\x00" * 8, b"\x01" * 8, b"\x02" * 8, b"\x03" * 8):
        data = frame(0, meta, body)
        assert _outcome(data) == _outcome(data, full=True)
        if checksum is None:
            assert avp.decode(data).metadata.payload_checksum is None
        else:  # the real checksum, earlier in the metadata, matches none of these bodies
            with pytest.raises(ChecksumMismatch, match=f"0x{checksum:08x}"):
                avp.decode(data)


@settings(max_examples=300, deadline=None)
@given(
    prefix=st.one_of(
        st.builds(
            meta_bytes,
            model_id=st.text(max_size=6),
            dtype=st.integers(0, 3),
            tensor_shape=st.lists(st.integers(0, 40), max_size=2),
            avp_map_id=st.sampled_from(["", "map"]),
            payload_type=st.integers(0, 1),
        ),
        st.binary(max_size=12),  # junk, and prefixes that end inside a field
    ),
    flags=st.integers(0, 7),
    width=st.sampled_from([None, 5]),
    payloads=st.lists(st.binary(min_size=8, max_size=8), min_size=3, max_size=6),
    wrong=st.lists(st.booleans(), min_size=6, max_size=6),
    cut=st.integers(-3, 3),
)
def test_decode_equals_the_full_path_on_any_stream(
    prefix: bytes, flags: int, width: int | None, payloads: list[bytes], wrong: list[bool], cut: int
) -> None:
    """Frames sharing a header and metadata prefix, with right and wrong checksums, then truncated
    or extended: the default path (learning, then decoding from templates) and the full path
    agree on every one, error for error."""
    for payload, bad in zip(payloads, wrong, strict=False):
        crc = zlib.crc32(payload) ^ (1 if bad else 0)
        data = frame(flags, prefix + b"\x78" + _varint(crc, width), payload)
        for variant in (data, data[: len(data) + cut] if cut < 0 else data + bytes(cut)):
            assert _outcome(variant) == _outcome(variant, full=True)


@pytest.mark.parametrize(
    "vector", [SDK_V1, SDK_V2, SDK_V2_ZSTD, SDK_KV_MAP_ZSTD, SDK_ALL_FIELDS, SDK_EMPTY, SPEC_V1, SPEC_V2]
)
def test_docs_avp_md_lists_every_vector_split_as_header_metadata_payload(vector: bytes) -> None:
    """docs/AVP.md cited a reference file outside the repository for these (a clean-room
    implementer had none to check against): each is now in its table, split where it is read."""
    text = (Path(__file__).parents[2] / "docs" / "AVP.md").read_text()
    payload_length, metadata_length = struct.unpack_from("<II", vector, 4)
    metadata = vector[12 : 12 + metadata_length].hex()
    payload = vector[12 + metadata_length : 12 + payload_length].hex() or "(none)"
    payload_cell = f"`{payload}`" if payload != "(none)" else payload
    assert f"| `{vector[:12].hex()}` | `{metadata}` | {payload_cell} |" in text
