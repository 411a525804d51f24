"""libzstd contexts kept for a session's whole life, through python-zstandard's cffi binding.

Why this exists: python-zstandard's objects bind a dictionary (or a raw-content prefix) when they
are built, so every new zstd frame of shared history (codecs/zstdhistory.py) cost a fresh
``ZstdCompressor`` and ``ZstdDecompressor``: ~8 µs each just to construct, plus a fresh context
workspace to allocate and fault in, ~30 µs per restarted message on both ends together, which is
most of an echoed 1 KB message's round trip. libzstd itself starts a frame on a context it already
has (``ZSTD_CCtx_reset`` + ``ZSTD_CCtx_refPrefix``, ``ZSTD_DCtx_refPrefix``) in about the time it
takes to index the prefix: measured 3.3 µs to compress and 1.3 µs to decompress a quoted 1 KB
message with a 4 KiB prefix, instead of 14.2 and 9.2 µs.

python-zstandard ships those calls in the cffi module its ``cffi`` backend uses
(``zstandard.backend_cffi.lib``, the same libzstd version); cffi itself comes with
``cryptography``, a dependency of ours. Only frames primed with history use these contexts
(codecs/zstdcontext.py): that module's libzstd decodes long messages ~25 % slower than the one
in python-zstandard's C extension (measured: 1,140 vs 1,538 MB/s), so a frame without a prefix
(one context per direction, the first frame of shared history) keeps python-zstandard's objects.
Where the module is missing, :func:`raw_available` is False and every frame uses the objects (the
general path; a differential test checks that each decodes what the other makes).

The wire is the same either way: ``refPrefix`` is zstd's raw-content dictionary (the receiver may
use either; docs/CODECS.md section 8), and the frame parameters are the ones the objects set.
"""

from __future__ import annotations

import functools
import importlib
from typing import TYPE_CHECKING, Any, Final

from m2mwire.codecs.limits import check_size

if TYPE_CHECKING:
    import zstandard

__all__ = [
    "OUTPUT_CHUNK",
    "REQUIRED",
    "VERIFIED_MINOR",
    "RawCompressor",
    "RawDecompressor",
    "RawError",
    "binding_supported",
    "raw_available",
]

#: Decompressed output is gathered in pieces of this size: a message is refused at most this far
#: past its limit (the general path's bound, OUTPUT_SLACK + one block, is larger).
OUTPUT_CHUNK: Final = 64 * 1024
#: A compressor's own output buffer: messages whose worst case fits (~4 KB) need no allocation.
SMALL_OUTPUT: Final = 4 * 1024
_EXPANSION: Final = 32  # the first output buffer's size per input byte (see decompress)
_SMALL_INPUT: Final = SMALL_OUTPUT // 4  # payloads decoded into the context's own buffer first
_HINT_MAX: Final = 1 << 20  # above any input hint of ZSTD_decompressStream (see decompress)

# The binding, loaded on first use like zstandard everywhere here (~9 ms to import, and only
# sessions that use zstd need it).
_ffi: Any = None
_lib: Any = None
_new_buffer: Any = None


#: ``backend_cffi.lib`` is an internal of python-zstandard, read against and tested with this
#: minor version only. Another version falls back to the objects (the general path, always
#: correct) instead of failing: nothing is lost but the speed of restarted frames.
VERIFIED_MINOR: Final = (0, 25)
#: Every libzstd name this module calls; a binding lacking one is not used.
REQUIRED: Final = (
    "ZSTD_createCCtx", "ZSTD_freeCCtx", "ZSTD_CCtx_setParameter", "ZSTD_CCtx_reset",
    "ZSTD_CCtx_refPrefix", "ZSTD_compressStream2_simpleArgs", "ZSTD_sizeof_CCtx",
    "ZSTD_createDCtx", "ZSTD_freeDCtx", "ZSTD_DCtx_setParameter", "ZSTD_DCtx_reset",
    "ZSTD_DCtx_refPrefix", "ZSTD_decompressStream_simpleArgs", "ZSTD_sizeof_DCtx",
    "ZSTD_isError", "ZSTD_getErrorName", "ZSTD_reset_session_only", "ZSTD_e_flush",
    "ZSTD_d_windowLogMax", "ZSTD_c_windowLog", "ZSTD_c_hashLog", "ZSTD_c_chainLog",
    "ZSTD_c_searchLog", "ZSTD_c_minMatch", "ZSTD_c_targetLength", "ZSTD_c_strategy",
    "ZSTD_c_contentSizeFlag", "ZSTD_c_checksumFlag", "ZSTD_c_dictIDFlag",
)  # fmt: skip


def binding_supported(version: str, lib: object) -> bool:
    """Whether python-zstandard ``version``'s cffi ``lib`` is one this module was verified with."""
    try:
        minor = tuple(int(part) for part in version.split(".")[:2])
    except ValueError:
        return False
    return minor == VERIFIED_MINOR and all(hasattr(lib, name) for name in REQUIRED)


@functools.cache
def raw_available() -> bool:
    """Whether the raw contexts can be used here (loads the binding; else the objects are used)."""
    global _ffi, _lib, _new_buffer
    try:
        zstandard = importlib.import_module("zstandard")
        binding = importlib.import_module("zstandard.backend_cffi")
    except ImportError:  # pragma: no cover - python-zstandard built without its cffi module
        return False
    if not binding_supported(zstandard.__version__, binding.lib):
        return False
    _ffi, _lib = binding.ffi, binding.lib
    # Output buffers are filled by libzstd before they are read: no need to zero them first.
    _new_buffer = _ffi.new_allocator(should_clear_after_alloc=False)
    return True


class RawError(Exception):
    """libzstd refused the input (or ran out of memory); the message is zstd's error name."""


def _error_name(code: int) -> str:
    return str(_ffi.string(_lib.ZSTD_getErrorName(code)).decode("ascii", "replace"))


def _check(result: int) -> int:
    if _lib.ZSTD_isError(result):
        raise RawError(_error_name(result))
    return result


class RawCompressor:
    """One libzstd compression context: frames are started on it again and again (never rebuilt)."""

    __slots__ = ("_cctx", "_keep", "_out", "_pos")

    def __init__(self, params: zstandard.ZstdCompressionParameters) -> None:
        cctx = _lib.ZSTD_createCCtx()
        if cctx == _ffi.NULL:  # pragma: no cover - out of memory
            raise MemoryError("zstd could not create a compression context")
        self._cctx = _ffi.gc(cctx, _lib.ZSTD_freeCCtx)
        # The parameters python-zstandard's ZstdCompressor sets from the same object, so that
        # both paths write the same frame header and match with the same parameters.
        for name, value in (
            ("format", params.format),
            ("compressionLevel", params.compression_level),
            ("windowLog", params.window_log),
            ("hashLog", params.hash_log),
            ("chainLog", params.chain_log),
            ("searchLog", params.search_log),
            ("minMatch", params.min_match),
            ("targetLength", params.target_length),
            ("strategy", params.strategy),
            ("contentSizeFlag", params.write_content_size),
            ("checksumFlag", params.write_checksum),
            ("dictIDFlag", params.write_dict_id),
        ):
            _check(_lib.ZSTD_CCtx_setParameter(self._cctx, getattr(_lib, f"ZSTD_c_{name}"), value))
        # Output of messages up to ~SMALL_OUTPUT bytes goes here (no allocation per message);
        # larger ones get a buffer of their own. _pos: the output and input positions.
        self._out = _new_buffer("char[]", SMALL_OUTPUT)
        self._pos = _ffi.new("size_t[2]")
        self._keep: object = None  # the prefix libzstd references (must stay alive)

    def start(self, primer: bytes) -> None:
        """End the current frame (unflushed input is dropped: there is none, every message is
        flushed) and make the next message start a new one primed with ``primer`` as raw content
        (``ZSTD_CCtx_refPrefix``; it replaces any earlier prefix)."""
        _check(_lib.ZSTD_CCtx_reset(self._cctx, _lib.ZSTD_reset_session_only))
        # refPrefix lasts one frame, but a frame of ours never ends: the prefix is referenced by
        # every later message of the frame, so its bytes are kept alive with it.
        self._keep = keep = _ffi.from_buffer(primer)
        _check(_lib.ZSTD_CCtx_refPrefix(self._cctx, keep, len(primer)))

    def compress(self, data: bytes, head: bytes) -> bytes:
        """``head`` + the zstd bytes of ``data``, flushed (``ZSTD_e_flush``: decodable at once)."""
        # Room for the worst case (zstd's bound for a frame, + a frame header and a flush's
        # empty block), so one call consumes and flushes everything: it returns 0.
        size = len(data) + (len(data) >> 7) + 128
        out = self._out if size <= SMALL_OUTPUT else _new_buffer("char[]", size)
        pos = self._pos
        pos[0] = pos[1] = 0
        left = _lib.ZSTD_compressStream2_simpleArgs(
            self._cctx, out, size, pos, data, len(data), pos + 1, _lib.ZSTD_e_flush
        )
        if left:  # pragma: no cover - an error (out of memory), or more output than zstd's bound
            raise RawError(_error_name(left) if _lib.ZSTD_isError(left) else "output exceeded its bound")
        return b"".join((head, _ffi.buffer(out, pos[0])))

    def memory_size(self) -> int:
        return int(_lib.ZSTD_sizeof_CCtx(self._cctx)) + SMALL_OUTPUT


class RawDecompressor:
    """One libzstd decompression context, reused by every frame of a direction."""

    __slots__ = ("_dctx", "_keep", "_out", "_pos")

    def __init__(self, window: int) -> None:
        dctx = _lib.ZSTD_createDCtx()
        if dctx == _ffi.NULL:  # pragma: no cover - out of memory
            raise MemoryError("zstd could not create a decompression context")
        self._dctx = _ffi.gc(dctx, _lib.ZSTD_freeDCtx)
        # A frame header asking for a larger window (more memory) is refused before allocating.
        _check(_lib.ZSTD_DCtx_setParameter(self._dctx, _lib.ZSTD_d_windowLogMax, window.bit_length() - 1))
        self._out = _new_buffer("char[]", SMALL_OUTPUT)  # the first output of every message
        self._pos = _ffi.new("size_t[2]")
        self._keep: object = None

    def start(self, primer: bytes) -> None:
        """The next input must start a new frame, primed as :meth:`RawCompressor.start` says."""
        _check(_lib.ZSTD_DCtx_reset(self._dctx, _lib.ZSTD_reset_session_only))
        self._keep = keep = _ffi.from_buffer(primer)
        _check(_lib.ZSTD_DCtx_refPrefix(self._dctx, keep, len(primer)))

    def decompress(self, data: bytes | memoryview, limit: int) -> tuple[bytes, bool]:
        """(output, whether the frame ended) of ``data``; LimitExceeded as soon as the output
        passes ``limit``: at most OUTPUT_CHUNK bytes past it are ever produced."""
        src = data if isinstance(data, bytes) else _ffi.from_buffer(data)
        size = len(data)
        # Output goes to our small buffer when the payload is small (a 1 KB message's ~100-700
        # bytes: no allocation, and output that does not fit continues below), else to one as
        # large as it may well be (a context's payloads expand up to ~30 times on the agent loop:
        # one call), never above OUTPUT_CHUNK; more output takes more calls.
        if size <= _SMALL_INPUT:
            out, room = self._out, SMALL_OUTPUT
        else:
            room = min(OUTPUT_CHUNK, _EXPANSION * size)
            out = _new_buffer("char[]", room)
        pos = self._pos
        pos[1] = 0
        parts: list[bytes] = []
        total = consumed = 0
        while True:
            pos[0] = 0
            hint = _lib.ZSTD_decompressStream_simpleArgs(self._dctx, out, room, pos, src, size, pos + 1)
            # A hint is at most a block and a block header; error codes are near SIZE_MAX. Only
            # a large value is worth the call that tells them apart.
            if hint > _HINT_MAX and _lib.ZSTD_isError(hint):
                raise RawError(_error_name(hint))
            produced = pos[0]
            if produced:
                total += produced
                if total > limit:
                    check_size("decompressed zstd message", total, limit)
                parts.append(_ffi.unpack(out, produced))
            if hint == 0:  # a frame was completely decoded: ours never end
                return b"".join(parts), True
            # A full output buffer may hold back more output; otherwise all the input is used.
            if pos[1] == size and produced < room:
                return (parts[0] if len(parts) == 1 else b"".join(parts)), False
            if not produced and pos[1] == consumed:  # pragma: no cover - libzstd always moves
                raise RawError("zstd made no progress")  # with room and input: never loop on
            consumed = pos[1]
            if room < OUTPUT_CHUNK:
                out, room = _new_buffer("char[]", OUTPUT_CHUNK), OUTPUT_CHUNK

    def memory_size(self) -> int:
        return int(_lib.ZSTD_sizeof_DCtx(self._dctx)) + SMALL_OUTPUT
