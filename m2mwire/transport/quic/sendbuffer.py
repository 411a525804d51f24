"""A QUIC stream's unacknowledged send data, without aioquic's whole-buffer copies.

aioquic keeps what a stream sent and the peer has not acknowledged in one ``bytearray``: ``+=``
appends each write, ``del buffer[:n]`` drops what an ACK covered, ``buffer[a:b]`` takes a frame's
data. CPython drops a bytearray's front by moving its start, and a bytearray whose start has moved
cannot grow in place: the next append past its capacity allocates a new buffer and copies all it
holds. The capacity is 1/8 above the size, so with a stream window of data in flight (up to
``QuicTuning.stream_send_high``, 4 MiB) every 1/8 of a window sent copied the whole window into
fresh memory: 8 bytes copied per byte sent, and page faults for each new buffer (measured: 5-35
minor faults per 64 KiB message, 1-2 us each on this VM; most of them in bytearray resizing).

:class:`SendBuffer` holds the writes themselves instead (immutable ones by reference, small ones
gathered into one growing tail), so appending never copies what is already held and an ACK only
drops references. It offers exactly the operations aioquic's ``QuicStreamSender`` uses on its
buffer (checked for the aioquic minor version pinned in :mod:`.compat`, which installs it), and
tests/transport/test_quic_sendbuffer.py checks it against a bytearray under random operations.
"""

from __future__ import annotations

from bisect import bisect_right

__all__ = ["LARGE_WRITE", "SendBuffer"]

# Writes below this many bytes are copied into the tail (as the bytearray did); larger immutable
# ones are kept by reference. A frame's data (up to a datagram, 16 KiB) then spans few chunks.
# Streams take a SendBuffer at their first write this large (compat.write): for small messages
# the bytearray's C appends cost less than this class's Python ones (1,000 B AVP messages:
# 7.9 -> 8.4 us of client CPU each with a SendBuffer from the start).
LARGE_WRITE = _BY_REFERENCE = 8 * 1024
_TAIL_MAX = 64 * 1024  # a tail this full is left as it is: the next small write starts another


class SendBuffer:
    """Stream bytes sent and not yet acknowledged: ``+=``, ``len``, ``[a:b]`` and ``del [:n]``."""

    __slots__ = ("_base", "_chunks", "_ends", "_first", "_tail", "size")

    def __init__(self, data: bytes = b"") -> None:
        # _chunks[i] holds stream bytes up to the absolute offset _ends[i] (absolute: counted from
        # the first byte ever written); chunks before _first are acknowledged and dropped (None),
        # and _base is the absolute offset of index 0 of this buffer.
        self._chunks: list[bytes | memoryview | bytearray | None] = []
        self._ends: list[int] = []
        self._first = 0
        self._base = 0
        self.size = 0
        self._tail: bytearray | None = None  # the last chunk, while small writes may grow it
        if data:
            self.__iadd__(data)

    def __len__(self) -> int:
        return self.size  # also a plain attribute: the channel reads it twice per message

    def __iadd__(self, data: bytes | bytearray | memoryview) -> SendBuffer:
        # The per-message case first: a small write into a tail with room (one C append).
        tail = self._tail
        if tail is not None and len(tail) < _TAIL_MAX:
            n = len(data) if type(data) is not memoryview else data.nbytes
            if n < _BY_REFERENCE:
                tail += data
                self.size += n
                self._ends[-1] += n
                return self
        return self._add(data)

    def _add(self, data: bytes | bytearray | memoryview) -> SendBuffer:
        n = len(data) if type(data) is not memoryview else data.nbytes
        if not n:
            return self
        end = self._base + self.size + n
        self.size += n
        if n >= _BY_REFERENCE:
            # Immutable bytes, or a view of them: nothing can change it after the write, so it
            # is kept as it is (a view cast to bytes, so that len() counts bytes).
            kept: bytes | memoryview | None = None
            if type(data) is bytes:
                kept = data
            elif type(data) is memoryview and type(data.obj) is bytes:
                kept = data.cast("B")
            if kept is not None:
                self._chunks.append(kept)
                self._ends.append(end)
                self._tail = None
                return self
        tail = self._tail
        if tail is not None and len(tail) < _TAIL_MAX:
            tail += data
            self._ends[-1] = end
        else:
            tail = self._tail = bytearray(data)  # a copy: a caller's buffer may change later
            self._chunks.append(tail)
            self._ends.append(end)
        return self

    def __getitem__(self, index: slice) -> bytes:
        """``buffer[a:b]`` with 0 <= a <= b <= len(buffer), as aioquic takes a frame's data."""
        start, stop = index.start or 0, self.size if index.stop is None else index.stop
        a, b = self._base + start, self._base + stop
        if a >= b:
            return b""
        chunks, ends = self._chunks, self._ends
        i = bisect_right(ends, a, self._first)
        chunk = chunks[i]
        assert chunk is not None
        chunk_start = ends[i] - len(chunk)
        if b <= ends[i]:  # within one chunk: one copy (none for a whole bytes chunk)
            if type(chunk) is bytes:
                return chunk[a - chunk_start : b - chunk_start]
            return bytes(memoryview(chunk)[a - chunk_start : b - chunk_start])
        parts = []
        while a < b:  # bounded: each pass moves a to the end of a chunk, and b is within the buffer
            chunk = chunks[i]
            assert chunk is not None
            chunk_start = ends[i] - len(chunk)
            upto = min(b, ends[i])
            parts.append(memoryview(chunk)[a - chunk_start : upto - chunk_start])
            a = upto
            i += 1
        return b"".join(parts)

    def __delitem__(self, index: slice) -> None:
        """``del buffer[:n]``, as aioquic drops what an ACK covered (no other deletion is used)."""
        if index.start not in (None, 0) or index.step is not None:
            raise TypeError("a SendBuffer only drops bytes from its front: del buffer[:n]")
        n = min(self.size, self.size if index.stop is None else max(index.stop, 0))
        self._base += n
        self.size -= n
        chunks, ends, first, base = self._chunks, self._ends, self._first, self._base
        last = len(chunks)
        while first < last and ends[first] <= base:
            if chunks[first] is self._tail:
                self._tail = None
            chunks[first] = None
            first += 1
        if first > 64 and 2 * first > last:  # drop the dead prefix: amortised O(1) per chunk
            del chunks[:first], ends[:first]
            first = 0
        self._first = first
