"""Shared history for session-context zstd: a message may start a frame primed with what both
directions said (docs/CODECS.md section 8, "Shared history").

A context per direction cannot reference what the other direction sent, so a chat reply is paid
twice: in the response, then inside the next request. With shared history each endpoint keeps its
*history*: the messages it sent and the messages it received, in the order it saw them. A message
may start a new zstd frame whose raw-content dictionary is the last ``window`` bytes of the
sender's history, so the next request finds the reply it quotes.

The receiver rebuilds the sender's history (its *mirror*) from the sender's messages and its own:
every message carries ``count``, the number of the receiver's messages the sender had received
since its previous message, which says where the receiver's messages enter the sender's history.
A message's payload is::

    header (one LEB128 varint: count << 2 | excluded << 1 | new_frame)  |  CRC-32  |  zstd bytes

``new_frame``: the zstd bytes start a frame primed with the sender's history as it was just before
this message (the shared dictionary is not used); otherwise they continue the current frame (the
first frame after a reset is primed with the shared dictionary, if any, as without shared history).
A new frame is allowed only when the sender received at least one message since its previous
frame began (the sum of ``count`` since then, this message's included, is >= 1): so the receiver
rebuilds a prefix at most once per message it sent itself, whatever the peer does.

``excluded``: the message enters neither history. A sender excludes its message when keeping it
would take its *unacknowledged* messages (sent, not yet covered by a ``count`` from the peer: the
peer may still put them in a prefix) past one window; so what an endpoint keeps is bounded:
its history and the mirror (each < 2 windows in chunks, one window used) plus at most one window
(+ 128 bytes per message) of unacknowledged messages, whatever the peer sends or withholds.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Sequence
from typing import Final, Literal

from m2mwire.codecs.zstdcontext import (
    DEFAULT_LEVEL,
    DEFAULT_WINDOW,
    ContextCompressor,
    ContextDecompressor,
    ZstdDictionary,
)
from m2mwire.errors import DecodeError

__all__ = ["MAX_HEADER", "PREFIX_FLOOR", "PREFIX_MULTIPLE", "History", "HistoryContext"]

_NEW_FRAME: Final = 1
_EXCLUDED: Final = 2
#: Largest header: two LEB128 varints of at most 5 bytes each (count < 2**33, far above any session's).
MAX_VARINT: Final = 5
MAX_HEADER: Final = 2 * MAX_VARINT
#: Per retained unacknowledged message, charged on top of its bytes (Python object overhead), so
#: that empty or tiny messages cannot pile up unbounded.
_ENTRY_COST: Final = 128  # measured ~90-100 bytes per kept message in CPython 3.11 (stop 28)
#: The sender's policy (not part of the wire: any choice of frames and prefixes decodes, since the
#: receiver follows the header and checks only the rules above). A new frame costs the indexing of
#: its whole prefix on both ends (the contexts are reused, codecs/zstdraw.py: ~1.5 us to compress
#: and ~1 us to decompress a 1 KB message with a 4 KiB prefix beyond a continuing frame; with
#: python-zstandard's objects it was ~20 us, a fresh context each) and drops the current frame's
#: window; what it buys is that peer content the message quotes is matched instead of compressed
#: afresh (~0.4 byte on the wire per byte of new text). So it pays only for a large quote: a frame
#: starts only when the message quotes at least RESTART_QUOTE bytes of *fresh* peer content, i.e.
#: of the peer's messages received since the frame began and not quoted in it yet (once a frame
#: has carried a quote, the quoted bytes are in its own window: quoting them again costs little),
#: and not in our own last message either (_samples: that text is in the frame's window already).
#:
#: How much of a peer message is quoted is measured, not guessed: two PROBE-byte samples are taken
#: from the middle and the last quarter of each peer message of PROBED_SIZE bytes or more, with up
#: to RESTART_QUOTE bytes either side; where a sample first occurs in the outgoing message, the run
#: it shares with the peer message around the sample is the quote's length. PROBE is long enough
#: that JSON structure common to both directions (``","type":"function","function":{"name":"``)
#: does not pass for a quote; only the latest MAX_QUOTABLE peer messages are kept (at most
#: 2 * MAX_QUOTABLE * (2 * RESTART_QUOTE + PROBE) bytes: 9 KiB). Measured (bench_context.py at 512 B
#: to 2 KiB, docs/CODECS.md section 8): the agent loop's tool calls (230-340 bytes quoted) never
#: restart its frames, which then keep the per-direction speed (>= 200 / 500 MB/s), and the chat's
#: replies (485 B to 1.6 KB, restarting from 512 B) do: both stay under 8 % of the bytes; at 1 KiB
#: the chat rises to 8.2 %, at 2 KiB to 9.5 % (no restart at all).
#: The prefix is at most PREFIX_MULTIPLE times the message's size (at least PREFIX_FLOOR bytes) of
#: history, which bounds the extra work to a few times the message's own. The floor is 4 KiB, not
#: more: priming costs in proportion to the prefix (an echoed 1 KB message's round trip cost 82 us of
#: coding with a 32 KiB floor, 55 us with 4 KiB), and what a message quotes is the peer's recent
#: messages, which the last 2 x message bytes hold: the workloads' bytes did not change (6.9 %, 7.4 %).
PROBE: Final = 128
PROBED_SIZE: Final = 512
MAX_QUOTABLE: Final = 4
RESTART_QUOTE: Final = 512
PREFIX_MULTIPLE: Final = 2
PREFIX_FLOOR: Final = 4 * 1024


class History:
    """The last ``limit`` bytes of a growing concatenation of messages, in one buffer.

    ``len()`` is ``min(limit, bytes appended)``: the bytes a prefix may be taken from, the same on
    both ends whatever the sizes of the messages were. One contiguous buffer, not a chunk per
    message: a peer sending tiny messages would otherwise make us keep a Python object per few
    bytes (~50 bytes of memory per 2-byte message) and walk hundreds of thousands of chunks to
    build a prefix (~50 ms per 1 MiB prefix), where now a prefix is one copy. The buffer grows to
    ``2 * limit`` before its head is cut, so each appended byte is moved at most once more and the
    memory held stays below ``2 * limit`` (+ the allocator's rounding).
    """

    __slots__ = ("_buf", "_limit")

    def __init__(self, limit: int) -> None:
        self._limit = limit
        self._buf = bytearray()

    def append(self, data: bytes) -> None:
        buf, limit = self._buf, self._limit
        if len(data) >= limit:
            buf[:] = memoryview(data)[-limit:]
            return
        buf += data
        if len(buf) >= 2 * limit:
            del buf[:-limit]  # the head of a bytearray is dropped without moving the rest

    def tail(self, size: int) -> bytes:
        """The last ``size`` bytes (``0 < size <= len(self)``)."""
        return bytes(memoryview(self._buf)[-size:])

    def __len__(self) -> int:
        return min(len(self._buf), self._limit)

    def memory_size(self) -> int:
        """Bytes allocated for the buffer."""
        return self._buf.__alloc__()

    def clear(self) -> None:
        self._buf = bytearray()


def _header(value: int) -> bytes:
    out = bytearray()
    while value >= 0x80:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


#: The one-byte headers (values below 0x80: a count below 32), made once.
_SMALL_HEADERS: Final = [bytes((value,)) for value in range(0x80)]


def _read_header(payload: bytes | memoryview, offset: int) -> tuple[int, int]:
    """(value, offset after it) of the header varint at ``offset``."""
    if offset < len(payload) and payload[offset] < 0x80:  # one byte: the usual case
        return payload[offset], offset + 1
    value = shift = 0
    for i in range(offset, min(offset + MAX_VARINT, len(payload))):
        byte = payload[i]
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return value, i + 1
        shift += 7
    raise DecodeError(
        f"zstd shared-history header at byte {offset} is truncated or longer than {MAX_VARINT} bytes"
    )


_Sample = tuple[bytes, bytes, bytes]  # (bytes before it, the sample, bytes after it)
#: _restart_quote's answer when nothing is quotable (the usual case; made once).
_NO_QUOTE: Final[tuple[bool, tuple[tuple[_Sample, ...], ...]]] = (False, ())


def _samples(message: bytes, own: bytes = b"") -> tuple[_Sample, ...]:
    """The samples of a peer message (see RESTART_QUOTE), each with its surroundings.

    A sample that ``own`` (our last message, in our current frame's window) holds within
    RESTART_QUOTE bytes of the same place is left out: zstd matches that text in the frame already,
    so quoting it is no reason for a new frame. That is what an echo or a reply of the same JSON
    shape with a few new words looks like (every echoed 1 KB message restarted a frame for nothing);
    a quote of our message from elsewhere still counts. The search is bounded (< 2 * RESTART_QUOTE
    + PROBE bytes per sample), whatever the sizes of the two messages.
    """
    size = len(message)
    # Where an echo (the same place) or a message of the same shape with a few words changed
    # before the sample (the same distance from the end) holds it: one comparison each, tried
    # before the search, which scans up to 2 * RESTART_QUOTE bytes (this runs on every received
    # message). Both positions are ones the search covers (the shift is checked), so the answer
    # is the search's (tests/codecs/test_zstdhistory.py compares with the search alone).
    shift = len(own) - size
    if -RESTART_QUOTE <= shift <= RESTART_QUOTE:
        if own.endswith(message[size // 2 :]):  # both samples there, at the same distance from
            return ()  # the end (an echo, or words changed in the first half only): one comparison
        if size // 2 + shift < 0:  # a negative start would count from the end
            shift = 0
    else:
        shift = 0
    out: tuple[_Sample, ...] = ()
    for at in (size // 2, size * 3 // 4):
        end = at + PROBE
        sample = message[at:end]
        if (
            own.startswith(sample, at)
            or own.startswith(sample, at + shift)
            or own.find(sample, max(0, at - RESTART_QUOTE), end + RESTART_QUOTE) >= 0
        ):
            continue
        # Its surroundings are sliced only for a sample that is kept (rare in an echo-like exchange).
        out += ((message[max(0, at - RESTART_QUOTE) : at], sample, message[end : end + RESTART_QUOTE]),)
    return out


def _common_run(a: bytes, b: bytes, order: Literal["big", "little"]) -> int:
    """Length of the common prefix ("big") or suffix ("little") of ``a`` and ``b``, compared over
    their first (last) min(len) bytes: as integers in that byte order, the run of equal bytes at
    the most significant end is what their XOR leaves as leading zeros (a few C calls, where a
    Python loop would take one step per byte)."""
    n = min(len(a), len(b))
    if order == "big":
        a, b = a[:n], b[:n]
    else:
        a, b = a[len(a) - n :], b[len(b) - n :]
    return (8 * n - (int.from_bytes(a, order) ^ int.from_bytes(b, order)).bit_length()) // 8


def _quoted(samples: tuple[_Sample, ...], data: bytes, enough: int = 1 << 62) -> int:
    """Bytes of the sampled peer message that ``data`` quotes: the longest run it shares with the
    message around one of its samples (0 if it holds none; at most 2 * RESTART_QUOTE + PROBE).

    ``enough``: stop measuring once a run reaches it and return that run (>= enough, <= the
    longest): what the restart decision needs, in one comparison for a whole quote (an echo).
    """
    longest = 0
    for before, sample, after in samples:
        at = data.find(sample)
        if at >= 0:
            end = at + PROBE
            run = PROBE + _common_run(after, data[end : end + len(after)], "big")
            if run < enough:
                run += _common_run(before, data[max(0, at - len(before)) : at], "little")
            if run >= enough:
                return run
            longest = max(longest, run)
    return longest


def _restart_quote(
    quotable: Iterable[tuple[_Sample, ...]], data: bytes
) -> tuple[bool, list[tuple[_Sample, ...]]]:
    """(whether ``data`` quotes at least RESTART_QUOTE bytes of the ``quotable`` peer messages in
    all, the messages it quotes at all). Once the total is reached the
    rest is not measured: a new frame drops every quotable message anyway, so only the decision
    is needed then."""
    quoting = []
    total = 0
    for entry in quotable:
        size = _quoted(entry, data, RESTART_QUOTE - total)
        if size:
            quoting.append(entry)
            total += size
            if total >= RESTART_QUOTE:
                return True, quoting
    return False, quoting


class HistoryContext:
    """Both directions of one endpoint, with shared history (a drop-in for the pair of a
    ContextCompressor and a ContextDecompressor: same compress/decompress signatures, with the
    header in front of the CRC-32)."""

    __slots__ = (
        "_acked",
        "_acks_since_frame",
        "_frame_started",
        "_history",
        "_last_sent",
        "_mirror",
        "_peer_frame_started",
        "_quotable",
        "_received_since_frame",
        "_received_since_send",
        "_sent",
        "_unacked",
        "_unacked_bytes",
        "_window",
        "receiver",
        "sender",
    )

    def __init__(
        self,
        window: int = DEFAULT_WINDOW,
        *,
        level: int = DEFAULT_LEVEL,
        dictionary: ZstdDictionary | None = None,
    ) -> None:
        self.sender = ContextCompressor(window, level=level, dictionary=dictionary)
        self.receiver = ContextDecompressor(window, dictionary=dictionary)
        self._window = window
        self._history = History(window)  # ours: what we sent and received, in our order
        self._mirror = History(window)  # the peer's, rebuilt from its counts
        self._unacked: deque[tuple[int, bytes]] = deque()  # (number, message) not yet counted by the peer
        # The samples of the peer's messages received since our frame began and not quoted in it
        # yet (see RESTART_QUOTE).
        self._quotable: deque[tuple[_Sample, ...]] = deque(maxlen=MAX_QUOTABLE)
        self.reset()

    def reset(self) -> None:
        """Forget everything (resume: both ends do this before anything is retransmitted)."""
        self.sender.reset()
        self.receiver.reset()
        self._history.clear()
        self._mirror.clear()
        self._unacked.clear()
        self._unacked_bytes = 0
        self._sent = 0  # our messages since the reset
        self._acked = 0  # of them, how many the peer said it received (sum of its counts)
        self._received_since_send = 0  # the count of our next message
        self._received_since_frame = 0  # the peer's messages since our frame began
        self._quotable.clear()
        self._last_sent = b""  # our last message: in the current frame's window (see _quoted)
        self._frame_started = False  # we have started a frame since the reset
        self._acks_since_frame = 0  # the peer's counts since its frame began (this message's too)
        self._peer_frame_started = False

    def compress(self, data: bytes, prefix: bytes = b"") -> bytes:
        """``prefix`` + header + CRC-32 + zstd bytes of one message."""
        # Something is quotable only if _received_since_frame > 0, the wire's rule for a new frame
        # (entries are added on receipt and all dropped when a frame starts).
        quoting: Sequence[tuple[_Sample, ...]]
        restart, quoting = _restart_quote(self._quotable, data) if self._quotable else _NO_QUOTE
        cost = len(data) + _ENTRY_COST
        excluded = self._unacked_bytes + cost > self._window
        value = self._received_since_send << 2 | excluded << 1 | restart
        header = _SMALL_HEADERS[value] if value < 0x80 else _header(value)
        if restart:
            # len(History) <= window: the wire's bound on a prefix (docs/CODECS.md section 8).
            primer = min(len(self._history), max(PREFIX_FLOOR, PREFIX_MULTIPLE * len(data)))
            self.sender.restart(self._history.tail(primer))
            header += _header(primer)
        payload = self.sender.compress(data, prefix + header)
        self._last_sent = data[-self._window :]
        self._sent += 1
        self._received_since_send = 0
        if restart or not self._frame_started:
            self._frame_started = True
            self._received_since_frame = 0
            self._quotable.clear()
        else:  # what this message quoted is in the current frame's window from now on
            for entry in quoting:
                self._quotable.remove(entry)
        if not excluded:
            self._history.append(data)
            if data:  # an empty message adds nothing to any history: nothing to keep
                self._unacked.append((self._sent, data))
                self._unacked_bytes += cost
        return payload

    def decompress(self, payload: bytes | memoryview, limit: int, offset: int = 0) -> bytes:
        """One message of the peer (at most ``limit`` bytes); DecodeError when it is corrupt or
        breaks the rules above (the session must end, as for any zstd context error)."""
        value, start = _read_header(payload, offset)
        count, excluded, new_frame = value >> 2, bool(value & _EXCLUDED), bool(value & _NEW_FRAME)
        if count > self._sent - self._acked:
            raise DecodeError(
                f"zstd shared-history message says it follows {count} of our messages, but only "
                f"{self._sent - self._acked} were unacknowledged"
            )
        self._acked += count
        self._acks_since_frame += count
        # Our messages the peer received before this one enter its history first.
        while self._unacked and self._unacked[0][0] <= self._acked:
            _, mine = self._unacked.popleft()
            self._mirror.append(mine)
            self._unacked_bytes -= len(mine) + _ENTRY_COST
        if new_frame:
            primer, start = _read_header(payload, start)
            if self._acks_since_frame < 1:
                raise DecodeError(
                    "zstd shared-history message starts a new frame without having received anything "
                    "since its previous frame began"
                )
            if not 0 < primer <= len(self._mirror):
                raise DecodeError(
                    f"zstd shared-history message primes its frame with {primer} bytes of history, "
                    f"but the history holds {len(self._mirror)}"
                )
            self.receiver.restart(self._mirror.tail(primer))
        out = self.receiver.decompress(payload, limit, start)
        if new_frame or not self._peer_frame_started:
            self._peer_frame_started = True
            self._acks_since_frame = 0
        self._received_since_send += 1
        self._received_since_frame += 1
        if not excluded:
            self._mirror.append(out)
            self._history.append(out)
            if len(out) >= PROBED_SIZE and (samples := _samples(out, self._last_sent)):
                self._quotable.append(samples)
        return out

    def retained_size(self) -> int:
        """Bytes of message history this endpoint holds: the two history buffers as allocated,
        and the unacknowledged messages with their per-message charge."""
        return self._history.memory_size() + self._mirror.memory_size() + self._unacked_bytes

    def memory_size(self) -> int:
        """zstd's reservations plus the retained history."""
        return self.sender.memory_size() + self.receiver.memory_size() + self.retained_size()
