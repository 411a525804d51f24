"""SendBuffer (m2mwire/transport/quic/sendbuffer.py) against the bytearray it replaces in aioquic's
stream sender, and on a real QUIC connection."""

from __future__ import annotations

import asyncio
import tracemalloc

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from m2mwire.transport.quic import compat, connect_quic
from m2mwire.transport.quic.sendbuffer import SendBuffer
from tests.transport.quicpeers import quic_server

# An operation: ("add", kind, size) appends bytes / a view of bytes / a bytearray / a view of a
# bytearray; ("get", a, b) takes a slice (a and b as fractions of the length); ("del", n) drops
# the front (n as a fraction of the length).
_ADD = st.tuples(
    st.just("add"),
    st.sampled_from(["bytes", "bytes-view", "bytearray", "bytearray-view"]),
    st.one_of(st.integers(0, 40), st.integers(4000, 20000), st.integers(60000, 70000)),
)
_GET = st.tuples(st.just("get"), st.floats(0, 1), st.floats(0, 1))
_DEL = st.tuples(st.just("del"), st.floats(0, 1))


def _data(kind: str, size: int, seed: int) -> bytes | bytearray | memoryview:
    raw = bytes((seed + i) % 251 for i in range(size))
    if kind == "bytes":
        return raw
    if kind == "bytes-view":
        return memoryview(b"##" + raw + b"##")[2 : 2 + size]
    if kind == "bytearray":
        return bytearray(raw)
    return memoryview(bytearray(raw))


@settings(max_examples=150, deadline=None)
@given(st.lists(st.one_of(_ADD, _GET, _DEL), max_size=60))
def test_send_buffer_behaves_as_the_bytearray_it_replaces(ops: list[tuple[object, ...]]) -> None:
    ours, theirs = SendBuffer(), bytearray()
    for step, op in enumerate(ops):
        if op[0] == "add":
            data = _data(str(op[1]), int(op[2]), step)  # type: ignore[call-overload]
            ours += data
            theirs += data
            if isinstance(data, memoryview) and isinstance(data.obj, bytearray):
                data.obj[:] = bytes(len(data.obj))  # the caller reuses its buffer: no effect on ours
        elif op[0] == "get":
            a, b = sorted(int(float(f) * len(theirs)) for f in op[1:])  # type: ignore[arg-type]
            got = ours[a:b]
            assert type(got) is bytes and got == bytes(theirs[a:b])
        else:
            n = int(float(op[1]) * len(theirs))  # type: ignore[arg-type]
            del ours[:n]
            del theirs[:n]
        assert len(ours) == len(theirs)
    assert ours[0 : len(ours)] == bytes(theirs)


def test_large_immutable_writes_are_kept_by_reference_and_acks_copy_nothing() -> None:
    """The bytearray copied everything it held whenever it grew after a front deletion: with 4 MiB
    in flight, 8 bytes copied per byte sent. Here a window's worth of 64 KiB writes, acknowledged
    from the front as more are written, allocates nothing of the window's size."""
    messages = [bytes([i % 256]) * 65536 for i in range(64)]  # 4 MiB in flight
    buffer = SendBuffer()
    for m in messages:
        buffer += m
    assert buffer[0:65536] is messages[0]  # held as written: a whole chunk is not even copied
    more = [bytes([i % 256]) * 65536 for i in range(64)]
    tracemalloc.start()
    try:
        for m in more:
            buffer += m
            del buffer[:65536]
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 64 * 1024  # a bytearray reallocates and copies ~4.5 MiB here, several times
    assert len(buffer) == 64 * 65536 and buffer[0:65536] is more[0]
    with pytest.raises(TypeError, match="front"):
        del buffer[10:20]


async def test_a_quic_stream_sends_through_a_send_buffer() -> None:
    """compat.write gives each stream's sender a SendBuffer; messages of every size still arrive."""
    async with quic_server() as server:
        conn = await connect_quic("127.0.0.1", server.port, fingerprint=server.fingerprint)
        try:
            channel = await conn.open_channel()
            for size in (1, 9000, 65536, 1 << 20):
                payload = bytes(i % 253 for i in range(size))
                await channel.send(payload)
                assert await asyncio.wait_for(channel.recv(), 10) == payload
            stream = channel._stream
            assert stream is not None
            assert type(stream.sender._buffer) is SendBuffer
            assert compat.unacked(stream) == len(stream.sender._buffer)
        finally:
            await conn.close()
