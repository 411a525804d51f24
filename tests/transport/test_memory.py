"""The in-memory channel pair keeps the whole channel contract of transport/base.py."""

from __future__ import annotations

import asyncio

import pytest

from m2mwire.errors import TransportError
from m2mwire.transport.base import Channel, DirectSendChannel, PushChannel
from m2mwire.transport.memory import pair

pytestmark = pytest.mark.timeout(10)  # a broken contract shows as a wait that never ends


async def test_it_is_every_kind_of_channel() -> None:
    a, _ = pair()
    assert isinstance(a, Channel) and isinstance(a, PushChannel) and isinstance(a, DirectSendChannel)


async def test_send_now_writes_until_the_peer_buffer_is_full_then_send_waits() -> None:
    a, b = pair(buffer_bytes=100)
    assert a.send_now(b"x" * 60)
    assert a.send_now("y" * 40)  # exactly full
    assert not a.send_now(b"z")  # nothing written
    assert b.buffered_bytes == 100
    waiting = asyncio.create_task(a.send([b"1", b"23"]))  # parts arrive as one message
    await asyncio.sleep(0)
    assert not waiting.done()
    assert await b.recv() == b"x" * 60  # room again: the waiting send goes through
    await asyncio.wait_for(waiting, 1)
    assert [await b.recv(), await b.recv()] == ["y" * 40, b"123"]


async def test_a_cancelled_send_writes_nothing() -> None:
    a, b = pair(buffer_bytes=10)
    await a.send(b"0123456789")
    waiting = asyncio.create_task(a.send(b"lost"))
    await asyncio.sleep(0)
    waiting.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiting
    assert await b.recv() == b"0123456789"
    await a.send(b"next")
    assert await b.recv() == b"next"
    assert b.buffered_bytes == 0


async def test_push_delivers_what_came_before_in_order_and_pause_stops_it() -> None:
    a, b = pair()
    a.send_now("early")
    got: list[object] = []
    b.start_push(lambda data, text: got.append((data, text)), got.append)
    assert got == [(b"early", True)]  # synchronously, as the contract asks; text as UTF-8 bytes
    b.pause_reading()
    a.send_now(b"while paused")
    await asyncio.sleep(0)
    assert got == [(b"early", True)] and b.buffered_bytes == len(b"while paused")
    b.resume_reading()
    await asyncio.sleep(0)
    assert got == [(b"early", True), (b"while paused", False)]


async def test_an_oversized_message_fails_the_channel_with_1009_before_buffering() -> None:
    a, b = pair(max_message_size=8)
    lost: list[TransportError] = []
    b.start_push(lambda _m, _t: None, lost.append)
    await a.send(b"123456789")
    assert b.buffered_bytes == 0
    assert len(lost) == 1 and lost[0].code == 1009 and not lost[0].clean
    with pytest.raises(TransportError):
        await a.send(b"1")


async def test_close_is_answered_with_the_same_code_after_what_was_sent() -> None:
    a, b = pair()
    await a.send("last words")
    closing = asyncio.create_task(a.close(4000, "bye"))
    assert await b.recv() == "last words"
    with pytest.raises(TransportError) as caught:
        await b.recv()
    assert (caught.value.code, caught.value.reason, caught.value.clean) == (4000, "bye", True)
    with pytest.raises(TransportError):
        await b.send("too late")
    b_lost: list[TransportError] = []
    a.start_push(lambda _m, _t: None, b_lost.append)  # a reads b's answer
    await asyncio.wait_for(closing, 1)
    assert a.lost is not None and (a.lost.code, a.lost.clean) == (4000, True)


async def test_abort_ends_both_sides_uncleanly_and_wakes_a_waiting_send() -> None:
    a, b = pair(buffer_bytes=1)
    await a.send(b"full")
    waiting = asyncio.create_task(a.send(b"more"))
    await asyncio.sleep(0)
    b.abort()
    with pytest.raises(TransportError) as caught:
        await waiting
    assert caught.value.code == 1006 and not caught.value.clean
    assert await b.recv() == b"full"  # what had arrived stays readable, as with websockets
    with pytest.raises(TransportError):
        await b.recv()
