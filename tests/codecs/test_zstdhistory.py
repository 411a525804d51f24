"""Shared history for session-context zstd: round trips over interleaved two-direction traffic
(messages crossing in flight, history evicted at its bound), the wire format, hostile headers."""

from __future__ import annotations

import random
import tracemalloc
import zlib

import pytest
import zstandard
from hypothesis import given, settings
from hypothesis import strategies as st

from m2mwire.codecs.jsonutil import dumps_compact
from m2mwire.codecs.zstdcontext import MIN_WINDOW, ContextCompressor, ContextDecompressor
from m2mwire.codecs.zstdhistory import (
    PROBE,
    PROBED_SIZE,
    RESTART_QUOTE,
    History,
    HistoryContext,
    _common_run,
    _quoted,
    _restart_quote,
    _samples,
)
from m2mwire.errors import DecodeError
from m2mwire.workloads import workload

WORDS = [f"w{i}".encode() for i in range(300)]


def _message(rng: random.Random, pool: list[bytes]) -> bytes:
    """New words, often with a quote of an earlier message of either side (what makes a prefix pay)."""
    parts = [b" ".join(rng.choice(WORDS) for _ in range(rng.randint(0, 80)))]
    if pool and rng.random() < 0.7:
        quoted = rng.choice(pool)
        start = rng.randrange(len(quoted) + 1)
        parts.insert(rng.randrange(2), quoted[start : start + rng.randint(0, 3000)])
    return b"|".join(parts)


# An operation: (0, side) = that side sends a message; (1, side) = the oldest message in flight
# towards that side arrives.
OPS = st.lists(st.tuples(st.integers(0, 1), st.integers(0, 1)), max_size=120)


@settings(max_examples=60, deadline=None)
@given(ops=OPS, seed=st.integers(0, 2**32 - 1), window_log=st.integers(10, 13))
def test_interleaved_conversations_round_trip_within_the_bound(
    ops: list[tuple[int, int]], seed: int, window_log: int
) -> None:
    """Both sides send at any time, messages cross in flight, and every message still decodes to
    what was sent, in order; small windows (1-8 KiB) make histories evict and messages be excluded."""
    window = 1 << window_log
    rng = random.Random(seed)
    ends = [HistoryContext(window), HistoryContext(window)]
    in_flight: list[list[tuple[bytes, bytes]]] = [[], []]  # towards side i: (payload, message)
    pool: list[bytes] = []
    delivered = 0

    def arrive(side: int) -> None:
        nonlocal delivered
        payload, message = in_flight[side].pop(0)
        assert ends[side].decompress(payload, 1 << 20) == message
        delivered += 1

    for op, side in ops:
        if op == 0:
            message = _message(rng, pool)
            pool.append(message)
            in_flight[1 - side].append((ends[side].compress(message), message))
        elif in_flight[side]:
            arrive(side)
        for end in ends:  # history < 2 windows each, unacknowledged <= 1 window
            assert end.retained_size() <= 5 * window
    for side in (0, 1):
        while in_flight[side]:
            arrive(side)
    assert delivered == len(pool)


def _frames(messages: list[tuple[str, bytes]], shared: bool) -> list[bytes]:
    """Every payload of a strict request/response exchange, checked on arrival."""
    if shared:
        ends = {"client": HistoryContext(), "server": HistoryContext()}
        peer = {"client": ends["server"], "server": ends["client"]}
        out = []
        for sender, message in messages:
            payload = ends[sender].compress(message)
            assert peer[sender].decompress(payload, 1 << 24) == message
            out.append(payload)
        return out
    compressors = {s: ContextCompressor() for s in ("client", "server")}
    decompressors = {s: ContextDecompressor() for s in ("client", "server")}
    out = []
    for sender, message in messages:
        payload = compressors[sender].compress(message)
        assert decompressors[sender].decompress(payload, 1 << 24) == message
        out.append(payload)
    return out


def _workload(name: str) -> list[tuple[str, bytes]]:
    return [(s, (c if isinstance(c, str) else dumps_compact(c)).encode()) for s, c in workload(name)]


def test_a_reply_quoted_in_the_next_request_is_not_paid_twice() -> None:
    """The multi-turn chat resends each reply inside the next request: with shared history the
    request finds the reply in its prefix (CODECS.md section 8: 9.5 % -> 6.9 % of the bytes)."""
    messages = _workload("multi_turn")
    per_direction = sum(len(p) for p in _frames(messages, shared=False))
    shared = sum(len(p) for p in _frames(messages, shared=True))
    assert shared < 0.8 * per_direction


def _varint(data: bytes, pos: int) -> tuple[int, int]:
    value = shift = 0
    while data[pos] & 0x80:
        value |= (data[pos] & 0x7F) << shift
        pos, shift = pos + 1, shift + 7
    return value | data[pos] << shift, pos + 1


def test_wire_format_a_third_implementation_can_decode() -> None:
    """header varint (count << 2 | excluded << 1 | new_frame [, prefix length]) + CRC-32 + zstd;
    a new frame is a plain zstd frame whose raw-content dictionary is the history's tail."""
    client, server = HistoryContext(), HistoryContext()
    request = b'{"messages":["what is in file_7.py?"]}'
    lines = "; ".join(f"line {i} reads key_{i * 37 % 101} from the configuration" for i in range(16))
    reply = b'{"answer":"file_7.py: ' + lines.encode() + b'"}'
    assert len(reply) >= 512  # sampled (PROBED_SIZE), and quoting all of it (>= RESTART_QUOTE) starts a frame
    follow = b'{"messages":["what is in file_7.py?",' + reply + b',"and file_8.py?"]}'
    first = client.compress(request)
    assert first[0] == 0  # count 0, kept in the history, continues (starts) the first frame
    assert int.from_bytes(first[1:5], "big") == zlib.crc32(request)
    assert server.decompress(first, 1 << 20) == request
    answer = server.compress(reply)
    assert client.decompress(answer, 1 << 20) == reply
    payload = client.compress(follow)
    value, pos = _varint(payload, 0)
    assert value == 1 << 2 | 1  # one message received since our previous one; a new frame
    prefix_length, pos = _varint(payload, pos)
    history = request + reply  # the client's history in its order; the prefix is its tail
    assert prefix_length == len(history)
    assert int.from_bytes(payload[pos : pos + 4], "big") == zlib.crc32(follow)
    primer = zstandard.ZstdCompressionDict(history[-prefix_length:], dict_type=zstandard.DICT_TYPE_RAWCONTENT)
    plain = zstandard.ZstdDecompressor(dict_data=primer).decompressobj()
    assert plain.decompress(payload[pos + 4 :]) == follow
    assert server.decompress(payload, 1 << 20) == follow


def _talk(a: HistoryContext, b: HistoryContext, text: bytes) -> bytes:
    return b.decompress(a.compress(text), 1 << 20)


def test_hostile_headers_are_decode_errors() -> None:
    a, b = HistoryContext(), HistoryContext()
    _talk(a, b, b"hello there, how are you today?")
    # b has sent nothing: a message claiming to follow one of b's messages is impossible.
    with pytest.raises(DecodeError, match="unacknowledged"):
        b.decompress(bytes([1 << 2]) + a.compress(b"x")[1:], 1 << 20)
    a, b = HistoryContext(), HistoryContext()
    # a new frame although the sender received nothing since its frame began
    with pytest.raises(DecodeError, match="without having received"):
        b.decompress(bytes([1, 4]) + zlib.crc32(b"").to_bytes(4, "big"), 1 << 20)
    a, b = HistoryContext(), HistoryContext()
    _talk(b, a, b"a short message from b")  # a received one: a new frame is allowed, but ...
    forged = bytes([1 << 2 | 1, 0x7F]) + zlib.crc32(b"").to_bytes(4, "big")  # ... 127 bytes of prefix
    with pytest.raises(DecodeError, match="history holds"):
        b.decompress(forged, 1 << 20)
    with pytest.raises(DecodeError, match="truncated"):
        HistoryContext().decompress(b"\x80\x80", 1 << 20)


def test_unacknowledged_messages_are_excluded_past_one_window() -> None:
    """A peer that never answers cannot make us keep more than a window of what we sent: later
    messages are flagged excluded (neither side puts them in a history) and still decode."""
    window = MIN_WINDOW * 4
    a, b = HistoryContext(window), HistoryContext(window)
    flags = []
    for i in range(40):
        text = f"message {i} ".encode() * 20
        payload = a.compress(text)
        flags.append(bool(payload[0] & 2))
        assert b.decompress(payload, 1 << 20) == text
        assert a.retained_size() <= 3 * window
    assert not flags[0] and flags[-1]
    # once b answers, a's messages are acknowledged and a keeps history again
    _talk(b, a, b"message 39 " * 20)
    assert not a.compress(b"message 40 " * 20)[0] & 2


def test_a_count_includes_excluded_messages_and_only_kept_ones_enter_the_mirror() -> None:
    """docs/CODECS.md section 8's example (a clean-room client got this wrong from the old text):
    B sends b1, b2 (kept), b3, b4 (excluded); A's next message says count 4, and a frame A then
    primes with its history holds b1 and b2, not b3 and b4: B decodes it with its mirror."""
    window = MIN_WINDOW * 4
    a, b = HistoryContext(window), HistoryContext(window)
    big = [bytes([65 + i]) * (window // 2 - 200) for i in range(4)]  # two fit under the window, then none
    flags = []
    for text in big:
        payload = b.compress(text)
        flags.append(bool(payload[0] & 2))
        assert a.decompress(payload, 1 << 20) == text
    assert flags == [False, False, True, True]
    quote = big[1][:700] + b" and that is all"  # quotes b2, which is in A's history
    payload = a.compress(quote)
    value, pos = _varint(payload, 0)
    assert value >> 2 == 4  # every message B sent counts, excluded ones too
    assert value & 1  # a new frame primed with A's history: b1 + b2 (+ nothing of b3, b4)
    prefix_length, _ = _varint(payload, pos)
    assert prefix_length == len(big[0]) + len(big[1])
    assert b.decompress(payload, 1 << 20) == quote


def test_history_keeps_the_last_bytes_of_the_concatenation() -> None:
    h = History(10)
    joined = b""
    for part in (b"abc", b"", b"defgh", b"ijklmnopqrstuv", b"wx", b"y"):
        h.append(part)
        joined += part
        assert h.tail(len(h)) == joined[-len(h) :] and len(h) < 20
        assert h.tail(min(len(h), 10)) == joined[-10:][-min(len(h), 10) :]


def test_a_history_of_tiny_messages_holds_its_bytes_not_an_object_per_message() -> None:
    """A peer sending 2-byte messages made each history keep a bytes object per message (~50
    bytes of memory per 2 bytes of history, and a prefix built by walking them all: ~50 ms for a
    1 MiB window, on every message flagged new_frame). One buffer holds < 2 x limit bytes."""
    limit = 16 * 1024
    h = History(limit)
    joined = bytearray()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        for i in range(40_000):
            part = b"%02d" % (i % 100)
            h.append(part)
            joined += part
        held = tracemalloc.get_traced_memory()[0] - before - joined.__alloc__()
    finally:
        tracemalloc.stop()
    assert len(h) == limit and h.tail(limit) == joined[-limit:]
    assert held < 2 * limit + 4096, f"{held} bytes held for a {limit}-byte history"
    assert h.memory_size() < 2 * limit + 4096


def test_a_history_never_offers_more_than_its_limit_as_a_prefix() -> None:
    h = History(1024)
    h.append(b"x" * 700)
    h.append(b"y" * 700)  # 1,400 appended: the last 1,024 are what a prefix may use
    assert len(h) == 1024 and h.tail(1024) == b"x" * 324 + b"y" * 700
    h.append(b"z" * 5000)
    assert len(h) == 1024 and h.tail(1024) == b"z" * 1024


def test_reset_on_both_ends_starts_over() -> None:
    a, b = HistoryContext(), HistoryContext()
    for i in range(3):
        _talk(a, b, f"request {i} with some words".encode())
        _talk(b, a, f"reply {i} quoting request {i} with some words".encode())
    a.reset()
    b.reset()
    assert a.retained_size() == b.retained_size() == 0
    assert _talk(a, b, b"request 3 with some words") == b"request 3 with some words"


def _text(seed: int, size: int) -> bytes:
    """``size`` bytes of words that occur nowhere else (a quote of them can only be a quote)."""
    rng = random.Random(seed)
    return b" ".join(rng.choice(WORDS) + b"x%d" % seed for _ in range(size))[:size]


def test_a_frame_restarts_only_for_a_large_fresh_quote() -> None:
    """The sender's policy (CODECS.md section 8): a restart costs a fixed ~20 us, so a small quote
    of the peer continues the frame (an agent loop's tool call); a quote of 512 bytes or more of the
    peer's content not yet in the frame starts one; quoting it again later does not."""
    client, server = HistoryContext(), HistoryContext()
    _talk(client, server, b'{"messages":["start"]}')
    first = _text(1, 2000)
    assert _talk(server, client, first) == first
    middle = len(first) // 2  # the sample from the middle, with less than 512 bytes around it
    small = b'{"messages":["start","' + first[middle - 100 : middle + 200] + b'"]}'
    payload = client.compress(small)
    assert payload[0] & 1 == 0, "a 300-byte quote continues the frame"
    assert server.decompress(payload, 1 << 20) == small
    second = _text(2, 2000)
    assert _talk(server, client, second) == second
    large = b'{"messages":["start","' + second + b'"]}'
    payload = client.compress(large)
    assert payload[0] & 1 == 1, "a 2,000-byte quote of fresh peer content starts a frame"
    assert server.decompress(payload, 1 << 20) == large
    assert _talk(server, client, b"ok") == b"ok"  # a received message: a new frame is allowed again
    again = large[:-2] + b',"ok"]}'
    payload = client.compress(again)
    assert payload[0] & 1 == 0, "what the frame quoted already is not fresh: no restart"
    assert server.decompress(payload, 1 << 20) == again


def _naive_quoted(message: bytes, data: bytes) -> int:
    """The quote measure of RESTART_QUOTE's comment, byte by byte (the general definition)."""
    longest = 0
    size = len(message)
    for at in (size // 2, size * 3 // 4):
        sample = message[at : at + PROBE]
        found = data.find(sample)
        if found < 0:
            continue
        back = 0
        while back < RESTART_QUOTE and at - back > 0 and found - back > 0:
            if message[at - back - 1] != data[found - back - 1]:
                break
            back += 1
        ahead, end, found_end = 0, at + PROBE, found + PROBE
        while ahead < RESTART_QUOTE and end + ahead < size and found_end + ahead < len(data):
            if message[end + ahead] != data[found_end + ahead]:
                break
            ahead += 1
        longest = max(longest, back + PROBE + ahead)
    return longest


_PIECES = [b"a", b"ab", b"abc", b"x" * 40, b'","type":"function"', b"\0", b"w1 ", b"w2 "]


def _text(seed: int, size: int) -> bytes:
    """``size`` bytes of a small vocabulary: samples recur, so partial quotes and near misses happen."""
    rng = random.Random(seed)
    out = b""
    while len(out) < size:
        out += rng.choice(_PIECES) if rng.random() < 0.7 else rng.randbytes(rng.randint(1, 30))
    return out[:size]


@settings(max_examples=200, deadline=None)
@given(
    peers=st.lists(st.tuples(st.integers(0, 2**32 - 1), st.integers(0, 3000)), min_size=1, max_size=4),
    quotes=st.lists(st.tuples(st.integers(0, 3), st.integers(0, 2**16), st.integers(0, 1500)), max_size=4),
    noise=st.tuples(st.integers(0, 2**32 - 1), st.integers(0, 400)),
)
def test_restart_decision_matches_the_full_measure(
    peers: list[tuple[int, int]], quotes: list[tuple[int, int, int]], noise: tuple[int, int]
) -> None:
    """Differential: _restart_quote (stops measuring once RESTART_QUOTE is reached) decides as the
    byte-by-byte measure of every quotable message would, and names the same quoted messages when
    it does not restart (those leave the quotable set)."""
    messages = [_text(seed, size) for seed, size in peers]
    filler = _text(*noise)
    data = filler
    for which, start, length in quotes:  # quotes of the peer messages, with filler between them
        message = messages[which % len(messages)]
        begin = start % (len(message) + 1)
        data += message[begin : begin + length] + filler[: start % 50]
    sized = [(_samples(message), message) for message in messages if len(message) >= PROBED_SIZE]
    quotable = [entry for entry, _ in sized]
    sizes = [_naive_quoted(message, data) for _, message in sized]
    restart, quoting = _restart_quote(quotable, data)
    assert restart == (sum(sizes) >= RESTART_QUOTE)
    if not restart:
        assert quoting == [entry for (entry, _), size in zip(sized, sizes, strict=True) if size]
    for (entry, _), size in zip(sized, sizes, strict=True):
        assert _quoted(entry, data) == size


@given(a=st.binary(max_size=600), b=st.binary(max_size=600), shared=st.binary(max_size=600))
def test_common_run_counts_equal_bytes_at_either_end(a: bytes, b: bytes, shared: bytes) -> None:
    def naive(x: bytes, y: bytes) -> int:
        n = 0
        while n < min(len(x), len(y)) and x[n] == y[n]:
            n += 1
        return n

    assert _common_run(shared + a, shared + b, "big") == naive(shared + a, shared + b)
    assert _common_run(a + shared, b + shared, "little") == naive((a + shared)[::-1], (b + shared)[::-1])


def _echo(messages: list[bytes]) -> tuple[int, int]:
    """(frames the server's echoes started, wire bytes of those echoes) over a client that sends
    ``messages`` and a server that echoes each one back."""
    client, server = HistoryContext(), HistoryContext()
    started = size = 0
    for message in messages:
        assert server.decompress(client.compress(message), 1 << 20) == message
        echo = server.compress(message)
        assert client.decompress(echo, 1 << 20) == message
        started += echo[0] & 1  # new_frame: the header's low bit (one-byte header here)
        size += len(echo)
    return started, size


def test_an_echo_restarts_frames_only_for_text_its_own_frame_lacks() -> None:
    """Regression: an echo quotes the whole request, so every echoed message started a new frame
    (a fresh prefix to index on both ends, most of an echoed 1 KB round trip's codec time) even
    when the text was the same JSON with a few new words, which the echoer's own frame already
    matches. A peer sample found in our last message no longer counts as a fresh quote: the
    agent-like echo keeps its frame; novel text still restarts (and costs ~nothing on the wire)."""
    rng = random.Random(3)
    agent = [
        dumps_compact(
            {
                "task": "t-8812",
                "step": i,
                "note": b" ".join(rng.choices(WORDS, k=8)).decode(),
                "history": "the same context as before, " * 34,
            }
        ).encode()
        for i in range(30)
    ]
    started, _ = _echo(agent)
    assert started <= 1
    novel = [b" ".join(rng.choices(WORDS, k=250))[:1024] for _ in range(30)]
    started, size = _echo(novel)
    assert started == len(novel) and size < 30 * 64


def _samples_by_search(message: bytes, own: bytes = b"") -> tuple[tuple[bytes, bytes, bytes], ...]:
    """_samples as first written (the search alone): the reference for its shortcuts."""
    size = len(message)
    out = []
    for at in (size // 2, size * 3 // 4):
        end = at + PROBE
        sample = message[at:end]
        if own.find(sample, max(0, at - RESTART_QUOTE), end + RESTART_QUOTE) < 0:
            out.append((message[max(0, at - RESTART_QUOTE) : at], sample, message[end : end + RESTART_QUOTE]))
    return tuple(out)


@settings(max_examples=300, deadline=None)
@given(
    seed=st.integers(0, 2**32 - 1),
    size=st.integers(PROBED_SIZE, 3000),
    edits=st.lists(st.tuples(st.integers(0, 2), st.integers(0, 2**16), st.integers(0, 700)), max_size=3),
)
def test_samples_shortcuts_answer_as_the_search(
    seed: int, size: int, edits: list[tuple[int, int, int]]
) -> None:
    """Differential: _samples' shortcuts (the sample at the same place, or at the same distance
    from the end, of our last message) leave out exactly the samples the search alone leaves out,
    for our last message an echo, the same with text inserted, deleted or replaced anywhere
    (shifts within and beyond RESTART_QUOTE, either sign), or unrelated."""
    rng = random.Random(seed)
    message = _text(seed, size)
    own = message
    for op, where, length in edits:
        at = where % (len(own) + 1)
        if op == 0:
            own = own[:at] + rng.randbytes(length) + own[at:]
        elif op == 1:
            own = own[:at] + own[at + length :]
        else:
            own = own[:at] + rng.randbytes(length) + own[at + length :]
    for last in (own, message, b"", _text(seed + 1, size), message[: size // 2]):
        assert _samples(message, last) == _samples_by_search(message, last)


class _CountingFinds(bytes):
    finds = 0

    def find(self, *args: object) -> int:  # type: ignore[override]
        type(self).finds += 1
        return super().find(*args)  # type: ignore[arg-type]


def test_samples_of_an_echo_or_a_same_shape_reply_search_nothing() -> None:
    """Regression (cost): every received message >= 512 bytes searched our last message twice
    (up to 1,152 bytes each, ~0.3 us apiece: a third of shared history's bookkeeping per 1 KB
    message). An echo (the sample at the same place) and a reply of the same JSON shape with a
    few words changed before the samples (the same distance from the end) now take one
    comparison each; anything else still searches."""
    filler = "the same context as before, " * 34
    first = dumps_compact({"step": 1, "note": "a short note", "history": filler}).encode()
    second = dumps_compact(
        {"step": 2, "note": "a much longer note, with more words", "history": filler}
    ).encode()
    for message, own in ((first, first), (second, first), (first, second)):
        _CountingFinds.finds = 0
        assert _samples(message, _CountingFinds(own)) == ()
        assert _CountingFinds.finds == 0
    _samples(first, _CountingFinds(_text(5, len(first))))
    assert _CountingFinds.finds == 2  # unrelated text: both samples are searched for
