"""AVP KV-cache payloads: the 17-byte header, layouts, views, and the checks the SDK does not make."""

from __future__ import annotations

import struct
import zlib
from collections.abc import Sequence
from typing import Any

import numpy as np
import pytest

from m2mwire import avp
from m2mwire.codecs.kvcache import MAX_KV_LAYERS, KVLayerView
from m2mwire.errors import DecodeError, EncodeError
from m2mwire.schemas import avp_pb2

TINY_PAYLOAD = bytes.fromhex("0100000001000000020000000200000001003c0040004200440045004600470048")
TINY_FRAME = bytes.fromhex(
    "415601043500000014000000220474696e79280230013801400178d2a2e9ca02"
    "0100000001000000020000000200000001003c0040004200440045004600470048"
)
K_TINY = np.array([1, 2, 3, 4], dtype=np.float16).reshape(1, 2, 2)
V_TINY = np.array([5, 6, 7, 8], dtype=np.float16).reshape(1, 2, 2)


def random_layers(
    layers: int, heads: int, seq: int, dim: int, dtype: str, seed: int = 0
) -> list[tuple[np.ndarray[Any, Any], np.ndarray[Any, Any]]]:
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(layers):
        k, v = (rng.standard_normal((heads, seq, dim)).astype(np.float32) for _ in range(2))
        if dtype == "bfloat16":
            out.append((avp.float32_to_bfloat16(k), avp.float32_to_bfloat16(v)))
        else:
            out.append((k.astype(dtype), v.astype(dtype)))
    return out


def kv_frame(payload: bytes, dtype: int = 1) -> bytes:
    fields: dict[str, Any] = {"payload_type": 1, "dtype": dtype, "payload_checksum": zlib.crc32(payload)}
    m: bytes = avp_pb2.Metadata(**fields).SerializeToString(deterministic=True)
    return struct.pack("<2sBBII", b"AV", 1, 0x04, len(m) + len(payload), len(m)) + m + payload


def test_kv_header_vector() -> None:
    assert avp.pack_kv_header(2, 2, 8, 4, avp.DataType.FLOAT16).hex() == "0200000002000000080000000400000001"
    assert avp.unpack_kv_header(bytes.fromhex("0200000002000000080000000400000001")) == (
        2,
        2,
        8,
        4,
        avp.DataType.FLOAT16,
    )


def test_tiny_kv_payload_and_frame_are_byte_exact() -> None:
    assert avp.build_kv_payload([(K_TINY, V_TINY)]) == TINY_PAYLOAD
    assert avp.encode_kv_cache([(K_TINY, V_TINY)], model_id="tiny", hidden_dim=2) == TINY_FRAME
    kv = avp.decode(TINY_FRAME).kv_cache()
    assert (kv.num_layers, kv.num_kv_heads, kv.head_dim, kv.seq_len, kv.dtype) == (
        1,
        1,
        2,
        2,
        avp.DataType.FLOAT16,
    )
    np.testing.assert_array_equal(kv.layers[0][0], K_TINY)
    np.testing.assert_array_equal(kv.layers[0][1], V_TINY)
    assert kv.nbytes == len(TINY_PAYLOAD)


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
@pytest.mark.parametrize("compress", [False, 1])
def test_round_trip(dtype: str, compress: int) -> None:
    layers = random_layers(3, 2, 5, 4, dtype)
    kw: dict[str, Any] = {"dtype": "bfloat16"} if dtype == "bfloat16" else {}
    data = avp.encode_kv_cache(layers, model_id="m", compress=compress, **kw)
    msg = avp.decode(data)
    md = msg.metadata
    assert md.payload_type is avp.PayloadType.KV_CACHE
    assert md.dtype is avp.DataType.parse(dtype)
    assert md.num_layers == 3
    assert md.tensor_shape == ()
    assert msg.header.is_kv_cache
    assert msg.header.compressed == bool(compress)
    kv = msg.kv_cache()
    assert (kv.num_layers, kv.num_kv_heads, kv.seq_len, kv.head_dim) == (3, 2, 5, 4)
    for (k, v), (k2, v2) in zip(layers, kv.layers, strict=True):
        np.testing.assert_array_equal(k2, k)
        np.testing.assert_array_equal(v2, v)
        assert k2.shape == (2, 5, 4)
    stacked = np.stack([np.stack(p) for p in layers])
    expected32 = avp.bfloat16_to_float32(stacked) if dtype == "bfloat16" else stacked.astype(np.float32)
    np.testing.assert_array_equal(kv.to_float32(), expected32)


def test_input_forms_give_the_same_payload() -> None:
    layers = random_layers(2, 3, 4, 5, "float16")
    stacked = np.stack([np.stack(p) for p in layers])  # [L, 2, H, S, D]
    batched = [(k[None], v[None]) for k, v in layers]  # [1, H, S, D]
    expected = avp.build_kv_payload(layers)
    assert avp.build_kv_payload(stacked) == expected
    assert avp.build_kv_payload(stacked[:, :, None]) == expected  # [L, 2, 1, H, S, D]
    assert avp.build_kv_payload(batched) == expected
    decoded = avp.decode(avp.encode_kv_cache(layers)).kv_cache()
    assert avp.build_kv_payload(decoded) == expected
    assert avp.encode_kv_cache(decoded) == avp.encode_kv_cache(layers)


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
def test_decoded_cache_reencodes_identically(dtype: str) -> None:
    layers = random_layers(2, 2, 3, 4, dtype)
    kw: dict[str, Any] = {"dtype": "bfloat16"} if dtype == "bfloat16" else {}
    data = avp.encode_kv_cache(layers, model_id="m", **kw)
    msg = avp.decode(data)
    assert avp.encode_kv_cache(msg.kv_cache(), msg.metadata) == data
    assert avp.encode_kv_cache(msg.kv_cache(), model_id="m") == data


def test_parts_are_views_of_the_callers_arrays() -> None:
    layers = random_layers(2, 2, 3, 4, "float32")
    parts = avp.encode_kv_cache_parts(layers)
    assert len(parts) == 2 + 2 * 2  # header+metadata, KV header, K0 V0 K1 V1
    for part, arr in zip(parts[2:], [t for pair in layers for t in pair], strict=True):
        assert np.shares_memory(np.frombuffer(part, dtype=np.uint8), arr)
    assert b"".join(parts) == avp.encode_kv_cache(layers)
    compressed = avp.encode_kv_cache_parts(layers, compress=True)
    assert b"".join(compressed) == avp.encode_kv_cache(layers, compress=True)
    assert avp.decode(b"".join(compressed)).header.compressed


def test_decoded_layers_are_views_of_the_frame() -> None:
    data = bytearray(avp.encode_kv_cache(random_layers(2, 2, 3, 4, "float16")))
    kv = avp.decode(data).kv_cache()
    frame_bytes = np.frombuffer(data, dtype=np.uint8)
    assert all(np.shares_memory(t, frame_bytes) for pair in kv.layers for t in pair)


def test_non_contiguous_layers_are_copied_once() -> None:
    k = np.arange(2 * 3 * 4, dtype=np.float32).reshape(4, 3, 2).transpose(2, 1, 0)  # [2, 3, 4] view
    kv = avp.decode(avp.encode_kv_cache([(k, k + 1)])).kv_cache()
    np.testing.assert_array_equal(kv.layers[0][0], k)
    np.testing.assert_array_equal(kv.layers[0][1], k + 1)


def test_metadata_overrides() -> None:
    layers = random_layers(2, 1, 2, 2, "float16")
    md = avp.AVPMetadata(session_id="s", num_layers=32, extra={"model_hash": "h", "num_steps": "20"})
    msg = avp.decode(avp.encode_kv_cache(layers, md, avp_map_id="vocab:0123456789abcdef"))
    assert msg.metadata.num_layers == 32  # the model's layer count, when the caller says so
    assert msg.metadata.extra == {"model_hash": "h", "num_steps": "20"}
    assert msg.header.has_map


def test_empty_layer_list() -> None:
    kv = avp.decode(avp.encode_kv_cache([])).kv_cache()
    assert kv.num_layers == 0
    assert len(kv.layers) == 0 and list(kv.layers) == []


@pytest.mark.parametrize(
    ("layers", "kwargs", "match"),
    [
        ([(np.zeros((1, 2, 2), np.int8),) * 2], {}, "no code for INT8"),
        ([(np.zeros((1, 2, 2), np.float64),) * 2], {}, "float32, float16"),
        ([(np.zeros((1, 2, 2), np.uint16),) * 2], {}, "bfloat16"),
        ([(np.zeros((2, 2), np.float16),) * 2], {}, "num_kv_heads"),
        ([(np.zeros((1, 2, 2), np.float16), np.zeros((1, 2, 3), np.float16))], {}, "layer 0 V"),
        ([(np.zeros((1, 2, 2), np.float16), np.zeros((1, 2, 2), np.float32))], {}, "layer 0 V"),
        ([(np.zeros((1, 2, 2), np.float16),)], {}, "not a \\(K, V\\) pair"),
        (np.zeros((2, 3, 1, 2, 2), np.float16), {}, "stacked"),
        ([(np.zeros((1, 2, 2), np.float16),) * 2], {"dtype": "float32"}, "dtype=FLOAT32"),
    ],
)
def test_encode_rejects(layers: Any, kwargs: dict[str, Any], match: str) -> None:
    with pytest.raises(EncodeError, match=match):
        avp.encode_kv_cache(layers, **kwargs)


def test_header_field_overflow() -> None:
    with pytest.raises(EncodeError, match="u32"):
        avp.pack_kv_header(2**32, 1, 1, 1, avp.DataType.FLOAT16)
    with pytest.raises(EncodeError, match="INT8"):
        avp.pack_kv_header(1, 1, 1, 1, avp.DataType.INT8)


# Decode-side checks; the SDK makes the first two too, and none of the others (avp-reference 1.6).


def test_payload_shorter_than_header() -> None:
    with pytest.raises(DecodeError, match="17-byte header"):
        avp.decode(kv_frame(b"\x00" * 16)).kv_cache()


def test_truncated_layers() -> None:
    with pytest.raises(DecodeError, match="truncated"):
        avp.decode(kv_frame(TINY_PAYLOAD[:-1])).kv_cache()


def test_trailing_bytes_after_last_layer() -> None:
    with pytest.raises(DecodeError, match="after the last layer"):
        avp.decode(kv_frame(TINY_PAYLOAD + b"\x00")).kv_cache()


@pytest.mark.parametrize("code", [3, 4, 255])
def test_unknown_dtype_byte(code: int) -> None:
    payload = TINY_PAYLOAD[:16] + bytes([code]) + TINY_PAYLOAD[17:]
    with pytest.raises(DecodeError, match=f"dtype byte {code}"):
        avp.decode(kv_frame(payload)).kv_cache()


def test_header_dtype_must_match_metadata_dtype() -> None:
    with pytest.raises(DecodeError, match="header says FLOAT16 but the frame metadata says BFLOAT16"):
        avp.decode(kv_frame(TINY_PAYLOAD, dtype=2)).kv_cache()


def test_huge_dimensions_fail_before_any_view() -> None:
    payload = struct.pack("<IIIIB", MAX_KV_LAYERS, 2**32 - 1, 2**32 - 1, 2**32 - 1, 1)
    with pytest.raises(DecodeError, match="truncated"):
        avp.parse_kv_payload(payload)
    assert avp.kv_payload_size(2**32 - 1, 2**32 - 1, 2**32 - 1, 2**32 - 1, avp.DataType.FLOAT16) > 2**128


def test_more_layers_than_max_kv_layers_are_refused_both_ways() -> None:
    """4,194,299 layers of one float16 made a valid 16 MiB payload (566 bytes with zstd), and a
    handler's ``for k, v in kv.layers`` then cost seconds and GBs (stop 33's attack run, F2)."""
    layers = MAX_KV_LAYERS + 1
    payload = struct.pack("<IIIIB", layers, 1, 1, 1, 1) + bytes(4 * layers)
    with pytest.raises(DecodeError, match="MAX_KV_LAYERS"):
        avp.parse_kv_payload(payload)
    with pytest.raises(EncodeError, match="MAX_KV_LAYERS"):
        avp.encode_kv_cache(np.zeros((layers, 2, 1, 1, 1), np.float16))
    most = np.arange(MAX_KV_LAYERS * 2, dtype=np.float16).reshape(MAX_KV_LAYERS, 2, 1, 1, 1)
    kv = avp.decode(avp.encode_kv_cache(most)).kv_cache()
    assert kv.num_layers == len(kv.layers) == MAX_KV_LAYERS


def test_layers_is_a_sequence_of_views_made_when_asked_for() -> None:
    stacked = np.arange(5 * 2 * 2 * 3 * 4, dtype=np.float32).reshape(5, 2, 2, 3, 4)
    kv = avp.decode(avp.encode_kv_cache(stacked)).kv_cache()
    layers = kv.layers
    assert isinstance(layers, KVLayerView) and isinstance(layers, Sequence) and len(layers) == 5
    expected = [(stacked[i, 0], stacked[i, 1]) for i in range(5)]
    for (k, v), (k2, v2) in zip(layers, expected, strict=True):  # iteration, as a list's
        np.testing.assert_array_equal(k, k2)
        np.testing.assert_array_equal(v, v2)
    np.testing.assert_array_equal(layers[-1][1], stacked[4, 1])
    assert [pair[0][0, 0, 0] for pair in layers[1:4:2]] == [stacked[1, 0, 0, 0, 0], stacked[3, 0, 0, 0, 0]]
    with pytest.raises(IndexError):
        layers[5]
    assert np.shares_memory(layers[2][0], kv.stacked)
