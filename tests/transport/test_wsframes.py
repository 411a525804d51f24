"""The data-frame fast paths (m2mwire.transport.wsframes, used by websockets_compat) against
websockets' own frame parser and serializer, as pure functions and inside live connections."""

from __future__ import annotations

import asyncio
import itertools
import types
from collections.abc import Generator
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from websockets.asyncio.connection import Connection
from websockets.exceptions import PayloadTooBig, ProtocolError
from websockets.frames import Frame, Opcode
from websockets.streams import StreamReader

from m2mwire.transport.websocket import WebSocketChannel, connect_websocket, serve_websocket
from m2mwire.transport.wsframes import data_frame, parse_data_frames

# Sizes around every boundary of the frame header (7-bit, 16-bit, 64-bit lengths) and of the
# masking view (4 KiB).
SIZES = [0, 1, 5, 125, 126, 127, 300, 4095, 4096, 5000, 65535, 65536, 70000]


def _payload(size: int, seed: int) -> bytes:
    if seed % 3 == 0:  # looks like whole frames itself: a parser that starts mid-frame takes them
        return (b"\x81\x03abc\x82\x00" * (size // 7 + 1))[:size]
    return bytes((seed + i) % 256 for i in range(size)) if size < 300 else bytes([seed % 256]) * size


@given(
    st.sampled_from(SIZES),
    st.integers(0, 255),
    st.booleans(),
    st.booleans(),
    st.sampled_from([bytes, bytearray, memoryview]),
)
@settings(max_examples=150, deadline=None)
def test_data_frame_is_what_websockets_serializes(
    size: int, seed: int, text: bool, mask: bool, kind: type[Any]
) -> None:
    payload = _payload(size, seed)
    ours = data_frame(kind(payload), text, mask)
    key = b""
    if mask:  # websockets draws its own key: give it ours to compare byte for byte
        header = 2 if size < 126 else 4 if size < 65536 else 10
        key = ours[header : header + 4]
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr("websockets.frames.secrets", types.SimpleNamespace(token_bytes=lambda n: key))
        theirs = Frame(Opcode.TEXT if text else Opcode.BINARY, payload).serialize(mask=mask)
    assert ours == theirs


def _frame_bytes(opcode: Opcode, payload: bytes, fin: bool, masked: bool, tweak: int) -> bytes:
    """A frame as websockets writes it; ``tweak`` sets RSV bits or a reserved opcode in its first
    byte (something websockets' parser refuses), or 0."""
    if opcode in (Opcode.PING, Opcode.PONG):
        payload, fin = payload[:125], True  # valid control frames
    raw = Frame(opcode, payload, fin).serialize(mask=masked)
    return bytes([raw[0] | tweak]) + raw[1:] if tweak else raw


def _run(gen: Generator[None, None, Any]) -> Any:
    try:
        while True:
            next(gen)
    except StopIteration as stop:
        return stop.value


def _websockets_data_frames(
    stream: bytes, masked: bool, limit: int | None
) -> tuple[list[tuple[bytes, bool]], int]:
    """The leading whole final text/binary frames of ``stream`` under 64 KiB, by websockets' parser."""
    reader = StreamReader()
    reader.feed_data(stream)
    reader.feed_eof()
    got: list[tuple[bytes, bool]] = []
    consumed = 0
    while True:
        try:
            frame = _run(Frame.parse(reader.read_exact, mask=masked, max_size=limit, extensions=[]))
        except (EOFError, ProtocolError, PayloadTooBig):
            return got, consumed
        if not frame.fin or frame.opcode not in (Opcode.TEXT, Opcode.BINARY) or len(frame.data) >= 65536:
            return got, consumed
        got.append((bytes(frame.data), frame.opcode is Opcode.TEXT))
        consumed = len(stream) - len(reader.buffer)


# A message: (kind, payload size, fragments). Mostly whole text and binary messages, as sessions
# send them, with fragmented ones, PINGs and PONGs between them, and now and then a frame that
# websockets refuses (RSV bits, a reserved opcode, the wrong masking, a stray continuation).
# "first" is the first fragment of a message whose continuation never comes.
KINDS = ["text"] * 8 + ["binary"] * 8 + ["ping", "pong", "rsv", "opcode", "mask", "cont", "first"]
messages = st.lists(
    st.tuples(st.sampled_from(KINDS), st.sampled_from(SIZES), st.integers(1, 3)), min_size=1, max_size=8
)


def _frames(spec: list[tuple[str, int, int]], masked: bool, seed: int) -> list[bytes]:
    out = []
    for i, (kind, size, fragments) in enumerate(spec):
        payload = _payload(size, seed + i)
        if kind in ("text", "binary"):
            step = -(-size // fragments) or 1
            parts = [payload[j : j + step] for j in range(0, size, step)] or [b""]
            for j, part in enumerate(parts):
                opcode = (Opcode.TEXT if kind == "text" else Opcode.BINARY) if j == 0 else Opcode.CONT
                out.append(_frame_bytes(opcode, part, j == len(parts) - 1, masked, 0))
        elif kind in ("ping", "pong"):
            out.append(_frame_bytes(Opcode.PING if kind == "ping" else Opcode.PONG, payload, True, masked, 0))
        elif kind == "cont":
            out.append(_frame_bytes(Opcode.CONT, payload, True, masked, 0))
        elif kind == "first":
            out.append(_frame_bytes(Opcode.TEXT, payload, False, masked, 0))
        else:
            wrong_mask = not masked if kind == "mask" else masked
            tweak = {"rsv": 0x40, "opcode": 0x03, "mask": 0}[kind]
            out.append(_frame_bytes(Opcode.BINARY, payload, True, wrong_mask, tweak))
    return out


def _stream(spec: list[tuple[str, int, int]], masked: bool, seed: int) -> bytes:
    return b"".join(_frames(spec, masked, seed))


@given(
    messages, st.booleans(), st.sampled_from([None, 200, 5000]), st.integers(0, 400_000), st.integers(0, 255)
)
@settings(max_examples=300, deadline=None)
def test_parse_data_frames_takes_what_websockets_parses_as_whole_data_frames(
    spec: list[tuple[str, int, int]], masked: bool, limit: int | None, cut: int, seed: int
) -> None:
    stream = _stream(spec, masked, seed)
    stream = stream[: cut % (len(stream) + 1)]  # cut anywhere, the end included
    got: list[tuple[bytes, bool]] = []
    consumed = parse_data_frames(stream, masked, limit, lambda data, text: got.append((bytes(data), text)))
    assert (got, consumed) == _websockets_data_frames(stream, masked, limit)
    assert all(type(data) is bytes for data, _ in got) or not got


# -- inside live connections: the fast path (DataFrameHook.data_received) vs websockets' own ------


class _Peers:
    """Two client channels and the two server channels they reach, all live on 127.0.0.1."""

    def __init__(self) -> None:
        self.server_side: list[WebSocketChannel] = []
        self.done = asyncio.Event()

    async def handler(self, channel: WebSocketChannel) -> None:
        self.server_side.append(channel)
        await self.done.wait()


def _feed_all(channel: WebSocketChannel, chunks: list[bytes], general: bool) -> list[tuple[bytes, bool]]:
    """Feed ``chunks`` to the connection as asyncio would (``data_received``), or straight to
    websockets' own ``data_received`` (``general``: the old path, frames parsed by websockets);
    returns what the channel delivered."""
    got: list[tuple[bytes, bool]] = []
    channel.start_push(lambda data, text: got.append((bytes(data), text)), lambda _err: None)
    ws = channel._ws
    for chunk in chunks:
        if ws.protocol.state.name != "OPEN":
            break
        if general:
            Connection.data_received(ws, chunk)
        else:
            ws.data_received(chunk)
    return got


def _outcome(channel: WebSocketChannel) -> tuple[str, Any]:
    protocol = channel._ws.protocol
    sent = protocol.close_sent
    return protocol.state.name, sent.code if sent is not None else None


@given(
    messages,
    st.booleans(),
    st.sampled_from([0, 0, 200, 5000]),  # 0: no limit
    st.lists(st.integers(0, 400_000), max_size=10),
    st.integers(0, 255),
)
@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_connections_deliver_the_same_with_and_without_the_fast_path(
    spec: list[tuple[str, int, int]], server_side: bool, limit: int, cuts: list[int], seed: int
) -> None:
    """A stream of frames of every kind (fragments, PINGs, refused ones) split into reads
    anywhere, between frames (where the fast path may start) or inside one: a connection
    delivers the same messages in the same order, and ends in the same state with the same
    close code, as one whose frames all go through websockets' parser."""
    frames = _frames(spec, server_side, seed)
    stream = b"".join(frames)
    ends = list(itertools.accumulate(len(f) for f in frames))
    # even cuts: at a frame boundary; odd ones: anywhere
    bounds = sorted({ends[c // 2 % len(ends)] if c % 2 == 0 else c % (len(stream) + 1) for c in cuts})
    bounds = sorted(set(bounds) | {0, len(stream)})
    chunks = [stream[a:b] for a, b in itertools.pairwise(bounds) if b > a]

    async def scenario() -> None:
        peers = _Peers()
        server = await serve_websocket(peers.handler, "127.0.0.1", 0, max_message_size=1 << 20)
        async with server:
            port = server.sockets[0].getsockname()[1]
            clients = [
                await connect_websocket(f"ws://127.0.0.1:{port}", max_message_size=1 << 20) for _ in range(2)
            ]
            for _ in range(200):
                if len(peers.server_side) == 2:
                    break
                await asyncio.sleep(0.005)
            fast, general = peers.server_side if server_side else clients
            for channel in (fast, general):
                channel.set_max_message_size(limit)
            try:
                assert _feed_all(fast, chunks, general=False) == _feed_all(general, chunks, general=True)
                assert _outcome(fast) == _outcome(general)
            finally:
                peers.done.set()
                for channel in clients:
                    channel.abort()

    asyncio.run(scenario())


async def test_small_messages_skip_websockets_frame_parser_and_serializer(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The fast paths are taken: a session's round trips of small text go through neither
    websockets' Frame.parse nor Frame.serialize on either end (both cost ~4x the fast path)."""
    from m2mwire.api import Session, connect, serve

    calls = {"parse": 0, "serialize": 0}
    real_parse, real_serialize = Frame.parse.__func__, Frame.serialize  # type: ignore[attr-defined]

    def parse(cls: Any, *args: Any, **kwargs: Any) -> Any:
        calls["parse"] += 1
        return real_parse(cls, *args, **kwargs)

    def serialize(self: Frame, *args: Any, **kwargs: Any) -> bytes:
        calls["serialize"] += 1
        return real_serialize(self, *args, **kwargs)

    async def echo(session: Session) -> None:
        async for message in session:
            await session.send(message.text or "", algorithm="none")

    async with serve(echo, "ws://127.0.0.1:0") as server:
        async with connect(f"ws://127.0.0.1:{server.port}", algorithms=["none"]) as session:
            await session.send("warm-up", algorithm="none")
            await session.recv()
            monkeypatch.setattr(Frame, "parse", classmethod(parse))
            monkeypatch.setattr(Frame, "serialize", serialize)
            for i in range(20):
                await session.send("x" * (100 + i * 20), algorithm="none")
                assert (await session.recv()).text == "x" * (100 + i * 20)
            counted = dict(calls)
            monkeypatch.undo()
    assert counted == {"parse": 0, "serialize": 0}
