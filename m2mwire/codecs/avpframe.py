"""What every AVP encoder shares: the enums, the metadata, bfloat16, zstd and frame assembly.

The hidden-state codec (:mod:`m2mwire.codecs.avp`) and the KV-cache codec
(:mod:`m2mwire.codecs.kvcache`) both build frames from these pieces; keeping them here, below
both, is what keeps the two modules free of an import cycle (``avp`` imports ``kvcache`` for
:meth:`AVPMessage.kv_cache`, ``kvcache`` imports only this module). The names are public to the
codec package, not to users: :mod:`m2mwire.avp` is the public API.
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields, replace
from enum import IntEnum
from types import MappingProxyType
from typing import Any, Final, TypeAlias, TypedDict, cast

import numpy as np
import numpy.typing as npt
import zstandard

from m2mwire.codecs.avpheader import (
    DEFAULT_ZSTD_LEVEL,
    FLAG_COMPRESSED,
    FLAG_HAS_MAP,
    FLAG_KV_CACHE,
    HEADER_STRUCT,
    MAGIC,
    MAX_PAYLOAD_LENGTH,
    VERSION,
    content_size,
)
from m2mwire.codecs.checksum import crc32_chunks
from m2mwire.codecs.limits import check_size
from m2mwire.errors import DecodeError, EncodeError
from m2mwire.schemas import avp_pb2

__all__ = [
    "DATA_TYPES",
    "EMPTY_METADATA",
    "ITEMSIZE",
    "MAX_TENSOR_DIMS",
    "MODES",
    "PAYLOAD_TYPES",
    "STORAGE_DTYPES",
    "AVPMetadata",
    "CommunicationMode",
    "DataType",
    "MetadataFields",
    "MetadataPB",
    "PayloadLike",
    "PayloadType",
    "array_dtype",
    "array_view",
    "bfloat16_to_float32",
    "build_frame",
    "byte_view",
    "check_shape",
    "compress_chunks",
    "decompress_payload",
    "float32_to_bfloat16",
    "frame_head",
    "metadata_bytes",
    "requested_dtype",
    "resolve_metadata",
    "shape_bytes",
    "zstd_level",
]

PayloadLike: TypeAlias = bytes | bytearray | memoryview | np.ndarray[Any, Any]

_BIG_ENDIAN_HOST = sys.byteorder == "big"


class PayloadType(IntEnum):
    HIDDEN_STATE = 0
    KV_CACHE = 1

    @classmethod
    def parse(cls, value: PayloadType | int | str) -> PayloadType:
        """``PayloadType.KV_CACHE``, ``1``, ``"KV_CACHE"`` or ``"kv_cache"``."""
        if isinstance(value, str):
            try:
                return cls[value.strip().upper()]
            except KeyError:
                raise ValueError(
                    f"unknown AVP payload type {value!r}; expected HIDDEN_STATE or KV_CACHE"
                ) from None
        return cls(value)


class CommunicationMode(IntEnum):
    LATENT = 0
    JSON = 1
    JSON_MODE = 1  # the protobuf name; an alias of JSON

    @classmethod
    def parse(cls, value: CommunicationMode | int | str) -> CommunicationMode:
        """``CommunicationMode.JSON``, ``1``, ``"LATENT"``, ``"JSON"`` or ``"JSON_MODE"``."""
        if isinstance(value, str):
            try:
                return cls[value.strip().upper()]
            except KeyError:
                raise ValueError(f"unknown AVP mode {value!r}; expected LATENT or JSON") from None
        return cls(value)


class DataType(IntEnum):
    FLOAT32 = 0
    FLOAT16 = 1
    BFLOAT16 = 2
    INT8 = 3

    @property
    def itemsize(self) -> int:
        """Bytes per element on the wire."""
        return ITEMSIZE[self]

    @property
    def storage_dtype(self) -> np.dtype[Any]:
        """The little-endian numpy dtype a payload is viewed as (bfloat16 as raw ``uint16`` words)."""
        return STORAGE_DTYPES[self]

    @classmethod
    def parse(cls, value: DataType | int | str) -> DataType:
        """``DataType.FLOAT16``, ``1``, ``"float16"``, ``"fp16"``, ``"bf16"``, ``"BFLOAT16"`` ..."""
        if isinstance(value, str):
            key = value.strip().lower()
            if key in _DTYPE_NAMES:
                return _DTYPE_NAMES[key]
            raise ValueError(f"unknown AVP dtype {value!r}; expected one of float32, float16, bfloat16, int8")
        return cls(value)


ITEMSIZE: Final = (4, 2, 2, 1)
#: The most dimensions a tensor_shape may have (numpy 1.x takes at most 32, 2.x 64; tensors that
#: models exchange have a few). Stricter than the SDK: a 65,000-dimension shape cost a receiver
#: 2.5 ms per 65 KB frame in checks and copies, ~40x plain traffic (stop 33's attack run, F5).
MAX_TENSOR_DIMS: Final = 32
STORAGE_DTYPES: Final[tuple[np.dtype[Any], ...]] = (
    np.dtype("<f4"),
    np.dtype("<f2"),
    np.dtype("<u2"),
    np.dtype("i1"),
)
_DTYPE_NAMES: Final = {
    "float32": DataType.FLOAT32,
    "fp32": DataType.FLOAT32,
    "f32": DataType.FLOAT32,
    "float16": DataType.FLOAT16,
    "fp16": DataType.FLOAT16,
    "f16": DataType.FLOAT16,
    "half": DataType.FLOAT16,
    "bfloat16": DataType.BFLOAT16,
    "bf16": DataType.BFLOAT16,
    "int8": DataType.INT8,
    "i8": DataType.INT8,
}
PAYLOAD_TYPES: Final = tuple(PayloadType)
DATA_TYPES: Final = tuple(DataType)
MODES: Final = (CommunicationMode.LATENT, CommunicationMode.JSON)


# --------------------------------------------------------------------------------------------------
# Metadata, header, message


@dataclass(frozen=True, slots=True)
class AVPMetadata:
    """Every field of the AVP ``Metadata`` protobuf.

    ``compression`` and ``payload_checksum`` describe a received frame; the encoder ignores them and
    writes its own (``"zstd"`` when it compresses, and the CRC-32 it computes).
    """

    session_id: str = ""
    source_agent_id: str = ""
    target_agent_id: str = ""
    model_id: str = ""
    hidden_dim: int = 0
    num_layers: int = 0
    payload_type: PayloadType = PayloadType.HIDDEN_STATE
    dtype: DataType = DataType.FLOAT32
    tensor_shape: tuple[int, ...] = ()
    mode: CommunicationMode = CommunicationMode.LATENT
    compression: str | None = None
    avp_map_id: str = ""
    extra: Mapping[str, str] = field(default_factory=dict)
    payload_checksum: int | None = None
    # Serialized fields 1-14 by (dtype, tensor_shape, compressed): see metadata_bytes().
    _wire: dict[tuple[int, tuple[int, ...], bool], bytes] | None = field(
        default=None, init=False, repr=False, compare=False
    )
    # The fast encoder's last (dtype, tensor_shape, payload size, frame head): see frame_head().
    _head: tuple[DataType, tuple[int, ...], int, bytes] | None = field(
        default=None, init=False, repr=False, compare=False
    )

    def __post_init__(self) -> None:
        # Normalise the convenient spellings (ints, dtype names, lists) to the declared types.
        if type(self.payload_type) is not PayloadType:
            object.__setattr__(self, "payload_type", PayloadType.parse(self.payload_type))
        if type(self.dtype) is not DataType:
            object.__setattr__(self, "dtype", DataType.parse(self.dtype))
        if type(self.mode) is not CommunicationMode:
            object.__setattr__(self, "mode", CommunicationMode.parse(self.mode))
        if type(self.tensor_shape) is not tuple:
            object.__setattr__(self, "tensor_shape", tuple(int(d) for d in self.tensor_shape))
        if type(self.extra) is not MappingProxyType:
            # A read-only copy: the metadata is immutable, so its encoding can be cached.
            object.__setattr__(self, "extra", MappingProxyType(dict(self.extra)))

    @property
    def is_kv_cache(self) -> bool:
        return self.payload_type is PayloadType.KV_CACHE

    def __reduce__(self) -> tuple[Any, ...]:
        # pickle/deepcopy: the read-only `extra` view cannot be pickled; the dict behind it can.
        values = {f.name: getattr(self, f.name) for f in fields(self) if f.init}
        values["extra"] = dict(self.extra)
        return (_metadata_from_fields, (values,))


def _metadata_from_fields(values: dict[str, Any]) -> AVPMetadata:
    return AVPMetadata(**values)


class MetadataFields(TypedDict, total=False):
    """Metadata fields accepted as keyword arguments by the ``encode*`` functions."""

    session_id: str
    source_agent_id: str
    target_agent_id: str
    model_id: str
    hidden_dim: int
    num_layers: int
    payload_type: PayloadType | int | str
    dtype: DataType | int | str
    tensor_shape: Sequence[int]
    mode: CommunicationMode | int | str
    avp_map_id: str
    extra: Mapping[str, str]


_new_metadata = object.__new__
_set = object.__setattr__


# --------------------------------------------------------------------------------------------------
# bfloat16 helpers


def bfloat16_to_float32(words: npt.ArrayLike) -> npt.NDArray[np.float32]:
    """Widen bfloat16 values given as raw 16-bit words (or an ml_dtypes array) to float32, exactly."""
    w = np.asarray(words)
    if w.dtype.name == "bfloat16" and w.dtype.itemsize == 2:
        w = w.view(np.uint16)
    if w.dtype.kind not in "ui" or w.dtype.itemsize != 2:
        raise TypeError(f"expected 16-bit bfloat16 words, got dtype {w.dtype}")
    out: npt.NDArray[np.float32] = (w.astype("<u4") << 16).view("<f4").astype(np.float32, copy=False)
    return out


def float32_to_bfloat16(values: npt.ArrayLike) -> npt.NDArray[np.uint16]:
    """Round float32 values to bfloat16 (nearest, ties to even; NaN stays NaN) as ``uint16`` words."""
    u = np.ascontiguousarray(values, dtype="<f4").view("<u4")
    rounded: npt.NDArray[np.uint16] = ((u + (((u >> 16) & 1) + 0x7FFF)) >> 16).astype(np.uint16)
    nan = (u & 0x7FFF_FFFF) > 0x7F80_0000
    if nan.any():
        rounded[nan] = ((u[nan] >> 16) | 0x0040).astype(np.uint16)
    return rounded


# --------------------------------------------------------------------------------------------------
# zstd

_local = threading.local()


def _compressor(level: int) -> zstandard.ZstdCompressor:
    # Contexts at low levels are cheap to keep; high levels hold a lot of memory, so are not cached.
    if level > DEFAULT_ZSTD_LEVEL:
        return zstandard.ZstdCompressor(level=level)
    cache: dict[int, zstandard.ZstdCompressor] | None = getattr(_local, "cctx", None)
    if cache is None:
        cache = _local.cctx = {}
    cctx = cache.get(level)
    if cctx is None:
        cctx = cache[level] = zstandard.ZstdCompressor(level=level)
    return cctx


def _decompressor() -> zstandard.ZstdDecompressor:
    dctx: zstandard.ZstdDecompressor | None = getattr(_local, "dctx", None)
    if dctx is None:
        dctx = _local.dctx = zstandard.ZstdDecompressor()
    return dctx


def compress_chunks(chunks: Sequence[memoryview], total: int, level: int) -> list[bytes]:
    """One zstd frame with the content size in its header (what the SDK's decoder requires).

    One buffer: ``ZstdCompressor.compress`` (the SDK's call, same bytes). Several buffers: a
    compressor with the size pledged up front, whose output pieces are returned unjoined (no copy
    of the whole frame); for the same content the bytes have been identical in every test.
    """
    try:
        cctx = _compressor(level)
        if len(chunks) == 1:
            return [cctx.compress(chunks[0])]
        cobj = cctx.compressobj(size=total)  # pledged size: the frame header carries it
        out = [cobj.compress(c) for c in chunks]
        out.append(cobj.flush())
        return [piece for piece in out if piece]
    except (zstandard.ZstdError, ValueError) as exc:
        raise EncodeError(f"zstd compression at level {level} failed: {exc}") from exc


def decompress_payload(data: memoryview, cap: int, expected: int | None = None) -> memoryview:
    """Decompress the one zstd frame of a payload, after checking its announced size against ``cap``
    and, for a hidden state with a shape, against the ``expected`` size (shape x itemsize). Both are
    known before any output exists, so a bomb costs nothing but its own bytes; the one-shot
    decompression then writes into a buffer of exactly that size (zstd refuses output beyond it)."""
    size = content_size(data)
    check_size("decompressed AVP payload", size, cap)
    if expected is not None and size != expected:
        raise DecodeError(
            f"AVP zstd frame announces {size} bytes but the tensor_shape needs {expected}: refused "
            "before decompressing"
        )
    dctx = _decompressor()
    try:
        if size == 0:
            # decompress() returns b"" for an empty frame without looking at what follows it.
            dobj = dctx.decompressobj()
            out = dobj.decompress(data)
            if not dobj.eof or dobj.unused_data or out:
                raise DecodeError("AVP zstd payload has data after its (empty) frame")
            return memoryview(b"")
        return memoryview(dctx.decompress(data, allow_extra_data=False))
    except zstandard.ZstdError as exc:
        raise DecodeError(f"AVP zstd payload is corrupt or has data after its one frame: {exc}") from exc


# --------------------------------------------------------------------------------------------------
# Encoding


def byte_view(obj: Any) -> memoryview:
    """A flat unsigned-byte view of a contiguous buffer (numpy arrays included)."""
    mv = obj if type(obj) is memoryview else memoryview(obj)
    if not mv.c_contiguous:
        raise EncodeError("AVP payload buffers must be C-contiguous")
    if mv.format != "B" or mv.ndim != 1:
        try:
            mv = mv.cast("B")
        except TypeError:  # e.g. ml_dtypes' bfloat16 format
            mv = np.asarray(obj).reshape(-1).view(np.uint8).data
    return mv


def array_dtype(arr: np.ndarray[Any, Any], requested: DataType | None) -> DataType:
    """The AVP dtype of a numpy array; ``requested`` is an explicitly asked-for dtype (or None)."""
    kind = arr.dtype.kind
    size = arr.dtype.itemsize
    if kind == "f" and size == 4:
        found = DataType.FLOAT32
    elif kind == "f" and size == 2:
        found = DataType.FLOAT16
    elif kind == "i" and size == 1:
        found = DataType.INT8
    elif size == 2 and (arr.dtype.name == "bfloat16" or (kind == "u" and requested is DataType.BFLOAT16)):
        found = DataType.BFLOAT16
    elif kind == "u" and size == 2:
        raise EncodeError("a uint16 array is taken as bfloat16 words only when asked: pass dtype='bfloat16'")
    else:
        raise EncodeError(
            f"AVP carries float32, float16, bfloat16 and int8 tensors, not {arr.dtype}; "
            "convert with .astype()"
        )
    if requested is not None and requested is not found:
        raise EncodeError(f"dtype={requested.name} was asked for but the array is {arr.dtype} ({found.name})")
    return found


def array_view(arr: np.ndarray[Any, Any]) -> memoryview:
    """Little-endian, C-contiguous bytes of an array (a copy only when it is neither)."""
    bo = arr.dtype.byteorder
    if bo == ">" or (bo == "=" and _BIG_ENDIAN_HOST):
        arr = arr.astype(arr.dtype.newbyteorder("<"))
    elif not arr.flags.c_contiguous:
        arr = np.ascontiguousarray(arr)
    return byte_view(arr)


def zstd_level(compress: bool | int) -> int | None:
    if compress is False or compress is None:
        return None
    if compress is True:
        return DEFAULT_ZSTD_LEVEL
    if not isinstance(compress, int):
        raise TypeError(f"compress must be a bool or a zstd level, not {type(compress).__name__}")
    return None if compress == 0 else compress


MetadataPB = avp_pb2.Metadata


def _metadata_prefix(md: AVPMetadata, dtype: DataType, shape: tuple[int, ...], compressed: bool) -> bytes:
    """Fields 1-14 serialized (deterministic: field order, defaults omitted, `extra` sorted by key)."""
    kw: dict[str, Any] = {
        "session_id": md.session_id,
        "source_agent_id": md.source_agent_id,
        "target_agent_id": md.target_agent_id,
        "model_id": md.model_id,
        "hidden_dim": md.hidden_dim,
        "num_layers": md.num_layers,
        "payload_type": int(md.payload_type),
        "dtype": int(dtype),
        "tensor_shape": shape,
        "mode": int(md.mode),
        "avp_map_id": md.avp_map_id,
        "extra": md.extra,
    }
    if compressed:
        kw["compression"] = "zstd"
    try:
        # Proto3 leaves out fields at their default value. The SDK serializes without
        # deterministic=True: identical bytes, except that an `extra` with two or more entries comes
        # out in upb's hash order there and sorted by key here.
        data: bytes = MetadataPB(**kw).SerializeToString(deterministic=True)
    except (TypeError, ValueError) as exc:
        raise EncodeError(f"invalid AVP metadata: {exc}") from exc
    return data


def metadata_bytes(
    md: AVPMetadata, dtype: DataType, shape: tuple[int, ...], compressed: bool, checksum: int
) -> bytes:
    """The Metadata message: fields 1-14 (cached per metadata object), then field 15 = checksum.

    Field 15 is the highest field number, so appending it gives exactly the bytes protobuf writes.
    """
    cache = md._wire
    if cache is None:
        cache = {}
        _set(md, "_wire", cache)
    key = (dtype, shape, compressed)
    prefix = cache.get(key)
    if prefix is None:
        prefix = _metadata_prefix(md, dtype, shape, compressed)
        if len(cache) >= 8:
            cache.clear()
        cache[key] = prefix
    if checksum >= 1 << 28:  # 15 of 16 CRCs: a 5-byte varint
        return prefix + b"\x78" + _checksum_varint5(checksum)
    out = bytearray(prefix)
    out.append(0x78)  # field 15, varint
    while checksum > 0x7F:
        out.append((checksum & 0x7F) | 0x80)
        checksum >>= 7
    out.append(checksum)
    return bytes(out)


def _checksum_varint5(checksum: int) -> bytes:
    """The varint of a checksum >= 2**28 (five bytes)."""
    return bytes(
        (
            (checksum & 0x7F) | 0x80,
            ((checksum >> 7) & 0x7F) | 0x80,
            ((checksum >> 14) & 0x7F) | 0x80,
            ((checksum >> 21) & 0x7F) | 0x80,
            checksum >> 28,
        )
    )


def frame_head(
    md: AVPMetadata, dtype: DataType, shape: tuple[int, ...], body_len: int, checksum: int
) -> bytes:
    """The 12-byte header and the metadata (fields 1-15) of an uncompressed frame with a payload
    of ``body_len`` bytes; EncodeError when payload_length overflows its u32 field.

    The encoder's fast path (``avp._fast_parts``). A stream of frames of one shape repeats all of
    it but the checksum: for the usual 5-byte checksum varint (15 of 16 CRCs) the bytes before it
    are kept with the metadata object (``_head``, for the last dtype, shape and size), so such a
    frame costs one concatenation. :func:`build_frame` makes the same bytes without it.
    """
    if checksum >= 1 << 28:
        last = md._head
        # Compared, not looked up: hashing an Enum member runs Python code (~0.15 us).
        if last is None or last[0] is not dtype or last[2] != body_len or last[1] != shape:
            tagged = metadata_bytes(md, dtype, shape, False, 0)[:-1]  # fields 1-14 and field 15's tag
            last = (dtype, shape, body_len, _header(md, False, len(tagged) + 5, body_len) + tagged)
            _set(md, "_head", last)  # one store: another thread sees the old head or the new one
        return last[3] + _checksum_varint5(checksum)
    meta = metadata_bytes(md, dtype, shape, False, checksum)
    return _header(md, False, len(meta), body_len) + meta


def _header(md: AVPMetadata, compressed: bool, meta_len: int, body_len: int) -> bytes:
    payload_length = meta_len + body_len
    if payload_length > MAX_PAYLOAD_LENGTH:
        raise EncodeError(
            f"AVP payload_length would be {payload_length} bytes; the u32 header field allows at most "
            f"{MAX_PAYLOAD_LENGTH}"
        )
    flags = (
        (FLAG_COMPRESSED if compressed else 0)
        | (FLAG_HAS_MAP if md.avp_map_id else 0)
        | (FLAG_KV_CACHE if md.payload_type is PayloadType.KV_CACHE else 0)
    )
    return HEADER_STRUCT.pack(MAGIC, VERSION, flags, payload_length, meta_len)


def shape_bytes(shape: tuple[int, ...], itemsize: int, cap: int) -> int:
    """Bytes needed by ``shape``; stops multiplying once past ``cap`` (any result > cap is a mismatch)."""
    if 0 in shape:
        return 0
    n = itemsize
    for d in shape:
        n *= d
        if n > cap:
            break
    return n


def check_shape(shape: tuple[int, ...], dtype: DataType, size: int, error: type[Exception]) -> None:
    if len(shape) == 1 and shape[0] * ITEMSIZE[dtype] == size:
        return
    if len(shape) > MAX_TENSOR_DIMS:
        raise error(
            f"AVP tensor_shape has {len(shape)} dimensions, more than {MAX_TENSOR_DIMS} (MAX_TENSOR_DIMS)"
        )
    need = shape_bytes(shape, ITEMSIZE[dtype], size)
    if need != size:
        needs = f"more than {size}" if need > size else str(need)
        raise error(f"AVP tensor_shape {shape} of {dtype.name} needs {needs} bytes, the payload has {size}")


def build_frame(
    chunks: list[memoryview],
    total: int,
    md: AVPMetadata,
    dtype: DataType,
    shape: tuple[int, ...],
    level: int | None,
) -> list[bytes | memoryview]:
    if shape and md.payload_type is PayloadType.HIDDEN_STATE:
        check_shape(shape, dtype, total, EncodeError)
    checksum = crc32_chunks(chunks)
    body: list[bytes | memoryview]
    if level is None:
        body = [c for c in chunks if len(c)]
        body_len = total
    else:
        packed = compress_chunks(chunks, total, level)
        body = list(packed)
        body_len = sum(len(p) for p in packed)
    # Not frame_head(): its cached template is the encoder's fast path, and this general path is
    # what tests/codecs/test_avp_differential.py holds it to.
    meta = metadata_bytes(md, dtype, shape, level is not None, checksum)
    body.insert(0, _header(md, level is not None, len(meta), body_len) + meta)
    return body


def resolve_metadata(metadata: AVPMetadata | None, fields: MetadataFields) -> AVPMetadata:
    if metadata is None:
        metadata = EMPTY_METADATA
    if fields:
        try:
            return replace(metadata, **cast(dict[str, Any], fields))
        except (TypeError, ValueError) as exc:
            raise EncodeError(f"invalid AVP metadata: {exc}") from exc
    return metadata


EMPTY_METADATA: Final = AVPMetadata()


def requested_dtype(fields: MetadataFields, md: AVPMetadata) -> DataType | None:
    """The dtype the caller asked for explicitly (a keyword, or a non-default metadata dtype)."""
    if "dtype" in fields or md.dtype is not DataType.FLOAT32:
        return md.dtype
    return None
