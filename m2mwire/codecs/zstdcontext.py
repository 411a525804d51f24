"""Session-context zstd: one zstd stream per direction that lives as long as the session.

Each message is compressed with every earlier message of the same direction as history and then
flushed (``ZSTD_e_flush``: the block ends, so the receiver can decode it at once); the frame itself
never ends. A message's *payload* is::

    CRC-32 of the decompressed bytes (4 bytes, big-endian)  |  the zstd bytes flushed for it

The first payload of a context starts its zstd bytes with the frame header (magic ``28 B5 2F FD``);
the later ones are blocks of the same frame. Binary form: ``0x5A`` (``Z``) + payload; text form:
``#ZS|`` + padded standard base64 of the payload. docs/CODECS.md section 8 is the normative text.

Why the checksum: a context cannot skip or reorder messages, and zstd has no per-block check, so a
corrupted, missing or reordered message could otherwise decode "successfully" to the wrong text;
with it every such case is a :class:`DecodeError`.

Decompression is bounded: input is fed in slices small enough that even the densest possible zstd
blocks (4 input bytes -> one 128 KiB block) cannot produce more than the remaining budget plus
:data:`OUTPUT_SLACK` plus one block, so a bomb is refused after allocating at most
``limit + OUTPUT_SLACK + 128 KiB`` bytes of output (zstd's own buffers are the window's).
"""

from __future__ import annotations

import functools
import hashlib
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Final, Generic, TypeVar

from m2mwire.codecs.checksum import crc32
from m2mwire.codecs.limits import MiB, check_size
from m2mwire.codecs.zstdraw import RawCompressor, RawDecompressor, RawError, raw_available
from m2mwire.errors import DecodeError, EncodeError

# zstandard is imported where a context or dictionary is used (~50 ns once loaded), not here: every
# session imports this module for its constants, and only zstd sessions need the library.
if TYPE_CHECKING:
    import zstandard

__all__ = [
    "DEFAULT_LEVEL",
    "DEFAULT_WINDOW",
    "MAX_WINDOW",
    "MIN_WINDOW",
    "OUTPUT_SLACK",
    "ZSTD_HISTORY_KIND",
    "ZSTD_KIND",
    "ZSTD_PREFIX",
    "ContextCompressor",
    "ContextDecompressor",
    "ZstdDictionary",
    "normalize_window",
    "payload_bound",
    "train_dictionary",
]

#: First byte of a binary zstd-context message. TokenNative binary uses 0x00-0x02 (room left for
#: more tokenizers below 0x20), AVP frames start with 0x41 0x56 ("AV"); "Z" collides with neither.
ZSTD_KIND: Final = 0x5A
#: First byte of a binary message with shared history (codecs/zstdhistory.py: a header precedes
#: the CRC-32); only on sessions that negotiated it. "H" collides with nothing above either.
ZSTD_HISTORY_KIND: Final = 0x48
#: Text form prefix; "#ZS|" matches the decoders' unknown-tag rule, so a peer without zstd refuses it.
ZSTD_PREFIX: Final = "#ZS|"

#: The window is what each direction's decoder keeps in memory (and the compressor's history).
DEFAULT_WINDOW: Final = 1 * MiB
MIN_WINDOW: Final = 1 << 10  # 1 KiB: zstandard.WINDOWLOG_MIN (tests/codecs/test_zstdcontext.py)
MAX_WINDOW: Final = 8 * MiB
#: zstd level 3 (the library default); benchmarks/bench_context.py compares levels 1-6.
DEFAULT_LEVEL: Final = 3

_BLOCK_MAX: Final = 128 * 1024  # zstd's largest block (format spec: Block_Maximum_Size)
_MIN_BLOCK_INPUT: Final = 4  # smallest block that produces output: 3-byte header + 1 RLE byte
_MAX_RATIO: Final = _BLOCK_MAX // _MIN_BLOCK_INPUT  # 32768 output bytes per input byte at most
#: Decompression may overshoot the limit by at most this much before it is refused.
OUTPUT_SLACK: Final = 1 * MiB
_OUTPUT_CHUNK: Final = 64 * 1024  # decompressobj's write_size: output is gathered in such pieces
_CRC_SIZE: Final = 4
_MAX_HASH_LOG: Final = 15
_MAX_CHAIN_LOG: Final = 14


def normalize_window(window: int) -> int:
    """A window offer as used: a power of two within [MIN_WINDOW, MAX_WINDOW] (rounded down).

    0 or a negative value means "no preference" and gives :data:`DEFAULT_WINDOW`.
    """
    if window <= 0:
        return DEFAULT_WINDOW
    clamped = max(MIN_WINDOW, min(MAX_WINDOW, window))
    return 1 << (clamped.bit_length() - 1)


def payload_bound(size: int) -> int:
    """Largest payload (checksum + zstd bytes) a message of ``size`` bytes can compress to.

    zstd falls back to raw blocks for incompressible input (3-byte header per 128 KiB), plus at most
    18 bytes of frame header once; ``size >> 7`` and the constant cover both with room to spare
    (and shared history's header of at most 5 bytes, codecs/zstdhistory.py).
    """
    return size + (size >> 7) + 64 + _CRC_SIZE


@dataclass(frozen=True, slots=True)
class ZstdDictionary:
    """A shared dictionary that primes both contexts, identified by the SHA-256 of its bytes.

    Either a dictionary trained by zstd (it starts with the magic ``37 A4 30 EC``) or raw content
    (e.g. a typical system prompt and tool list); zstd tells them apart itself.
    """

    data: bytes
    id: str = field(init=False)

    def __post_init__(self) -> None:
        if not isinstance(self.data, bytes) or not self.data:
            raise EncodeError("a zstd dictionary is non-empty bytes (e.g. from train_dictionary())")
        object.__setattr__(self, "id", hashlib.sha256(self.data).hexdigest())


def train_dictionary(samples: Sequence[bytes], size: int = 64 * 1024) -> ZstdDictionary:
    """Train a dictionary of about ``size`` bytes from sample messages (zstd's COVER trainer)."""
    if not samples:
        raise EncodeError("train_dictionary() needs sample messages")
    import zstandard

    try:
        trained = zstandard.train_dictionary(size, list(samples))
    except zstandard.ZstdError as exc:
        raise EncodeError(
            f"zstd could not train a dictionary ({exc}); give more or larger samples (zstd wants "
            "roughly 100x the dictionary size in total)"
        ) from None
    return ZstdDictionary(trained.as_bytes())


@functools.cache
def _parameters(level: int, window: int) -> zstandard.ZstdCompressionParameters:
    """The compression parameters of every frame (made once: a frame starts often with shared history)."""
    import zstandard

    level_defaults = zstandard.ZstdCompressionParameters.from_level(level)
    return zstandard.ZstdCompressionParameters.from_level(
        level,
        window_log=window.bit_length() - 1,
        # Match-finder tables are zeroed when a context starts, so they are resident in every
        # session; capped at 128 KiB + 64 KiB, level 3 loses < 0.5 % of wire size on the
        # workloads of benchmarks/bench_context.py and each session saves ~580 KiB.
        hash_log=min(level_defaults.hash_log, _MAX_HASH_LOG),
        chain_log=min(level_defaults.chain_log, _MAX_CHAIN_LOG),
        write_checksum=0,  # per-message CRC-32 instead; the frame never ends
        write_content_size=0,
        write_dict_id=0,  # the dictionary was agreed in HELLO/ACCEPT
    )


class _ObjCompressor:
    """The general path of one direction (python-zstandard's objects; see codecs/zstdraw.py for
    why the raw contexts are preferred): a frame primed with a dictionary or a prefix needs a new
    ZstdCompressor, since its dictionary is bound when it is built."""

    __slots__ = ("_cctx", "_cobj", "_flush", "_params")

    def __init__(self, params: zstandard.ZstdCompressionParameters) -> None:
        self._params = params
        self._cctx: zstandard.ZstdCompressor | None = None
        self._cobj: zstandard.ZstdCompressionObj | None = None
        self._flush = 0  # COMPRESSOBJ_FLUSH_BLOCK, read in start(): no import per message

    def start(self, primer: bytes | None, dictionary: bytes | None) -> None:
        import zstandard

        data, kind = (
            (primer, zstandard.DICT_TYPE_RAWCONTENT) if primer else (dictionary, zstandard.DICT_TYPE_AUTO)
        )
        self._cctx = zstandard.ZstdCompressor(
            compression_params=self._params,
            dict_data=zstandard.ZstdCompressionDict(data, dict_type=kind) if data else None,
        )
        self._cobj = self._cctx.compressobj()
        self._flush = zstandard.COMPRESSOBJ_FLUSH_BLOCK

    def compress(self, data: bytes, head: bytes) -> bytes:
        cobj = self._cobj
        assert cobj is not None  # start() comes first (ContextCompressor)
        # compress() only buffers a message smaller than a block; flush() emits it all.
        body = cobj.compress(data)
        return b"".join((head, body, cobj.flush(self._flush)))

    def memory_size(self) -> int:
        return self._cctx.memory_size() if self._cctx is not None else 0


class _ObjDecompressor:
    """The general path's receiving half (see _ObjCompressor)."""

    __slots__ = ("_dctx", "_dobj", "_window")

    def __init__(self, window: int) -> None:
        self._window = window
        self._dctx: zstandard.ZstdDecompressor | None = None
        self._dobj: zstandard.ZstdDecompressionObj | None = None

    def start(self, primer: bytes | None, dictionary: bytes | None) -> None:
        import zstandard

        data, kind = (
            (primer, zstandard.DICT_TYPE_RAWCONTENT) if primer else (dictionary, zstandard.DICT_TYPE_AUTO)
        )
        # max_window_size: a frame header asking for a larger window (more memory) is refused.
        self._dctx = zstandard.ZstdDecompressor(
            dict_data=zstandard.ZstdCompressionDict(data, dict_type=kind) if data else None,
            max_window_size=self._window,
        )
        self._dobj = self._dctx.decompressobj(write_size=_OUTPUT_CHUNK)

    def decompress(self, data: bytes | memoryview, limit: int) -> tuple[bytes, bool]:
        """(output, whether the frame ended); LimitExceeded past ``limit`` (see the module's bound)."""
        dobj = self._dobj
        assert dobj is not None  # start() comes first (ContextDecompressor)
        if len(data) * _MAX_RATIO <= limit + OUTPUT_SLACK:
            # The usual case: even all-RLE blocks could not exceed the bound, so one call.
            out = dobj.decompress(data)
            if len(out) > limit:
                check_size("decompressed zstd message", len(out), limit)
        else:
            out = self._decompress_sliced(dobj, data, limit)
        return out, dobj.eof

    @staticmethod
    def _decompress_sliced(
        dobj: zstandard.ZstdDecompressionObj, data: bytes | memoryview, limit: int
    ) -> bytes:
        view = memoryview(data)
        parts: list[bytes] = []
        total = pos = 0
        while pos < len(view):
            # At most step / 4 + 1 blocks can end inside `step` input bytes (one may have begun
            # earlier), each <= 128 KiB: this call's output is <= budget + OUTPUT_SLACK + 128 KiB.
            step = max(_MIN_BLOCK_INPUT, (max(limit - total, 0) + OUTPUT_SLACK) // _MAX_RATIO)
            out = dobj.decompress(view[pos : pos + step])
            pos += step
            if out:
                total += len(out)
                check_size("decompressed zstd message", total, limit)
                parts.append(out)
        return b"".join(parts)

    def memory_size(self) -> int:
        return self._dctx.memory_size() if self._dctx is not None else 0


_Compressor = RawCompressor | _ObjCompressor
_Decompressor = RawDecompressor | _ObjDecompressor
_Engine = TypeVar("_Engine", _Compressor, _Decompressor)


class _Context(Generic[_Engine]):
    """What both halves of a direction hold: the window, the dictionary, the engine (made on the
    first message, kept until dropped) and where the next frame starts from."""

    __slots__ = ("_dictionary", "_engine", "_primer", "_raw", "_started", "_window", "messages")

    def __init__(self, window: int, dictionary: ZstdDictionary | None, raw: bool) -> None:
        self._window = window
        self._dictionary = dictionary
        self._raw = raw
        self._engine: _Engine | None = None
        self._started = False  # the current frame has begun (else the next message starts one)
        self._primer: bytes | None = None  # raw-content history of the next frame (see restart)
        self.messages = 0  # coded since the last reset

    def restart(self, history: bytes) -> None:
        """End the frame: the next payload starts a new one primed with ``history`` as raw content
        (``DICT_TYPE_RAWCONTENT``; the shared dictionary is not used in it). Both halves restart
        with the same bytes (codecs/zstdhistory.py)."""
        self._started = False
        self._primer = history

    def reset(self) -> None:
        """Forget the history: the next payload starts a new frame (resume does this)."""
        self._started = False
        self._primer = None
        self.messages = 0

    def memory_size(self) -> int:
        """Bytes zstd reserved for this context (0 before the first message)."""
        return self._engine.memory_size() if self._engine is not None else 0


class ContextCompressor(_Context[_Compressor]):
    """The sending half of one direction. Created cheaply; zstd memory is taken on first use.

    ``raw``: frames primed with history (:meth:`restart`) use the reusable libzstd context of
    codecs/zstdraw.py where it is available (True), or python-zstandard's objects like every other
    frame (False); both make frames the other decodes (the wire is the same).
    """

    __slots__ = ("_level",)

    def __init__(
        self,
        window: int = DEFAULT_WINDOW,
        *,
        level: int = DEFAULT_LEVEL,
        dictionary: ZstdDictionary | None = None,
        raw: bool = True,
    ) -> None:
        if not MIN_WINDOW <= window <= MAX_WINDOW or window & (window - 1):
            raise EncodeError(
                f"zstd window must be a power of two in [{MIN_WINDOW}, {MAX_WINDOW}], not {window}"
            )
        if not 1 <= level <= 19:
            raise EncodeError(f"zstd level must be 1..19 here, not {level}")
        super().__init__(window, dictionary, raw)
        self._level = level

    def _start(self) -> _Compressor:
        # The primer (given to restart) wins; b"" primes with nothing, not with the dictionary.
        primer, dictionary, engine = self._primer, self._dictionary, self._engine
        # A frame primed with history goes to the reusable raw context (frames restart often:
        # see codecs/zstdraw.py), any other frame to python-zstandard's objects, whose bundled
        # libzstd is as fast on one long frame (and decodes ~25 % faster in bulk than the cffi
        # module's, measured). The other kind of engine is dropped: one holds memory at a time.
        if primer and self._raw and raw_available():
            if not isinstance(engine, RawCompressor):
                engine = RawCompressor(_parameters(self._level, self._window))
            engine.start(primer)
        else:
            if not isinstance(engine, _ObjCompressor):
                engine = _ObjCompressor(_parameters(self._level, self._window))
            engine.start(primer, dictionary.data if primer is None and dictionary is not None else None)
        self._engine = engine
        self._started = True
        return engine

    def compress(self, data: bytes, prefix: bytes = b"") -> bytes:
        """``prefix`` + the payload for one message: CRC-32 + the flushed zstd bytes (history is kept)."""
        engine = self._engine if self._started else self._start()
        assert engine is not None
        try:
            payload = engine.compress(data, prefix + crc32(data).to_bytes(_CRC_SIZE, "big"))
        except Exception as exc:  # pragma: no cover - zstd fails only on exhausted memory
            raise EncodeError(f"zstd compression failed: {exc}") from None
        self.messages += 1
        return payload


class ContextDecompressor(_Context[_Decompressor]):
    """The receiving half of one direction: payloads must be fed in the order they were made."""

    __slots__ = ()

    def __init__(
        self,
        window: int = DEFAULT_WINDOW,
        *,
        dictionary: ZstdDictionary | None = None,
        raw: bool = True,
    ) -> None:
        super().__init__(window, dictionary, raw)

    def _start(self) -> _Decompressor:
        primer, dictionary, engine = self._primer, self._dictionary, self._engine
        if primer and self._raw and raw_available():  # as ContextCompressor._start chooses
            if not isinstance(engine, RawDecompressor):
                engine = RawDecompressor(self._window)
            engine.start(primer)
        else:
            if not isinstance(engine, _ObjDecompressor):
                engine = _ObjDecompressor(self._window)
            engine.start(primer, dictionary.data if primer is None and dictionary is not None else None)
        self._engine = engine
        self._started = True
        return engine

    def decompress(self, payload: bytes | memoryview, limit: int, offset: int = 0) -> bytes:
        """Decode one message's payload (``payload[offset:]``); at most ``limit`` bytes of output
        (else LimitExceeded).

        Raises :class:`DecodeError` for a corrupted, truncated, missing or reordered message (the
        context is unusable afterwards: the session must end).
        """
        start = offset + _CRC_SIZE
        size = len(payload) - start
        if size < 0:
            raise DecodeError(
                f"zstd context payload is {size + _CRC_SIZE} bytes: shorter than its 4-byte CRC-32"
            )
        expected = int.from_bytes(payload[offset:start], "big")
        engine = self._engine if self._started else self._start()
        assert engine is not None
        try:
            out, ended = engine.decompress(payload[start:], limit)
        except Exception as exc:
            import zstandard  # loaded by _start: only the error path needs the name

            if not isinstance(exc, zstandard.ZstdError | RawError):
                raise
            raise DecodeError(
                f"corrupt zstd context message #{self.messages + 1} ({exc}); the context cannot continue"
            ) from None
        if ended:
            raise DecodeError("the peer ended its zstd frame; a session context never ends its frame")
        if crc32(out) != expected:
            raise DecodeError(
                f"zstd context message #{self.messages + 1} does not match its CRC-32: it was "
                "corrupted, or a message was lost or reordered (a context cannot skip messages)"
            )
        self.messages += 1
        return out
