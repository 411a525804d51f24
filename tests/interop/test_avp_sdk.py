"""Our codec against the real SDK, both directions: every dtype, hidden state and KV cache, with and
without zstd, every metadata field; the byte-exact vectors; and the malformed inputs."""

from __future__ import annotations

import struct
import zlib
from typing import Any

import avp as sdk
import numpy as np
import pytest
import zstandard

from m2mwire import avp
from m2mwire.codecs.kvcache import MAX_KV_LAYERS
from m2mwire.errors import DecodeError
from m2mwire.schemas import avp_pb2
from tests.codecs.test_avp import SDK_REJECTED, SDK_V1, SDK_V2, SDK_V2_ZSTD

DTYPES = ["float32", "float16", "bfloat16", "int8"]
KV_DTYPES = ["float32", "float16", "bfloat16"]
LEVELS = [0, 1, 3]
SDK_LEVEL = {0: sdk.CompressionLevel.NONE, 1: sdk.CompressionLevel.FAST, 3: sdk.CompressionLevel.BALANCED}


def hidden_array(dtype: str, shape: tuple[int, ...] = (3, 64)) -> np.ndarray[Any, Any]:
    values = np.random.default_rng(7).standard_normal(shape).astype(np.float32) * 10
    if dtype == "bfloat16":
        return avp.float32_to_bfloat16(values)
    return values.astype(dtype)


def kv_layers(dtype: str, layers: int = 2) -> list[tuple[np.ndarray[Any, Any], np.ndarray[Any, Any]]]:
    rng = np.random.default_rng(11)
    out = []
    for _ in range(layers):
        k, v = (rng.standard_normal((2, 5, 8)).astype(np.float32) for _ in range(2))
        if dtype == "bfloat16":
            out.append((avp.float32_to_bfloat16(k), avp.float32_to_bfloat16(v)))
        else:
            out.append((k.astype(dtype), v.astype(dtype)))
    return out


def full_fields(kind: str, dtype: str, shape: tuple[int, ...], extra: dict[str, str]) -> dict[str, Any]:
    return {
        "session_id": "sess-0123",
        "source_agent_id": "agent-a",
        "target_agent_id": "agent-b",
        "model_id": "meta-llama/Llama-2-7b",
        "hidden_dim": 64,
        "num_layers": 2,
        "payload_type": "KV_CACHE" if kind == "kv" else "HIDDEN_STATE",
        "dtype": dtype,
        "tensor_shape": shape,
        "mode": "JSON",
        "avp_map_id": "vocab:0123456789abcdef",
        "extra": extra,
    }


def sdk_metadata(fields: dict[str, Any]) -> Any:
    return sdk.AVPMetadata(
        session_id=fields["session_id"],
        source_agent_id=fields["source_agent_id"],
        target_agent_id=fields["target_agent_id"],
        model_id=fields["model_id"],
        hidden_dim=fields["hidden_dim"],
        num_layers=fields["num_layers"],
        payload_type=sdk.PayloadType[fields["payload_type"]],
        dtype=sdk.DataType[fields["dtype"].upper()],
        tensor_shape=tuple(fields["tensor_shape"]),
        mode=sdk.CommunicationMode[fields["mode"]],
        avp_map_id=fields["avp_map_id"],
        extra=dict(fields["extra"]),
    )


def assert_same_metadata(ours: avp.AVPMetadata, theirs: Any, compressed: bool) -> None:
    assert ours.session_id == theirs.session_id
    assert ours.source_agent_id == theirs.source_agent_id
    assert ours.target_agent_id == theirs.target_agent_id
    assert ours.model_id == theirs.model_id
    assert ours.hidden_dim == theirs.hidden_dim
    assert ours.num_layers == theirs.num_layers
    assert ours.payload_type.name == theirs.payload_type.name
    assert ours.dtype.name == theirs.dtype.name
    assert ours.tensor_shape == tuple(theirs.tensor_shape)
    assert ours.mode.name == theirs.mode.name
    assert ours.avp_map_id == theirs.avp_map_id
    assert dict(ours.extra) == dict(theirs.extra)
    assert theirs.compression == ("zstd" if compressed else None)


def our_frame(
    kind: str, dtype: str, level: int, extra: dict[str, str]
) -> tuple[bytes, bytes, dict[str, Any]]:
    """(frame, uncompressed payload, fields) encoded by us."""
    if kind == "hidden":
        arr = hidden_array(dtype)
        fields = full_fields(kind, dtype, arr.shape, extra)
        return avp.encode_hidden_state(arr, compress=level, **fields), arr.tobytes(), fields
    layers = kv_layers(dtype)
    fields = full_fields(kind, dtype, (), extra)
    return (
        avp.encode_kv_cache(layers, compress=level, **fields),
        avp.build_kv_payload(layers, dtype=dtype),
        fields,
    )


CASES = [("hidden", d) for d in DTYPES] + [("kv", d) for d in KV_DTYPES]


@pytest.mark.parametrize("level", LEVELS)
@pytest.mark.parametrize(("kind", "dtype"), CASES)
def test_ours_to_sdk_byte_identical(kind: str, dtype: str, level: int) -> None:
    data, payload, fields = our_frame(kind, dtype, level, {"model_hash": "abc"})
    assert data == sdk.encode(payload, sdk_metadata(fields), SDK_LEVEL[level])
    msg = sdk.decode(data)
    assert msg.payload == payload
    assert_same_metadata(avp.decode(data).metadata, msg.metadata, bool(level))
    assert msg.header.flags == (0x06 if kind == "kv" else 0x02) | (1 if level else 0)


@pytest.mark.parametrize("level", LEVELS)
@pytest.mark.parametrize(("kind", "dtype"), CASES)
def test_sdk_to_ours(kind: str, dtype: str, level: int) -> None:
    extra = {"model_hash": "abc", "model_family": "llama", "num_steps": "20"}  # >= 2 entries: parsed compare
    if kind == "hidden":
        arr = hidden_array(dtype)
        fields = full_fields(kind, dtype, arr.shape, extra)
        payload = arr.tobytes()
    else:
        layers = kv_layers(dtype)
        fields = full_fields(kind, dtype, (), extra)
        payload = avp.build_kv_payload(layers, dtype=dtype)
    sdk_md = sdk_metadata(fields)
    data = sdk.encode(payload, sdk_md, SDK_LEVEL[level])
    msg = avp.decode(data)
    assert msg.payload.tobytes() == payload
    assert msg.metadata.payload_checksum == zlib.crc32(payload)
    sdk_md.compression = "zstd" if level else None
    assert_same_metadata(msg.metadata, sdk_md, bool(level))
    assert msg.raw.tobytes() == data
    if kind == "hidden":
        np.testing.assert_array_equal(msg.tensor(), arr)
    else:
        kv = msg.kv_cache()
        for (k, v), (k2, v2) in zip(layers, kv.layers, strict=True):
            np.testing.assert_array_equal(k2, k)
            np.testing.assert_array_equal(v2, v)
    # And back: our re-encoding of the decoded message decodes in the SDK to the same thing.
    again = sdk.decode(avp.encode(msg.payload, msg.metadata, compress=level))
    assert again.payload == payload
    assert_same_metadata(msg.metadata, again.metadata, bool(level))


@pytest.mark.parametrize("level", LEVELS)
@pytest.mark.parametrize("kind", ["hidden", "kv"])
def test_empty_payloads_both_ways(kind: str, level: int) -> None:
    sdk_md = sdk.AVPMetadata(
        payload_type=sdk.PayloadType.KV_CACHE if kind == "kv" else sdk.PayloadType.HIDDEN_STATE
    )
    theirs = sdk.encode(b"", sdk_md, SDK_LEVEL[level])
    ours = avp.encode(b"", payload_type=kind == "kv", compress=level)
    assert ours == theirs
    assert avp.decode(theirs).payload.tobytes() == b""
    assert sdk.decode(ours).payload == b""


def test_sdk_extra_order_differs_but_parses_the_same() -> None:
    """The SDK writes >= 2 extra entries in upb hash order; we write them sorted (deterministic)."""
    extra = {"b": "2", "a": "1", "c": "3"}
    theirs = sdk.encode(b"xy", sdk.AVPMetadata(extra=extra))
    ours = avp.encode(b"xy", extra=extra)
    assert len(ours) == len(theirs)
    assert dict(avp.decode(theirs).metadata.extra) == dict(sdk.decode(ours).metadata.extra) == extra


def test_byte_exact_vectors_from_the_sdk() -> None:
    v1 = sdk.encode(
        np.array([0.1, 0.2, 0.3, 0.4], dtype=np.float32).tobytes(),
        sdk.AVPMetadata(source_agent_id="agent-a", model_id="test-model", hidden_dim=4, tensor_shape=(4,)),
    )
    v2_md = sdk.AVPMetadata(hidden_dim=2, tensor_shape=(2,))
    v2 = np.array([1.0, 2.0], dtype=np.float32)
    assert v1 == SDK_V1
    assert sdk.encode(v2.tobytes(), v2_md) == SDK_V2 == avp.encode_hidden_state(v2)
    assert sdk.encode(v2.tobytes(), v2_md, sdk.CompressionLevel.FAST) == SDK_V2_ZSTD
    assert avp.encode_hidden_state(v2, compress=1) == SDK_V2_ZSTD


# --------------------------------------------------------------------------------------------------
# Malformed input


@pytest.mark.parametrize(("name", "data"), SDK_REJECTED, ids=[n for n, _ in SDK_REJECTED])
def test_both_reject(name: str, data: bytes) -> None:
    with pytest.raises(Exception):  # noqa: B017 - the SDK raises AVPError, protobuf or zstd errors
        sdk.decode(data)
    with pytest.raises(DecodeError):
        avp.decode(data)


def _frame(flags: int, meta: bytes, body: bytes) -> bytes:
    return struct.pack("<2sBBII", b"AV", 1, flags, len(meta) + len(body), len(meta)) + meta + body


def _meta(**fields: Any) -> bytes:
    data: bytes = avp_pb2.Metadata(**fields).SerializeToString()
    return data


def _stricter() -> list[tuple[str, bytes]]:
    cctx = zstandard.ZstdCompressor()
    first = cctx.compress(b"abcd" * 10)
    zmeta = _meta(compression="zstd", payload_checksum=zlib.crc32(b"abcd" * 10))
    empty_meta = _meta(compression="zstd", payload_checksum=0)
    kv_payload = struct.pack("<IIIIB", 1, 1, 1, 1, 3) + b"\x00" * 2
    layers = MAX_KV_LAYERS + 1
    kv_layers = struct.pack("<IIIIB", layers, 1, 1, 1, 1) + b"\x00" * (4 * layers)
    four = b"\x00" * 4
    return [
        ("trailing bytes", SDK_V1 + b"junk!"),
        ("two frames", SDK_V1 + SDK_V2),
        ("reserved flag bits", SDK_V1[:3] + bytes([0xF8]) + SDK_V1[4:]),
        ("KV flag on hidden state", _frame(0x04, _meta(payload_checksum=0), b"")),
        ("KV payload_type without flag", _frame(0x00, _meta(payload_type=1, payload_checksum=0), b"")),
        ("has-map flag without map id", _frame(0x02, _meta(payload_checksum=0), b"")),
        ("map id without has-map flag", _frame(0x00, _meta(avp_map_id="vocab:x", payload_checksum=0), b"")),
        ("compression field without flag", _frame(0x00, _meta(compression="zstd", payload_checksum=0), b"")),
        ("two zstd frames", _frame(0x01, zmeta, first + cctx.compress(b"more"))),
        ("junk after zstd frame", _frame(0x01, zmeta, first + b"x")),
        ("junk after empty zstd frame", _frame(0x01, empty_meta, cctx.compress(b"") + b"junk")),
        (
            "shape does not match payload",
            _frame(0, _meta(tensor_shape=[3], payload_checksum=zlib.crc32(b"")), b""),
        ),
        (
            "KV dtype byte 3 (frame decodes; kv_cache() rejects)",
            _frame(0x04, _meta(payload_type=1, dtype=1, payload_checksum=zlib.crc32(kv_payload)), kv_payload),
        ),
        (
            "KV header over MAX_KV_LAYERS (frame decodes; kv_cache() rejects)",
            _frame(0x04, _meta(payload_type=1, dtype=1, payload_checksum=zlib.crc32(kv_layers)), kv_layers),
        ),
        (
            "tensor_shape over MAX_TENSOR_DIMS",
            _frame(0, _meta(tensor_shape=[1] * 33, payload_checksum=zlib.crc32(four)), four),
        ),
    ]


STRICTER = _stricter()


@pytest.mark.parametrize(("name", "data"), STRICTER, ids=[n for n, _ in STRICTER])
def test_sdk_accepts_we_reject(name: str, data: bytes) -> None:
    """Each documented strictness decision (docs/AVP.md): the SDK decodes these, we do not."""
    sdk.decode(data)
    with pytest.raises(DecodeError):
        avp.decode(data).kv_cache() if "kv_cache() rejects" in name else avp.decode(data)
