"""AVP KV-cache payloads: a 17-byte header, then K and V of every layer, contiguous little-endian.

    num_layers u32 | num_kv_heads u32 | head_dim u32 | seq_len u32 | dtype u8 (0 fp32, 1 fp16, 2 bf16)
    K_0 V_0 K_1 V_1 ...   each [num_kv_heads, seq_len, head_dim]

This is the SDK's layout (batch 1 squeezed away). There is no int8 code. The helpers never
concatenate repeatedly: :func:`kv_payload_parts` returns the header plus views of the caller's
arrays, :func:`build_kv_payload` joins them with one copy, and :func:`parse_kv_payload` returns
numpy views into the payload.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any, Final, TypeAlias, Unpack, overload

import numpy as np
import numpy.typing as npt

from m2mwire.codecs.avpframe import (
    AVPMetadata,
    DataType,
    MetadataFields,
    PayloadType,
    array_dtype,
    array_view,
    bfloat16_to_float32,
    build_frame,
    requested_dtype,
    resolve_metadata,
    zstd_level,
)
from m2mwire.errors import DecodeError, EncodeError

__all__ = [
    "KV_HEADER",
    "KV_HEADER_SIZE",
    "MAX_KV_LAYERS",
    "KVCache",
    "KVLayerView",
    "KVLayers",
    "build_kv_payload",
    "encode_kv_cache",
    "encode_kv_cache_parts",
    "kv_payload_parts",
    "kv_payload_size",
    "pack_kv_header",
    "parse_kv_payload",
    "unpack_kv_header",
]

KV_HEADER: Final = struct.Struct("<IIIIB")
KV_HEADER_SIZE: Final = 17
_U32_MAX: Final = 0xFFFF_FFFF
_KV_DTYPES: Final = (DataType.FLOAT32, DataType.FLOAT16, DataType.BFLOAT16)
#: The most layers a KV-cache payload may declare (models have at most a few hundred). Stricter
#: than the SDK: 4,194,299 layers of one float16 each make a valid 16 MiB payload that zstd
#: carries in 566 bytes, and every per-layer step of a handler then ran 4 million times
#: (stop 33's attack run: 9 s of a server's CPU and 1.6 GB for three such frames).
MAX_KV_LAYERS: Final = 4096


class KVLayerView(Sequence[tuple[npt.NDArray[Any], npt.NDArray[Any]]]):
    """``(K_i, V_i)`` of each layer of a stacked ``[L, 2, H, S, D]`` array, each pair made when
    it is asked for (a list made them all at each access of ``KVCache.layers``)."""

    __slots__ = ("_stacked",)

    def __init__(self, stacked: npt.NDArray[Any]) -> None:
        self._stacked = stacked

    def __len__(self) -> int:
        return int(self._stacked.shape[0])

    @overload
    def __getitem__(self, index: int) -> tuple[npt.NDArray[Any], npt.NDArray[Any]]: ...
    @overload
    def __getitem__(self, index: slice) -> list[tuple[npt.NDArray[Any], npt.NDArray[Any]]]: ...
    def __getitem__(
        self, index: int | slice
    ) -> tuple[npt.NDArray[Any], npt.NDArray[Any]] | list[tuple[npt.NDArray[Any], npt.NDArray[Any]]]:
        s = self._stacked
        if isinstance(index, slice):
            return [(s[i, 0], s[i, 1]) for i in range(*index.indices(len(self)))]
        layer = s[index]  # IndexError past the end, negative indexes as a list's
        return layer[0], layer[1]

    def __repr__(self) -> str:
        return f"KVLayerView({len(self)} layers)"


@dataclass(frozen=True, slots=True)
class KVCache:
    """A decoded KV cache: ``layers[i] == (K_i, V_i)``, each ``[num_kv_heads, seq_len, head_dim]``.

    The arrays are views into the payload (read-only when the frame was ``bytes``); bfloat16 is
    carried as ``uint16`` words (see :meth:`to_float32`). ``stacked`` is one view of everything,
    shaped ``[num_layers, 2, num_kv_heads, seq_len, head_dim]``.
    """

    num_layers: int
    num_kv_heads: int
    head_dim: int
    seq_len: int
    dtype: DataType
    stacked: npt.NDArray[Any]

    @property
    def layers(self) -> KVLayerView:
        """``layers[i] == (K_i, V_i)``: a sequence whose pairs are views made when asked for."""
        return KVLayerView(self.stacked)

    @property
    def nbytes(self) -> int:
        """Size of the KV payload, header included."""
        return KV_HEADER_SIZE + int(self.stacked.nbytes)

    def to_float32(self) -> npt.NDArray[np.float32]:
        """All of it as one new float32 array ``[num_layers, 2, heads, seq_len, head_dim]``."""
        if self.dtype is DataType.BFLOAT16:
            return bfloat16_to_float32(self.stacked)
        return self.stacked.astype(np.float32)


#: Per-layer (K, V) pairs, a stacked ``[L, 2, H, S, D]`` array, or a decoded :class:`KVCache`.
KVLayers: TypeAlias = Sequence[tuple[npt.NDArray[Any], npt.NDArray[Any]]] | npt.NDArray[Any] | KVCache


def pack_kv_header(
    num_layers: int, num_kv_heads: int, head_dim: int, seq_len: int, dtype: DataType | int
) -> bytes:
    """The 17-byte KV header."""
    dt = DataType(dtype)
    if dt not in _KV_DTYPES:
        raise EncodeError(
            f"the AVP KV-cache header has no code for {dt.name}; use float32, float16, bfloat16"
        )
    for name, value in (
        ("num_layers", num_layers),
        ("num_kv_heads", num_kv_heads),
        ("head_dim", head_dim),
        ("seq_len", seq_len),
    ):
        if not 0 <= value <= _U32_MAX:
            raise EncodeError(f"KV-cache {name}={value} does not fit the u32 header field")
    if num_layers > MAX_KV_LAYERS:
        raise EncodeError(
            f"a KV cache of {num_layers} layers: AVP peers here take at most {MAX_KV_LAYERS} (MAX_KV_LAYERS)"
        )
    return KV_HEADER.pack(num_layers, num_kv_heads, head_dim, seq_len, int(dt))


def unpack_kv_header(data: bytes | bytearray | memoryview) -> tuple[int, int, int, int, DataType]:
    """(num_layers, num_kv_heads, head_dim, seq_len, dtype) from the first 17 bytes; validates dtype."""
    if len(data) < KV_HEADER_SIZE:
        raise DecodeError(f"KV-cache payload is {len(data)} bytes, shorter than its 17-byte header")
    layers, heads, head_dim, seq_len, code = KV_HEADER.unpack_from(data)
    if code >= len(_KV_DTYPES):
        raise DecodeError(f"KV-cache dtype byte {code} is not 0 (float32), 1 (float16) or 2 (bfloat16)")
    return layers, heads, head_dim, seq_len, _KV_DTYPES[code]


def kv_payload_size(num_layers: int, num_kv_heads: int, head_dim: int, seq_len: int, dtype: DataType) -> int:
    """17 + 2 * L * H * S * D * itemsize (exact integer arithmetic)."""
    return KV_HEADER_SIZE + 2 * num_layers * num_kv_heads * seq_len * head_dim * dtype.itemsize


def parse_kv_payload(
    payload: bytes | bytearray | memoryview, *, expected_dtype: DataType | None = None
) -> KVCache:
    """Views of every layer's K and V; the payload must be exactly header + tensors.

    Stricter than the SDK: a dtype byte >= 3 and bytes after the last V are rejected, and when
    ``expected_dtype`` (the frame's metadata dtype) is given, the header's dtype must equal it.
    Sizes are checked (exact integers, no overflow) before any view is made.
    """
    layers, heads, head_dim, seq_len, dtype = unpack_kv_header(payload)
    if layers > MAX_KV_LAYERS:
        raise DecodeError(
            f"KV-cache header declares {layers} layers, more than {MAX_KV_LAYERS} (MAX_KV_LAYERS)"
        )
    if expected_dtype is not None and expected_dtype is not dtype:
        raise DecodeError(
            f"KV-cache header says {dtype.name} but the frame metadata says {expected_dtype.name}"
        )
    need = kv_payload_size(layers, heads, head_dim, seq_len, dtype)
    have = len(payload)
    if have < need:
        raise DecodeError(
            f"KV-cache data truncated: {layers} layers x {heads} heads x {seq_len} tokens x {head_dim} "
            f"({dtype.name}) need {need} bytes, the payload has {have}"
        )
    if have > need:
        raise DecodeError(f"KV-cache payload has {have - need} bytes after the last layer")
    body = np.frombuffer(payload, dtype=dtype.storage_dtype, offset=KV_HEADER_SIZE)
    stacked = body.reshape(layers, 2, heads, seq_len, head_dim)
    return KVCache(layers, heads, head_dim, seq_len, dtype, stacked)


def _squeeze_batch(t: npt.NDArray[Any]) -> npt.NDArray[Any]:
    if t.ndim == 4 and t.shape[0] == 1:
        squeezed: npt.NDArray[Any] = t[0]
        return squeezed
    if t.ndim != 3:
        raise EncodeError(
            f"K/V tensors must be [num_kv_heads, seq_len, head_dim] (or batch 1), not {t.shape}"
        )
    return t


def _pairs(layers: KVLayers) -> list[tuple[npt.NDArray[Any], npt.NDArray[Any]]]:
    if isinstance(layers, KVCache):
        return list(layers.layers)
    if isinstance(layers, np.ndarray):
        arr = layers
        if arr.ndim == 6 and arr.shape[2] == 1:
            arr = arr[:, :, 0]
        if arr.ndim != 5 or arr.shape[1] != 2:
            raise EncodeError(
                f"a stacked KV cache is [num_layers, 2, heads, seq_len, head_dim], got {arr.shape}"
            )
        return [(arr[i, 0], arr[i, 1]) for i in range(arr.shape[0])]
    pairs = []
    for i, pair in enumerate(layers):
        if len(pair) != 2:
            raise EncodeError(f"layer {i} is not a (K, V) pair")
        k, v = (_squeeze_batch(np.asarray(t)) for t in pair)
        pairs.append((k, v))
    return pairs


def kv_payload_parts(
    layers: KVLayers, *, dtype: DataType | str | None = None
) -> tuple[list[memoryview], DataType]:
    """``[17-byte header, K_0, V_0, K_1, ...]`` as byte views of the caller's arrays, and the dtype.

    Arrays must share one shape and dtype: float32, float16, or bfloat16 (an ml_dtypes array, or
    uint16 words with ``dtype="bfloat16"``). Contiguous little-endian arrays are not copied.
    """
    requested = None if dtype is None else DataType.parse(dtype)
    if requested is None and isinstance(layers, KVCache):
        requested = layers.dtype  # bfloat16 comes back as uint16 words
    pairs = _pairs(layers)
    if not pairs:
        dt = requested if requested is not None else DataType.FLOAT16
        return [memoryview(pack_kv_header(0, 0, 0, 0, dt))], dt
    first = pairs[0][0]
    shape = first.shape
    dt = array_dtype(first, requested)
    if dt not in _KV_DTYPES:
        raise EncodeError(
            f"the AVP KV-cache header has no code for {dt.name}; use float32, float16, bfloat16"
        )
    views: list[memoryview] = []
    for i, (k, v) in enumerate(pairs):
        for name, t in (("K", k), ("V", v)):
            if t.shape != shape or t.dtype != first.dtype:
                raise EncodeError(
                    f"layer {i} {name} is {t.dtype}{list(t.shape)}, layer 0 K is {first.dtype}{list(shape)}"
                )
            views.append(array_view(t))
    heads, seq_len, head_dim = (int(d) for d in shape)
    views.insert(0, memoryview(pack_kv_header(len(pairs), heads, head_dim, seq_len, dt)))
    return views, dt


def build_kv_payload(layers: KVLayers, *, dtype: DataType | str | None = None) -> bytes:
    """The whole KV payload as one ``bytes`` (each tensor copied once), e.g. for ``avp.encode``."""
    views, _ = kv_payload_parts(layers, dtype=dtype)
    return b"".join(views)


def encode_kv_cache_parts(
    layers: KVLayers,
    metadata: AVPMetadata | None = None,
    *,
    compress: bool | int = False,
    **fields: Unpack[MetadataFields],
) -> list[bytes | memoryview]:
    """A KV_CACHE frame as buffers ``[header + metadata, KV header, K_0, V_0, ...]`` (no tensor copy).

    Metadata as the SDK writes it: payload_type KV_CACHE, dtype from the arrays, ``num_layers``
    defaulting to the number of layers, ``tensor_shape`` empty. Compressed, the buffers are
    ``[header + metadata, pieces of the one zstd frame...]``.
    """
    md = resolve_metadata(metadata, fields)
    requested = requested_dtype(fields, md)
    views, dt = kv_payload_parts(layers, dtype=requested)
    num_layers = KV_HEADER.unpack_from(views[0])[0]
    if md.payload_type is not PayloadType.KV_CACHE or md.dtype is not dt or not md.num_layers:
        md = replace(md, payload_type=PayloadType.KV_CACHE, dtype=dt, num_layers=md.num_layers or num_layers)
    total = sum(len(v) for v in views)
    return build_frame(views, total, md, dt, md.tensor_shape, zstd_level(compress))


def encode_kv_cache(
    layers: KVLayers,
    metadata: AVPMetadata | None = None,
    *,
    compress: bool | int = False,
    **fields: Unpack[MetadataFields],
) -> bytes:
    """A KV_CACHE frame as one ``bytes`` (each tensor copied once); see :func:`encode_kv_cache_parts`."""
    return b"".join(encode_kv_cache_parts(layers, metadata, compress=compress, **fields))
