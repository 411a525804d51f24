"""A drop-in for websockets' ``StreamReader`` that keeps received chunks instead of one bytearray.

websockets appends every chunk the socket gives to one ``bytearray`` and, for each read, slices
the bytes out and deletes them from its front. That is one copy on arrival and one per read, plus
another whenever the leftover after a read is under half the allocation (the bytearray then
shrinks by copying). A receiver that falls behind gets several frames per socket read, which
makes those shrinking copies the rule: at 64 KiB frames, about 1.5 extra copies of every frame
(callgrind). Here chunks stay as the socket returned them; a read inside one chunk is one slice
of it (none at all when it is the whole chunk, or a view for a frame payload), and only a read
that spans chunks joins them.

The interface (``read_line``, ``read_exact``, ``read_to_eof``, ``at_eof``, ``feed_data``,
``feed_eof``, ``discard``, ``eof``) and its errors are websockets' own. Reads return ``bytes``;
``bytearray`` after a line read had to merge chunks; a ``memoryview`` for a ``read_exact`` of at
least 4 KiB inside one chunk (websockets' frame parser and our channel accept all three).
"""

from __future__ import annotations

import sys
from collections import deque
from collections.abc import Callable, Generator

from m2mwire.transport.websockets_compat import StreamReader

__all__ = ["ChunkReader"]

# Reads this large come back as memoryviews of the chunk: they are frame payloads (control frames
# and headers are far smaller), which websockets unmasks into new bytes (server side) and our
# channel turns into bytes once (client side), so slicing them out first would be a wasted copy.
_VIEW_FROM = 4096


class ChunkReader(StreamReader):
    """``on_bulk`` (if given) is called once, when both a chunk of at least ``bulk_chunk`` bytes
    has been fed and a read of at least ``bulk_read`` bytes had to wait for data: the transport's
    cue that the peer streams large messages faster than they are read."""

    def __init__(
        self, *, bulk_chunk: int = 0, bulk_read: int = 0, on_bulk: Callable[[], None] | None = None
    ) -> None:
        super().__init__()
        self._chunks: deque[bytes | bytearray] = deque()
        self._pos = 0  # read position in _chunks[0]
        self._size = 0  # bytes fed and not yet read
        # Each threshold becomes maxsize once reached; on_bulk runs when both have been.
        self._bulk_chunk = bulk_chunk if on_bulk is not None else sys.maxsize
        self._bulk_read = bulk_read if on_bulk is not None else sys.maxsize
        self._on_bulk = on_bulk
        self.waiting_for_frame = False  # the parser waits in at_eof() with nothing buffered

    def _bulk_seen(self) -> None:
        if self._bulk_chunk == self._bulk_read == sys.maxsize and self._on_bulk is not None:
            on_bulk, self._on_bulk = self._on_bulk, None
            on_bulk()

    def feed_data(self, data: bytes | bytearray) -> None:
        if self.eof:
            raise EOFError("stream ended")
        if len(data) >= self._bulk_chunk:
            self._bulk_chunk = sys.maxsize
            self._bulk_seen()
        if data:
            # asyncio hands over bytes it no longer uses; anything mutable is copied once.
            self._chunks.append(data if type(data) is bytes else bytes(data))
            self._size += len(data)

    def discard(self) -> None:
        self._chunks.clear()
        self._pos = self._size = 0

    def at_eof(self) -> Generator[None, None, bool]:
        while True:
            if self._size:
                return False
            if self.eof:
                return True
            # websockets' parser asks this between frames only: while it waits here, the next
            # byte fed starts a frame (the transport's frame fast path relies on it).
            self.waiting_for_frame = True
            yield
            self.waiting_for_frame = False

    def read_exact(  # type: ignore[override]
        self, n: int
    ) -> Generator[None, None, bytes | bytearray | memoryview]:
        assert n >= 0
        while self._size < n:
            if n >= self._bulk_read:  # checked only when waiting: off the per-frame path
                self._bulk_read = sys.maxsize
                self._bulk_seen()
            if self.eof:
                raise EOFError(f"stream ends after {self._size} bytes, expected {n} bytes")
            yield
        if n:  # _take's one-chunk cases inline: several reads per frame, and most end here
            chunk = self._chunks[0]
            pos = self._pos
            end = pos + n
            if end < len(chunk):
                self._pos = end
                self._size -= n
                return chunk[pos:end] if n < _VIEW_FROM else memoryview(chunk)[pos:end]
            if end == len(chunk):
                self._chunks.popleft()
                self._pos = 0
                self._size -= n
                if pos == 0:
                    return chunk
                return chunk[pos:] if n < _VIEW_FROM else memoryview(chunk)[pos:]
        return self._take(n)

    def read_line(  # type: ignore[override]
        self, m: int, too_long_exc_type: type[Exception] = RuntimeError
    ) -> Generator[None, None, bytes | bytearray]:
        chunks = self._chunks
        while True:
            # A line is looked for in the first chunk; merge the next ones in until it is there.
            while len(chunks) > 1 and chunks[0].find(b"\n", self._pos) < 0:
                self._merge_head()
            if chunks and (end := chunks[0].find(b"\n", self._pos)) >= 0:
                n = end + 1 - self._pos
                break
            if self._size > m:
                raise too_long_exc_type(f"read {self._size} bytes, expected no more than {m} bytes")
            if self.eof:
                raise EOFError(f"stream ends after {self._size} bytes, before end of line")
            yield
        if n > m:
            raise too_long_exc_type(f"read {n} bytes, expected no more than {m} bytes")
        return self._take(n)

    def read_to_eof(  # type: ignore[override]
        self, m: int, too_long_exc_type: type[Exception] = RuntimeError
    ) -> Generator[None, None, bytes | bytearray]:
        while not self.eof:
            if self._size > m:
                raise too_long_exc_type(f"read {self._size} bytes, expected no more than {m} bytes")
            yield
        return self._take(self._size)

    def _take(self, n: int) -> bytes | bytearray:
        """The next ``n`` bytes (``n <= self._size``)."""
        if n == 0:
            return b""
        chunks = self._chunks
        chunk = chunks[0]
        pos = self._pos
        end = pos + n
        self._size -= n
        if end < len(chunk):
            self._pos = end
            return chunk[pos:end]
        if end == len(chunk):
            chunks.popleft()
            self._pos = 0
            return chunk if pos == 0 else chunk[pos:]
        # Spans chunks: join the tail of this one, whole ones, and the head of the last.
        parts = [memoryview(chunk)[pos:]]
        need = n - (len(chunk) - pos)
        chunks.popleft()
        self._pos = 0
        while need:
            chunk = chunks[0]
            if len(chunk) <= need:
                parts.append(memoryview(chunk))
                chunks.popleft()
                need -= len(chunk)
            else:
                parts.append(memoryview(chunk)[:need])
                self._pos = need
                need = 0
        return b"".join(parts)

    def _merge_head(self) -> None:
        """Append the second chunk to the first, made a bytearray so repeated merges (a line
        arriving a few bytes at a time) cost amortised linear time."""
        chunks = self._chunks
        head = chunks.popleft()
        if type(head) is not bytearray:
            head = bytearray(memoryview(head)[self._pos :])
            self._pos = 0
        head += chunks.popleft()
        chunks.appendleft(head)
