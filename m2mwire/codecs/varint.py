"""Byte-level primitives shared by the codecs: LEB128 varint streams and strict RFC 4648 base64.

Varints are unsigned LEB128 (7 bits per byte, least significant group first, high bit = more bytes
follow), one per value, concatenated. That is byte for byte the body of a protobuf *packed repeated
uint32* field, so packing and the common unpacking case run inside protobuf's C (upb) parser: no Python
call per value. Measured on the project's 2-core VM (benchmarks/bench_codecs.py), for 230 ids (a 1 KB
payload) protobuf packs in ~17 us against ~130 us for a vectorised numpy packer and unpacks (to a list)
in ~20 us against ~110 us; at 100 KB it is still 1.3-2x faster. Streams that protobuf would accept but
we must reject (varints longer than 5 bytes, values of 2**32 or more) never reach it: any stream holding
a varint of 4 or more bytes takes a vectorised numpy path that validates every varint and reports the
offending byte offset. Base64 and UTF-8 helpers live here too, so every codec shares one strict rule.
"""

from __future__ import annotations

import binascii
from collections.abc import Callable, Sequence
from typing import Any

from m2mwire.errors import DecodeError, EncodeError

_c_unpack: Callable[[bytes], list[int]] | None
c_detokenize: Callable[[str | bytes, int, list[bytes | None], int], bytes | None] | None
try:  # optional C helper (m2mwire/codecs/_varint.c), built when a compiler is available
    from m2mwire.codecs import _varint

    _c_unpack, c_detokenize = _varint.unpack, _varint.detokenize
except ImportError:  # pragma: no cover - depends on the build
    _c_unpack = c_detokenize = None

__all__ = [
    "MAX_VARINT_BYTES",
    "b64decode",
    "b64encode",
    "c_detokenize",
    "pack_varints",
    "unpack_varints",
    "unpack_varints_numpy",
    "utf8",
    "varint_error",
]

MAX_VARINT_BYTES = 5  # enough for any uint32; longer varints are rejected


# protobuf and numpy are imported on first use, not here: every text session imports this module for
# base64 and UTF-8, and only TokenNative varints (without the C helper) need either.
_Ids: Any = None  # the protobuf message class, built on first use by _ids()


def _ids() -> Any:
    global _Ids
    if _Ids is None:
        _Ids = _build_ids_message()
    return _Ids


def _build_ids_message() -> Any:
    # protobuf ships no type stubs here; the ignore is harmless where types-protobuf is installed.
    from google.protobuf import (  # type: ignore[import-untyped,unused-ignore]
        descriptor_pb2,
        descriptor_pool,
        message_factory,
    )

    # A private pool, so the global protobuf registry is left alone.
    proto = descriptor_pb2.FileDescriptorProto(
        name="m2mwire_varint.proto", package="m2mwire.varint", syntax="proto3"
    )
    message = proto.message_type.add(name="Ids")
    message.field.add(
        name="ids",
        number=1,
        type=descriptor_pb2.FieldDescriptorProto.TYPE_UINT32,
        label=descriptor_pb2.FieldDescriptorProto.LABEL_REPEATED,
    )  # proto3 packs repeated scalars by default
    pool = descriptor_pool.DescriptorPool()
    pool.Add(proto)
    return message_factory.GetMessageClass(pool.FindMessageTypeByName("m2mwire.varint.Ids"))


# translate() table: 1 for a continuation byte (high bit set), 0 otherwise.
_CONTINUATION = bytes(int(i >= 0x80) for i in range(256))
_THREE_CONTINUATIONS = b"\x01\x01\x01"


def _leb128(n: int) -> bytes:
    out = bytearray()
    while n >= 0x80:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def pack_varints(values: Sequence[int]) -> bytes:
    """Encode unsigned 32-bit ``values`` as concatenated LEB128 varints."""
    try:
        framed: bytes = (_Ids or _ids())(ids=values).SerializeToString()
    except (ValueError, TypeError) as exc:
        raise ValueError(f"varints hold unsigned 32-bit integers only: {exc}") from exc
    if not framed:  # no values: protobuf omits the field entirely
        return b""
    # framed = field tag (1 byte) + payload length (varint) + payload
    start = 1
    while framed[start] & 0x80:
        start += 1
    return framed[start + 1 :]


def unpack_varints(data: bytes) -> list[int]:
    """Decode concatenated LEB128 varints; raise :class:`DecodeError` for truncated, over-long (> 5 bytes)
    or >= 2**32 varints, naming the byte offset."""
    if not data:
        return []
    if _c_unpack is not None:
        try:
            values: list[int] = _c_unpack(data)
        except ValueError as exc:
            kind, offset, value = exc.args
            raise varint_error(kind, offset, value) from None
        return values
    return _unpack_varints_protobuf(data)


def varint_error(kind: str, offset: int, value: int) -> DecodeError:
    """The DecodeError for a bad varint reported by the C helper as (kind, offset, value)."""
    if kind == "truncated":
        return DecodeError(
            f"truncated varint: the stream ends inside the varint starting at byte offset {offset}"
        )
    if kind == "overlong":
        return DecodeError(f"over-long varint at byte offset {offset}: more than {MAX_VARINT_BYTES} bytes")
    return DecodeError(f"varint at byte offset {offset} is {value}, not below 2**32")


def _unpack_varints_protobuf(data: bytes) -> list[int]:
    """The pure-Python path (protobuf's C parser, numpy for rare long varints), used without _varint."""
    flags = data.translate(_CONTINUATION)
    if data[-1] & 0x80:
        start = len(flags.rstrip(b"\x01"))
        raise DecodeError(
            f"truncated varint: the stream ends inside the varint starting at byte offset {start}"
        )
    if _THREE_CONTINUATIONS in flags:
        # 4- and 5-byte varints only encode values >= 2**21 (or are padded): rare, so validate in numpy.
        return unpack_varints_numpy(data)
    from google.protobuf.message import (  # type: ignore[import-untyped,unused-ignore]
        DecodeError as _ProtobufDecodeError,
    )

    message = (_Ids or _ids())()
    try:
        message.ParseFromString(b"\x0a" + _leb128(len(data)) + data)
    except _ProtobufDecodeError as exc:  # unreachable: the stream was checked above
        raise DecodeError(f"invalid varint stream: {exc}") from exc
    result: list[int] = message.ids[:]
    return result


def unpack_varints_numpy(data: bytes) -> list[int]:
    """Vectorised LEB128 decoder that validates every varint (same contract as :func:`unpack_varints`)."""
    import numpy as np

    raw = np.frombuffer(data, dtype=np.uint8)
    if raw.size == 0:
        return []
    continuation = raw >= 0x80
    ends = np.flatnonzero(~continuation)
    if ends.size == 0 or ends[-1] != raw.size - 1:
        start = int(ends[-1]) + 1 if ends.size else 0
        raise DecodeError(
            f"truncated varint: the stream ends inside the varint starting at byte offset {start}"
        )
    starts = np.empty_like(ends)
    starts[0] = 0
    starts[1:] = ends[:-1] + 1
    lengths = ends - starts + 1
    too_long = np.flatnonzero(lengths > MAX_VARINT_BYTES)
    if too_long.size:
        offset = int(starts[too_long[0]])
        raise DecodeError(f"over-long varint at byte offset {offset}: more than {MAX_VARINT_BYTES} bytes")
    values = np.zeros(ends.size, dtype=np.uint64)
    for k in range(MAX_VARINT_BYTES):  # one vectorised step per byte position, not per value
        has = lengths > k
        if not has.any():
            break
        group = (raw[starts[has] + k] & 0x7F).astype(np.uint64)
        values[has] |= group << np.uint64(7 * k)
    too_big = np.flatnonzero(values >= np.uint64(1 << 32))
    if too_big.size:
        offset = int(starts[too_big[0]])
        raise DecodeError(f"varint at byte offset {offset} is {int(values[too_big[0]])}, not below 2**32")
    result: list[int] = values.tolist()
    return result


_B64_ALPHABET = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/")
_B64_INDEX = {c: i for i, c in enumerate("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/")}


def b64encode(data: bytes | bytearray | memoryview) -> str:
    """RFC 4648 standard base64 with ``=`` padding, as ASCII ``str``."""
    return binascii.b2a_base64(data, newline=False).decode("ascii")


def b64decode(text: str, *, what: str = "base64 payload", offset: int = 0) -> bytes:
    """Strict RFC 4648 standard base64: alphabet ``A-Z a-z 0-9 + /``, ``=`` padding required, no
    whitespace, canonical final symbol (unused bits zero), as the Rust reference's STANDARD engine.

    ``offset`` is where ``text`` starts in the wire, so error messages give wire positions.
    """
    if len(text) % 4 == 0:
        try:
            decoded = binascii.a2b_base64(text, strict_mode=True)
        except (binascii.Error, ValueError):
            pass
        else:
            if _canonical_tail(text):
                return decoded
    raise DecodeError(f"invalid {what}: {_diagnose(text, offset)}")


def _canonical_tail(text: str) -> bool:
    # At most two '=' (a2b_base64 tolerates more). Before "==" the last data symbol carries 2 used bits,
    # before "=" 4: the unused ones must be zero.
    padding = len(text) - len(text.rstrip("="))
    if padding == 0:
        return True
    if padding > 2 or len(text) <= padding:
        return False
    last = _B64_INDEX.get(text[-padding - 1])
    return last is not None and last & (0x0F if padding == 2 else 0x03) == 0


def _diagnose(text: str, offset: int) -> str:
    """Explain why ``text`` is not strict base64 (error path only)."""
    for i, char in enumerate(text):
        if char not in _B64_ALPHABET and char != "=":
            hint = " (URL-safe base64 is not accepted)" if char in "-_" else ""
            return f"character {char!r} at offset {offset + i} is not in the standard base64 alphabet{hint}"
    first_pad = text.find("=")
    if first_pad != -1:
        if text[first_pad:].strip("="):
            return f"'=' padding at offset {offset + first_pad} is followed by more data"
        if len(text) - first_pad > 2:
            return f"more than two '=' padding characters, from offset {offset + first_pad}"
        if len(text) % 4:
            return (
                f"length {len(text)} is not a multiple of 4 "
                f"(superfluous '=' padding at offset {offset + first_pad})"
            )
        return f"non-canonical final symbol at offset {offset + first_pad - 1} (its unused bits are not zero)"
    if len(text) % 4 == 1:
        return f"length {len(text)} leaves a single dangling symbol at offset {offset + len(text) - 1}"
    return (
        f"missing '=' padding: length {len(text)} is not a multiple of 4 "
        f"(data ends at offset {offset + len(text)})"
    )


def utf8(content: str) -> bytes:
    """``content`` as UTF-8; :class:`EncodeError` for lone surrogates (M2M messages must be UTF-8)."""
    try:
        return content.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise EncodeError(
            f"content is not valid Unicode text: lone surrogate {content[exc.start]!r} at index {exc.start}; "
            "M2M messages must be UTF-8"
        ) from None
