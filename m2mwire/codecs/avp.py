"""AVP (Agent Vector Protocol) frames, byte-compatible with the reference SDK ``avp`` 0.6.2.

A frame is a 12-byte header, protobuf metadata, then the tensor payload::

    41 56 | 01 | flags | payload_length u32 LE | metadata_length u32 LE | metadata | payload

``payload_length`` counts the metadata plus the payload as sent (compressed when flag bit 0 is set).
The encoder emits exactly what the SDK emits (same header, same flags, metadata fields in field order
with defaults omitted, CRC-32 of the uncompressed payload always in field 15, ``"zstd"`` in field 11
and one zstd frame carrying its content size when compressed). The decoder accepts everything the SDK
emits and is stricter than the SDK about malformed frames; docs/AVP.md lists every difference.

Zero copy: :func:`encode_parts` hands out ``[header + metadata, payload buffer...]`` without copying
the tensor; :func:`decode` returns the payload as a ``memoryview`` into the input (when it is not
compressed) and :meth:`AVPMessage.tensor` is an ``np.frombuffer`` view of it.
"""

from __future__ import annotations

import contextlib
import struct
import sys
import threading
import zlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields, replace
from enum import IntEnum
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, Final, NamedTuple, TypeAlias, TypedDict, Unpack, cast

import deflate
import numpy as np
import numpy.typing as npt
import zstandard

from m2mwire.codecs.limits import DEFAULT_LIMITS, Limits, check_size
from m2mwire.errors import ChecksumMismatch, DecodeError, EncodeError
from m2mwire.schemas import avp_pb2

if TYPE_CHECKING:
    from m2mwire.codecs.kvcache import KVCache

__all__ = [
    "CONTENT_TYPE",
    "DEFAULT_MAX_OUTPUT_BYTES",
    "DEFAULT_ZSTD_LEVEL",
    "FLAG_COMPRESSED",
    "FLAG_HAS_MAP",
    "FLAG_KV_CACHE",
    "FLAG_RESERVED_MASK",
    "HEADER_SIZE",
    "MAGIC",
    "MAX_PAYLOAD_LENGTH",
    "VERSION",
    "AVPHeader",
    "AVPMessage",
    "AVPMetadata",
    "BufferLike",
    "CommunicationMode",
    "DataType",
    "MetadataFields",
    "PayloadType",
    "bfloat16_to_float32",
    "crc32",
    "decode",
    "encode",
    "encode_hidden_state",
    "encode_hidden_state_parts",
    "encode_parts",
    "float32_to_bfloat16",
    "frame_length",
    "parse_header",
    "payload_size",
]

MAGIC: Final = b"AV"
VERSION: Final = 1
HEADER_SIZE: Final = 12
FLAG_COMPRESSED: Final = 0x01
FLAG_HAS_MAP: Final = 0x02
FLAG_KV_CACHE: Final = 0x04
FLAG_RESERVED_MASK: Final = 0xF8
CONTENT_TYPE: Final = "application/avp+binary"
MAX_PAYLOAD_LENGTH: Final = 0xFFFF_FFFF
#: Default cap on a decompressed payload. KV caches are large (64 MiB for a 32-layer, 512-token fp16
#: cache; ~390 MB for a 7B model), so the generic ``Limits.max_output_bytes`` (16 MiB) does not fit.
DEFAULT_MAX_OUTPUT_BYTES: Final = 1 << 30
#: zstd level used for ``compress=True`` (the SDK's CompressionLevel.BALANCED).
DEFAULT_ZSTD_LEVEL: Final = 3

BufferLike: TypeAlias = bytes | bytearray | memoryview
PayloadLike: TypeAlias = bytes | bytearray | memoryview | np.ndarray[Any, Any]

_HEADER = struct.Struct("<2sBBII")
_U32 = struct.Struct("<I")
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
        return _ITEMSIZE[self]

    @property
    def storage_dtype(self) -> np.dtype[Any]:
        """The little-endian numpy dtype a payload is viewed as (bfloat16 as raw ``uint16`` words)."""
        return _STORAGE_DTYPES[self]

    @classmethod
    def parse(cls, value: DataType | int | str) -> DataType:
        """``DataType.FLOAT16``, ``1``, ``"float16"``, ``"fp16"``, ``"bf16"``, ``"BFLOAT16"`` ..."""
        if isinstance(value, str):
            key = value.strip().lower()
            if key in _DTYPE_NAMES:
                return _DTYPE_NAMES[key]
            raise ValueError(f"unknown AVP dtype {value!r}; expected one of float32, float16, bfloat16, int8")
        return cls(value)


_ITEMSIZE: Final = (4, 2, 2, 1)
_STORAGE_DTYPES: Final[tuple[np.dtype[Any], ...]] = (
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
_PAYLOAD_TYPES: Final = tuple(PayloadType)
_DATA_TYPES: Final = tuple(DataType)
_MODES: Final = (CommunicationMode.LATENT, CommunicationMode.JSON)


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
    # Serialized fields 1-14 by (dtype, tensor_shape, compressed): see _metadata_bytes().
    _wire: dict[tuple[int, tuple[int, ...], bool], bytes] | None = field(
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


class AVPHeader(NamedTuple):
    """The fixed 12-byte header (magic and version are validated, so not kept)."""

    version: int
    flags: int
    payload_length: int
    metadata_length: int

    @property
    def compressed(self) -> bool:
        return bool(self.flags & FLAG_COMPRESSED)

    @property
    def has_map(self) -> bool:
        return bool(self.flags & FLAG_HAS_MAP)

    @property
    def is_kv_cache(self) -> bool:
        return bool(self.flags & FLAG_KV_CACHE)

    @property
    def frame_length(self) -> int:
        """Bytes in the whole frame: 12 + payload_length."""
        return HEADER_SIZE + self.payload_length


_new_metadata = object.__new__
_set = object.__setattr__
_tuple_new = tuple.__new__
_NO_EXTRA: Final[Mapping[str, str]] = MappingProxyType({})


class AVPMessage:
    """A decoded frame: ``header``, ``metadata`` (built on first access) and ``payload``.

    ``payload`` is a ``memoryview``: a zero-copy slice of the input when the frame was not
    compressed, otherwise a view of the decompressed bytes. ``raw`` is the whole frame (a view of
    the input, trailing bytes excluded), to forward unchanged. ``payload_type``, ``dtype`` and
    ``tensor_shape`` are available without building the whole :class:`AVPMetadata`.
    """

    __slots__ = (
        "_checksum",
        "_metadata",
        "_pb",
        "dtype",
        "header",
        "payload",
        "payload_type",
        "raw",
        "tensor_shape",
    )

    def __init__(
        self,
        raw: memoryview,
        header: AVPHeader,
        payload: memoryview,
        pb: avp_pb2.Metadata,
        payload_type: PayloadType,
        dtype: DataType,
        tensor_shape: tuple[int, ...],
        checksum: int | None,
    ) -> None:
        self.raw = raw  # the whole frame, as received (a view; forward it unchanged)
        self.header = header
        self.payload = payload
        self.payload_type = payload_type
        self.dtype = dtype
        self.tensor_shape = tensor_shape
        # Fields 1-14 are read from pb, field 15 from here: a cached pb serves every frame of a
        # stream, with only the checksum differing (see _decode_known).
        self._pb = pb
        self._checksum = checksum
        self._metadata: AVPMetadata | None = None

    @property
    def metadata(self) -> AVPMetadata:
        md = self._metadata
        if md is None:
            pb = self._pb
            # Every value is already validated and of its declared type: skip __init__'s checks.
            md = _new_metadata(AVPMetadata)
            _set(md, "session_id", pb.session_id)
            _set(md, "source_agent_id", pb.source_agent_id)
            _set(md, "target_agent_id", pb.target_agent_id)
            _set(md, "model_id", pb.model_id)
            _set(md, "hidden_dim", pb.hidden_dim)
            _set(md, "num_layers", pb.num_layers)
            _set(md, "payload_type", self.payload_type)
            _set(md, "dtype", self.dtype)
            _set(md, "tensor_shape", self.tensor_shape)
            _set(md, "mode", _MODES[pb.mode])
            _set(md, "compression", pb.compression if pb.HasField("compression") else None)
            _set(md, "avp_map_id", pb.avp_map_id)
            extra = pb.extra
            _set(md, "extra", MappingProxyType(dict(extra)) if extra else _NO_EXTRA)
            _set(md, "payload_checksum", self._checksum)
            _set(md, "_wire", None)
            self._metadata = md
        return md

    @property
    def frame_length(self) -> int:
        return self.header.frame_length

    def tensor(self) -> npt.NDArray[Any]:
        """The hidden-state payload as a numpy view (no copy), shaped by ``tensor_shape`` if present.

        bfloat16 comes back as raw ``uint16`` words (see :meth:`to_float32`). The array is read-only
        when the input was ``bytes``.
        """
        if self.payload_type is not PayloadType.HIDDEN_STATE:
            raise ValueError("this frame carries a KV cache: use kv_cache()")
        dt = _STORAGE_DTYPES[self.dtype]
        payload = self.payload
        if len(payload) % dt.itemsize:
            raise DecodeError(
                f"AVP payload of {len(payload)} bytes is not a whole number of {self.dtype.name} "
                f"elements ({dt.itemsize} bytes each)"
            )
        arr = np.frombuffer(payload, dtype=dt)
        if self.tensor_shape:
            return arr.reshape(self.tensor_shape)
        return arr

    @property
    def array(self) -> npt.NDArray[Any]:
        """Same as :meth:`tensor`."""
        return self.tensor()

    def to_float32(self) -> npt.NDArray[np.float32]:
        """The hidden state converted to float32 (a new array; bfloat16 words are widened exactly)."""
        arr = self.tensor()
        if self.dtype is DataType.BFLOAT16:
            return bfloat16_to_float32(arr)
        return arr.astype(np.float32)

    def kv_cache(self) -> KVCache:
        """The KV-cache payload as per-layer (K, V) views; validates the 17-byte KV header."""
        from m2mwire.codecs.kvcache import parse_kv_payload

        if self.payload_type is not PayloadType.KV_CACHE:
            raise ValueError("this frame carries a hidden state: use tensor()")
        return parse_kv_payload(self.payload, expected_dtype=self.dtype)

    def __repr__(self) -> str:
        return (
            f"AVPMessage({self.payload_type.name}, {self.dtype.name}, shape={self.tensor_shape}, "
            f"payload={len(self.payload)} bytes, compressed={self.header.compressed}, "
            f"model_id={self._pb.model_id!r})"
        )


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
# CRC-32: libdeflate's (the `deflate` package), the same function as zlib.crc32 at ~4x its speed

#: Below this many bytes zlib.crc32 is called instead: its call overhead is lower (~100 ns vs
#: ~250 ns for an empty buffer; the two break even between 48 and 128 bytes).
_ZLIB_CRC_BELOW: Final = 64
_zlib_crc32 = zlib.crc32
_deflate_crc32 = deflate.crc32
_SIZED_BY_NBYTES: Final = (memoryview, np.ndarray, np.generic)  # len(): items, rows or none


def crc32(data: BufferLike | np.ndarray[Any, Any], value: int = 0) -> int:
    """``zlib.crc32(data, value)``, computed by libdeflate (~8 GB/s vs zlib's ~2 GB/s).

    ``data`` is any C-contiguous buffer (numpy arrays included); ``value`` is the CRC of the bytes
    before it, to checksum a stream piece by piece. A non-contiguous buffer raises what zlib raises
    (``BufferError`` or ``ValueError``).
    """
    size = data.nbytes if isinstance(data, _SIZED_BY_NBYTES) else len(data)
    if size < _ZLIB_CRC_BELOW:
        return _zlib_crc32(data, value)  # type: ignore[arg-type]  # ndarray: a Buffer in numpy's 3.12+ stubs
    return _deflate_crc32(data, value)


def _crc_chunks(chunks: Sequence[memoryview]) -> int:
    crc = 0
    for c in chunks:
        crc = crc32(c, crc)
    return crc


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


def _compress(chunks: Sequence[memoryview], total: int, level: int) -> list[bytes]:
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


def _content_size(data: BufferLike) -> int:
    """The decompressed size a zstd frame announces in its header (read without decompressing)."""
    try:
        size: int = zstandard.frame_content_size(data)
    except zstandard.ZstdError as exc:
        raise DecodeError(f"AVP payload is flagged compressed but is not a zstd frame: {exc}") from exc
    if size < 0:
        raise DecodeError(
            "AVP zstd frame has no content size in its header (the SDK cannot decode such frames either); "
            "compress with ZstdCompressor.compress() or a pledged size"
        )
    return size


def _decompress(data: memoryview, cap: int, expected: int | None = None) -> memoryview:
    """Decompress the one zstd frame of a payload, after checking its announced size against ``cap``
    and, for a hidden state with a shape, against the ``expected`` size (shape x itemsize). Both are
    known before any output exists, so a bomb costs nothing but its own bytes; the one-shot
    decompression then writes into a buffer of exactly that size (zstd refuses output beyond it)."""
    size = _content_size(data)
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


def _byte_view(obj: Any) -> memoryview:
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


def _array_dtype(arr: np.ndarray[Any, Any], requested: DataType | None) -> DataType:
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


def _array_view(arr: np.ndarray[Any, Any]) -> memoryview:
    """Little-endian, C-contiguous bytes of an array (a copy only when it is neither)."""
    bo = arr.dtype.byteorder
    if bo == ">" or (bo == "=" and _BIG_ENDIAN_HOST):
        arr = arr.astype(arr.dtype.newbyteorder("<"))
    elif not arr.flags.c_contiguous:
        arr = np.ascontiguousarray(arr)
    return _byte_view(arr)


def _level(compress: bool | int) -> int | None:
    if compress is False or compress is None:
        return None
    if compress is True:
        return DEFAULT_ZSTD_LEVEL
    if not isinstance(compress, int):
        raise TypeError(f"compress must be a bool or a zstd level, not {type(compress).__name__}")
    return None if compress == 0 else compress


_PB = avp_pb2.Metadata


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
        data: bytes = _PB(**kw).SerializeToString(deterministic=True)
    except (TypeError, ValueError) as exc:
        raise EncodeError(f"invalid AVP metadata: {exc}") from exc
    return data


def _metadata_bytes(
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
        return prefix + bytes(
            (
                0x78,  # field 15, varint
                (checksum & 0x7F) | 0x80,
                ((checksum >> 7) & 0x7F) | 0x80,
                ((checksum >> 14) & 0x7F) | 0x80,
                ((checksum >> 21) & 0x7F) | 0x80,
                checksum >> 28,
            )
        )
    out = bytearray(prefix)
    out.append(0x78)
    while checksum > 0x7F:
        out.append((checksum & 0x7F) | 0x80)
        checksum >>= 7
    out.append(checksum)
    return bytes(out)


def _shape_bytes(shape: tuple[int, ...], itemsize: int, cap: int) -> int:
    """Bytes needed by ``shape``; stops multiplying once past ``cap`` (any result > cap is a mismatch)."""
    if 0 in shape:
        return 0
    n = itemsize
    for d in shape:
        n *= d
        if n > cap:
            break
    return n


def _check_shape(shape: tuple[int, ...], dtype: DataType, size: int, error: type[Exception]) -> None:
    if len(shape) == 1 and shape[0] * _ITEMSIZE[dtype] == size:
        return
    need = _shape_bytes(shape, _ITEMSIZE[dtype], size)
    if need != size:
        needs = f"more than {size}" if need > size else str(need)
        raise error(f"AVP tensor_shape {shape} of {dtype.name} needs {needs} bytes, the payload has {size}")


def _build(
    chunks: list[memoryview],
    total: int,
    md: AVPMetadata,
    dtype: DataType,
    shape: tuple[int, ...],
    level: int | None,
) -> list[bytes | memoryview]:
    if shape and md.payload_type is PayloadType.HIDDEN_STATE:
        _check_shape(shape, dtype, total, EncodeError)
    checksum = _crc_chunks(chunks)
    body: list[bytes | memoryview]
    if level is None:
        body = [c for c in chunks if len(c)]
        body_len = total
    else:
        packed = _compress(chunks, total, level)
        body = list(packed)
        body_len = sum(len(p) for p in packed)
    meta = _metadata_bytes(md, dtype, shape, level is not None, checksum)
    payload_length = len(meta) + body_len
    if payload_length > MAX_PAYLOAD_LENGTH:
        raise EncodeError(
            f"AVP payload_length would be {payload_length} bytes; the u32 header field allows at most "
            f"{MAX_PAYLOAD_LENGTH}"
        )
    flags = (
        (FLAG_COMPRESSED if level is not None else 0)
        | (FLAG_HAS_MAP if md.avp_map_id else 0)
        | (FLAG_KV_CACHE if md.payload_type is PayloadType.KV_CACHE else 0)
    )
    head = _HEADER.pack(MAGIC, VERSION, flags, payload_length, len(meta)) + meta
    body.insert(0, head)
    return body


def _resolve_metadata(metadata: AVPMetadata | None, fields: MetadataFields) -> AVPMetadata:
    if metadata is None:
        metadata = _EMPTY_METADATA
    if fields:
        try:
            return replace(metadata, **cast(dict[str, Any], fields))
        except (TypeError, ValueError) as exc:
            raise EncodeError(f"invalid AVP metadata: {exc}") from exc
    return metadata


_EMPTY_METADATA: Final = AVPMetadata()


def _requested_dtype(fields: MetadataFields, md: AVPMetadata) -> DataType | None:
    """The dtype the caller asked for explicitly (a keyword, or a non-default metadata dtype)."""
    if "dtype" in fields or md.dtype is not DataType.FLOAT32:
        return md.dtype
    return None


_FAST_DTYPES: Final[dict[np.dtype[Any], DataType]] = {
    np.dtype("<f4"): DataType.FLOAT32,
    np.dtype("<f2"): DataType.FLOAT16,
    np.dtype("i1"): DataType.INT8,
}


def _prepare(
    payload: PayloadLike, md: AVPMetadata, requested: DataType | None
) -> tuple[list[memoryview], int, DataType, tuple[int, ...]]:
    if isinstance(payload, np.ndarray) and md.payload_type is PayloadType.HIDDEN_STATE:
        fast = _FAST_DTYPES.get(payload.dtype)
        if fast is not None and (requested is None or requested is fast):
            with contextlib.suppress(TypeError):  # TypeError: not C-contiguous
                view = payload.data.cast("B")  # contiguous little-endian: no copy
                return [view], len(view), fast, md.tensor_shape or payload.shape
        dtype = _array_dtype(payload, requested)
        view = _array_view(payload)
        return [view], len(view), dtype, md.tensor_shape or payload.shape
    if isinstance(payload, str):
        raise TypeError("AVP payloads are bytes-like or numpy arrays, not str")
    view = _byte_view(payload)
    return [view], len(view), md.dtype, md.tensor_shape


def _fast_parts(payload: Any, md: AVPMetadata) -> list[bytes | memoryview] | None:
    """The hot path in a few lines: a contiguous little-endian float32/float16/int8 array and a
    HIDDEN_STATE metadata object, no keyword overrides, no compression. None when it does not apply."""
    if type(payload) is not np.ndarray or md.payload_type is not PayloadType.HIDDEN_STATE:
        return None
    dtype = _FAST_DTYPES.get(payload.dtype)
    if dtype is None or (md.dtype is not dtype and md.dtype is not DataType.FLOAT32):
        return None
    try:
        view = payload.data.cast("B")
    except TypeError:  # not C-contiguous
        return None
    n = len(view)
    shape = md.tensor_shape
    if shape:
        _check_shape(shape, dtype, n, EncodeError)
    else:
        shape = payload.shape
    crc = crc32(view)
    meta = _metadata_bytes(md, dtype, shape, False, crc)
    payload_length = len(meta) + n
    if payload_length > MAX_PAYLOAD_LENGTH:
        return None  # the general path raises
    head = (
        _HEADER.pack(MAGIC, VERSION, FLAG_HAS_MAP if md.avp_map_id else 0, payload_length, len(meta)) + meta
    )
    return [head, view] if n else [head]


def encode_parts(
    payload: PayloadLike,
    metadata: AVPMetadata | None = None,
    *,
    compress: bool | int = False,
    **fields: Unpack[MetadataFields],
) -> list[bytes | memoryview]:
    """Encode a frame as buffers to write in order: ``[header + metadata, payload...]``, no tensor copy.

    ``payload`` is bytes-like or a numpy array (float32, float16, int8, bfloat16 as an ml_dtypes
    array or as uint16 words with ``dtype="bfloat16"``). For an array, dtype comes from the array
    and ``tensor_shape`` defaults to its shape. ``compress`` is False, True (zstd level 3) or a
    zstd level. Keyword fields override those of ``metadata``.

    The payload buffer is referenced, not copied: do not modify it until the parts are written.
    """
    if metadata is not None and not fields and not compress:
        parts = _fast_parts(payload, metadata)
        if parts is not None:
            return parts
    md = _resolve_metadata(metadata, fields)
    chunks, total, dtype, shape = _prepare(payload, md, _requested_dtype(fields, md))
    return _build(chunks, total, md, dtype, shape, _level(compress))


def encode(
    payload: PayloadLike,
    metadata: AVPMetadata | None = None,
    *,
    compress: bool | int = False,
    **fields: Unpack[MetadataFields],
) -> bytes:
    """Encode a frame as one ``bytes`` object (the tensor is copied once); see :func:`encode_parts`."""
    if metadata is not None and not fields and not compress:
        parts = _fast_parts(payload, metadata)
        if parts is not None:
            return b"".join(parts)
    return b"".join(encode_parts(payload, metadata, compress=compress, **fields))


def encode_hidden_state_parts(
    array: np.ndarray[Any, Any],
    metadata: AVPMetadata | None = None,
    *,
    compress: bool | int = False,
    **fields: Unpack[MetadataFields],
) -> list[bytes | memoryview]:
    """:func:`encode_parts` for a hidden-state array; ``hidden_dim`` defaults to ``array.shape[-1]``."""
    if not isinstance(array, np.ndarray):
        raise TypeError(f"encode_hidden_state takes a numpy array, not {type(array).__name__}")
    if metadata is not None and metadata.hidden_dim and not fields and not compress:
        parts = _fast_parts(array, metadata)
        if parts is not None:
            return parts
    md = _resolve_metadata(metadata, fields)
    if md.payload_type is not PayloadType.HIDDEN_STATE:
        raise EncodeError("encode_hidden_state() writes HIDDEN_STATE frames; use encode_kv_cache() for KV")
    if not md.hidden_dim and array.ndim:
        md = replace(md, hidden_dim=int(array.shape[-1]))
    chunks, total, dtype, shape = _prepare(array, md, _requested_dtype(fields, md))
    return _build(chunks, total, md, dtype, shape, _level(compress))


def encode_hidden_state(
    array: np.ndarray[Any, Any],
    metadata: AVPMetadata | None = None,
    *,
    compress: bool | int = False,
    **fields: Unpack[MetadataFields],
) -> bytes:
    """Encode a hidden-state array as one frame; see :func:`encode_hidden_state_parts`."""
    return b"".join(encode_hidden_state_parts(array, metadata, compress=compress, **fields))


# --------------------------------------------------------------------------------------------------
# Decoding


def _input_view(data: Any) -> memoryview:
    if type(data) is bytes or type(data) is bytearray:
        return memoryview(data)
    if isinstance(data, str):
        raise TypeError("AVP frames are bytes-like, not str")
    mv = data if isinstance(data, memoryview) else memoryview(data)
    if not mv.c_contiguous:
        raise DecodeError("AVP input buffer is not contiguous")
    if mv.format != "B" or mv.ndim != 1:
        mv = mv.cast("B")
    return mv


def parse_header(data: BufferLike) -> AVPHeader:
    """Validate and parse the 12-byte header (the first 12 bytes of ``data``)."""
    return _parse_header(_input_view(data))


def _parse_header(mv: memoryview) -> AVPHeader:
    if len(mv) < HEADER_SIZE:
        raise DecodeError(f"AVP message too short: {len(mv)} bytes, the header alone is {HEADER_SIZE}")
    fields = _HEADER.unpack_from(mv)
    magic, version, flags, payload_length, metadata_length = fields
    if magic != MAGIC:
        raise DecodeError(f"not an AVP frame: magic bytes are {magic.hex()}, expected 4156 ('AV')")
    if version != VERSION:
        raise DecodeError(f"unsupported AVP version {version}; this decoder reads version {VERSION}")
    if flags & FLAG_RESERVED_MASK:
        raise DecodeError(f"AVP flags 0x{flags:02x} set reserved bits 3-7")
    if metadata_length > payload_length:
        raise DecodeError(
            f"AVP metadata_length {metadata_length} is larger than payload_length {payload_length}"
        )
    return _tuple_new(AVPHeader, fields[1:])


def frame_length(data: BufferLike) -> int:
    """Total bytes of the frame that starts ``data`` (12 + payload_length), from its first 12 bytes.

    For stream framing: read 12 bytes, call this, read the rest. The header is validated.
    """
    return parse_header(data).frame_length


def payload_size(data: BufferLike) -> int:
    """The size of a frame's payload once decompressed, read from the headers only.

    For an uncompressed frame it is the payload as sent; for a compressed one it is the size the zstd
    frame announces (which :func:`decode` holds it to). A session checks this against its negotiated
    max_payload on both sides, so sender and receiver bound the same quantity.
    """
    mv = _input_view(data)
    header = _parse_header(mv)
    meta_end = HEADER_SIZE + header.metadata_length
    end = HEADER_SIZE + header.payload_length
    if not header.flags & FLAG_COMPRESSED:
        return end - meta_end
    return _content_size(mv[meta_end:end])


def decode(
    data: BufferLike,
    *,
    limits: Limits | None = None,
    max_output_bytes: int | None = None,
    allow_trailing: bool = False,
) -> AVPMessage:
    """Decode and validate one frame.

    ``data`` must hold exactly one frame; with ``allow_trailing=True`` bytes after it are ignored
    (use :func:`frame_length` to find them). The CRC-32 is verified whenever field 15 is present.
    A compressed payload may decompress to at most ``max_output_bytes`` (default 1 GiB), checked
    against the zstd header before anything is allocated; ``limits.max_message_bytes`` caps the
    metadata section. Malformed input raises :class:`DecodeError` (:class:`ChecksumMismatch` for a
    bad CRC); a limit raises :class:`LimitExceeded`.
    """
    mv = memoryview(data) if type(data) is bytes else _input_view(data)
    known = _decode_known(mv) if limits is None and not allow_trailing else None
    if type(known) is AVPMessage:
        return known
    header = _parse_header(mv)
    end = HEADER_SIZE + header.payload_length
    size = len(mv)
    if size < end:
        raise DecodeError(f"AVP message truncated: {size} bytes, the header announces {end}")
    if size > end and not allow_trailing:
        raise DecodeError(
            f"AVP message has {size - end} bytes after its end ({end} bytes); "
            "pass allow_trailing=True or split with frame_length()"
        )
    meta_end = HEADER_SIZE + header.metadata_length
    if header.metadata_length > (limits or DEFAULT_LIMITS).max_message_bytes:
        check_size("AVP metadata", header.metadata_length, (limits or DEFAULT_LIMITS).max_message_bytes)
    pb = _PB()
    try:
        pb.ParseFromString(mv[HEADER_SIZE:meta_end])
    except Exception as exc:  # google.protobuf.message.DecodeError (upb may raise others on junk)
        raise DecodeError(f"AVP metadata is not a valid protobuf Metadata message: {exc}") from exc
    pt = pb.payload_type
    dt = pb.dtype
    if not 0 <= pt <= 1:
        raise DecodeError(f"unknown AVP payload_type {pt}")
    if not 0 <= dt <= 3:
        raise DecodeError(f"unknown AVP dtype {dt}")
    if not 0 <= pb.mode <= 1:
        raise DecodeError(f"unknown AVP mode {pb.mode}")
    flags = header.flags
    if bool(flags & FLAG_KV_CACHE) != (pt == 1):
        raise DecodeError(
            f"AVP KV-cache flag is {'set' if flags & FLAG_KV_CACHE else 'clear'} but payload_type is "
            f"{_PAYLOAD_TYPES[pt].name}"
        )
    map_id = pb.avp_map_id
    if bool(flags & FLAG_HAS_MAP) != bool(map_id):
        raise DecodeError(
            f"AVP has-map flag is {'set' if flags & FLAG_HAS_MAP else 'clear'} but avp_map_id is {map_id!r}"
        )
    body = mv[meta_end:end]
    if flags & FLAG_COMPRESSED:
        if pb.HasField("compression") and pb.compression != "zstd":
            raise DecodeError(f"unsupported AVP compression {pb.compression!r} (only zstd is defined)")
        cap = DEFAULT_MAX_OUTPUT_BYTES if max_output_bytes is None else max_output_bytes
        expected = None
        if pt == 0 and pb.tensor_shape:  # a hidden state's size is its shape times its itemsize
            expected = _shape_bytes(tuple(pb.tensor_shape), _ITEMSIZE[dt], cap)
            if expected > cap:
                check_size("AVP tensor_shape", expected, cap)
        payload = _decompress(body, cap, expected)
    else:
        if pb.compression:
            raise DecodeError(
                f"AVP metadata says compression={pb.compression!r} but the compressed flag is clear"
            )
        payload = body
    expected = pb.payload_checksum
    checksum = None
    if expected or pb.HasField("payload_checksum"):  # a non-zero value is present: skip the call
        actual = crc32(payload) if len(payload) < _ZLIB_CRC_BELOW else _deflate_crc32(payload)
        if actual != expected:
            raise _checksum_mismatch(expected, actual)
        checksum = expected
    dims = pb.tensor_shape
    ndims = len(dims)
    if ndims == 0:
        shape: tuple[int, ...] = ()
    elif ndims == 1:  # the usual hidden state: checked without the general helper's calls
        shape = (dims[0],)
        if pt == 0 and shape[0] * _ITEMSIZE[dt] != len(payload):
            _check_shape(shape, _DATA_TYPES[dt], len(payload), DecodeError)
    else:
        shape = tuple(dims[:])
        if pt == 0:
            _check_shape(shape, _DATA_TYPES[dt], len(payload), DecodeError)
    msg = AVPMessage(
        mv if size == end else mv[:end],
        header,
        payload,
        pb,
        _PAYLOAD_TYPES[pt],
        _DATA_TYPES[dt],
        shape,
        checksum,
    )
    if type(known) is bytes and not flags & FLAG_COMPRESSED:
        _learn(known, mv, msg)
    return msg


def _checksum_mismatch(expected: int, actual: int) -> ChecksumMismatch:
    return ChecksumMismatch(
        f"AVP payload checksum mismatch: metadata says 0x{expected:08x}, payload has 0x{actual:08x}"
    )


# A stream of frames (one sender's hidden states) repeats the same header and metadata, except the
# CRC in payload_checksum: field 15, the highest number, so serializers (ours, the SDK's) write it
# last. Once a header + metadata prefix has been decoded twice and the prefix parses on its own,
# it is kept as a template: later frames with that exact prefix skip protobuf parsing and
# validation, and only the trailing checksum is read and verified. This is exact, not a guess: a
# prefix that parses on its own ends on a field boundary, so prefix + field 15 parses as the
# prefix's fields followed by field 15. Anything else (compressed, trailing bytes, custom limits,
# another layout) takes the full path.


class _Template(NamedTuple):
    header: AVPHeader
    pb: avp_pb2.Metadata  # the prefix parsed: fields 1-14 of every frame that shares it (never mutated)
    payload_type: PayloadType
    dtype: DataType
    tensor_shape: tuple[int, ...]
    frame_length: int


# A key whose prefix does not parse on its own (frame_length -1 never matches a frame).
_NOT_A_PREFIX: Final = _Template(
    AVPHeader(VERSION, 0, 0, 0), _PB(), PayloadType.HIDDEN_STATE, DataType.FLOAT32, (), -1
)
_TEMPLATES: dict[bytes, _Template] = {}
_SEEN: dict[bytes, None] = {}  # keys decoded once; apart, so that churn there evicts no template
_SLOTS: Final = 256  # per dict; a full one is cleared (memory stays bounded whatever peers send)
_CHECKSUM_TAG: Final = 15 << 3  # field 15, wire type 0 (varint)


def _decode_known(mv: memoryview) -> AVPMessage | bytes | None:
    """A frame decoded from its template; else the template key to learn (bytes), or None when
    the metadata does not end with payload_checksum."""
    size = len(mv)
    if size < HEADER_SIZE:
        return None
    meta_end = HEADER_SIZE + _U32.unpack_from(mv, 8)[0]
    if meta_end > size or meta_end < HEADER_SIZE + 2:
        return None
    # The checksum varint, read backwards: a last byte < 0x80, at most 4 continuation bytes
    # (>= 0x80) before it, and the tag before those.
    i = meta_end - 1
    value = mv[i]
    if value >= 0x80:
        return None
    i -= 1
    low = max(meta_end - 5, HEADER_SIZE)
    while i >= low and (b := mv[i]) >= 0x80:
        value = (value << 7) | (b & 0x7F)
        i -= 1
    if i < HEADER_SIZE or mv[i] != _CHECKSUM_TAG or value > 0xFFFF_FFFF:
        return None
    key = mv[:i].tobytes()
    t = _TEMPLATES.get(key)
    if t is None or t.frame_length != size:
        return key
    payload = mv[meta_end:]
    actual = crc32(payload) if len(payload) < _ZLIB_CRC_BELOW else _deflate_crc32(payload)
    if actual != value:
        raise _checksum_mismatch(value, actual)
    return AVPMessage(mv, t.header, payload, t.pb, t.payload_type, t.dtype, t.tensor_shape, value)


def _learn(key: bytes, mv: memoryview, msg: AVPMessage) -> None:
    """After a full decode of a frame whose template key is ``key``: note it the first time, make
    the template the second (a stream whose metadata changes every frame never pays for one)."""
    if key in _TEMPLATES:
        return  # _NOT_A_PREFIX
    if key not in _SEEN:
        if len(_SEEN) >= _SLOTS:
            _SEEN.clear()
        _SEEN[key] = None
        return
    _SEEN.pop(key, None)
    pb = _PB()
    try:
        pb.ParseFromString(mv[HEADER_SIZE : len(key)])
    except Exception:  # the last 0x78 byte was inside another field: no field boundary there
        template = _NOT_A_PREFIX
    else:
        template = _Template(msg.header, pb, msg.payload_type, msg.dtype, msg.tensor_shape, len(mv))
    if len(_TEMPLATES) >= _SLOTS:
        _TEMPLATES.clear()
    _TEMPLATES[key] = template
