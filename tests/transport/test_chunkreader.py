"""ChunkReader against websockets' own StreamReader: same reads, same results, same errors."""

from __future__ import annotations

import itertools
from collections.abc import Callable, Generator
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from websockets.streams import StreamReader

from m2mwire.transport.chunkreader import ChunkReader

Op = tuple[str, int]


def _drive(reader: StreamReader, gen: Generator[None, None, Any], feeds: list[bytes]) -> tuple[Any, ...]:
    """Run one read to completion, feeding the next chunk (then EOF) each time it waits."""
    for _ in range(len(feeds) + 2):  # each wait consumes a chunk or the EOF
        try:
            next(gen)
        except StopIteration as stop:
            value = stop.value
            return ("ok", bytes(value) if isinstance(value, bytes | bytearray | memoryview) else value)
        except (EOFError, RuntimeError, ValueError) as exc:
            return ("error", type(exc).__name__, str(exc))
        if feeds:
            reader.feed_data(feeds.pop(0))
        else:
            reader.feed_eof()
    raise AssertionError("the read kept waiting after EOF")


def _run(reader: StreamReader, ops: list[Op], chunks: list[bytes]) -> list[tuple[Any, ...]]:
    feeds = list(chunks)
    calls: dict[str, Callable[[int], Generator[None, None, Any]]] = {
        "exact": reader.read_exact,
        "line": reader.read_line,
        "to_eof": reader.read_to_eof,
        "at_eof": lambda _n: reader.at_eof(),
    }
    results = []
    for name, n in ops:
        if name == "discard":
            reader.discard()
            results.append(("discarded",))
            continue
        result = _drive(reader, calls[name](n), feeds)
        results.append(result)
        if result[0] == "error":
            break
    return results


_PIECES = [b"a", b"b", b"\n", b"\r\n", b"xyz" * 5, bytes(range(256)), bytes(range(255, -1, -1)) * 24]
data_st = st.lists(st.sampled_from(_PIECES), max_size=30).map(b"".join)
ops_st = st.lists(
    st.one_of(
        st.tuples(st.just("exact"), st.integers(0, 300) | st.integers(4000, 6000)),  # payload-sized too
        st.tuples(st.just("line"), st.integers(1, 300)),
        st.tuples(st.just("at_eof"), st.just(0)),
        st.tuples(st.just("discard"), st.just(0)),
    ),
    max_size=12,
).map(lambda ops: [*ops, ("to_eof", 10_000)])


@settings(max_examples=400, deadline=None)
@given(data=data_st, cuts=st.lists(st.integers(0, 2000), max_size=12), ops=ops_st)
def test_reads_match_websockets_stream_reader(data: bytes, cuts: list[int], ops: list[Op]) -> None:
    bounds = sorted({c % (len(data) + 1) for c in cuts} | {0, len(data)})
    chunks = [data[a:b] for a, b in itertools.pairwise(bounds)]
    assert _run(ChunkReader(), ops, chunks) == _run(StreamReader(), ops, chunks)


def test_read_inside_one_chunk_is_a_slice_and_a_whole_chunk_is_not_copied() -> None:
    reader = ChunkReader()
    frame = bytes(range(200))
    reader.feed_data(frame)
    assert _drive(reader, reader.read_exact(10), []) == ("ok", frame[:10])
    whole = bytes(1000)
    reader.feed_data(whole)
    gen = reader.read_exact(190)
    try:
        next(gen)
    except StopIteration as stop:
        assert stop.value == frame[10:]
    gen = reader.read_exact(1000)
    try:
        next(gen)
    except StopIteration as stop:
        assert stop.value is whole  # no copy


def test_line_arriving_a_byte_at_a_time_and_over_the_limit() -> None:
    reader = ChunkReader()
    line = b"GET / HTTP/1.1\r\n"
    assert _drive(reader, reader.read_line(100), [bytes([b]) for b in line]) == ("ok", line)
    reader = ChunkReader()
    result = _drive(reader, reader.read_line(8), [b"abcd", b"efgh", b"ijkl\n"])
    assert result[:2] == ("error", "RuntimeError")


def test_payload_sized_reads_are_views_of_the_chunk_with_the_right_bytes() -> None:
    data = bytes(range(256)) * 40
    reader = ChunkReader()
    reader.feed_data(data)
    assert _drive(reader, reader.read_exact(2), []) == ("ok", data[:2])
    gen = reader.read_exact(5000)  # inside the chunk
    try:
        next(gen)
    except StopIteration as stop:
        assert isinstance(stop.value, memoryview) and stop.value == data[2:5002]
    gen = reader.read_exact(len(data) - 5002)  # the rest of the chunk
    try:
        next(gen)
    except StopIteration as stop:
        assert isinstance(stop.value, memoryview) and stop.value == data[5002:]
    assert _drive(reader, reader.at_eof(), []) == ("ok", True)


@pytest.mark.parametrize("chunk_first", [True, False])
def test_bulk_hook_fires_once_after_a_large_chunk_and_a_large_read_that_waits(chunk_first: bool) -> None:
    calls: list[int] = []
    reader = ChunkReader(bulk_chunk=100, bulk_read=50, on_bulk=lambda: calls.append(1))
    reader.feed_data(b"x" * 99)  # neither threshold
    assert _drive(reader, reader.read_exact(49), []) == ("ok", b"x" * 49)
    assert _drive(reader, reader.read_exact(50), []) == ("ok", b"x" * 50)  # large, but no wait
    assert calls == []
    if chunk_first:
        reader.feed_data(b"y" * 100)
        assert calls == []
        assert _drive(reader, reader.read_exact(150), [b"z" * 50]) == ("ok", b"y" * 100 + b"z" * 50)
    else:
        assert _drive(reader, reader.read_exact(60), [b"w" * 60]) == ("ok", b"w" * 60)
        assert calls == []
        reader.feed_data(b"y" * 150)
        assert _drive(reader, reader.read_exact(150), []) == ("ok", b"y" * 150)
    assert calls == [1]
    reader.feed_data(b"q" * 500)  # past both thresholds again: no second call
    assert _drive(reader, reader.read_exact(600), [b"r" * 100]) == ("ok", b"q" * 500 + b"r" * 100)
    assert calls == [1]
