"""Live interop: our frames POSTed to the SDK's own HTTP server (avp.create_app under uvicorn)."""

from __future__ import annotations

import asyncio
import threading
import time
import zlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import avp as sdk
import httpx
import numpy as np
import pytest
import uvicorn

from m2mwire import avp

TIMEOUT = 10.0


@dataclass
class Peer:
    base_url: str
    received: list[Any] = field(default_factory=list)


@pytest.fixture(scope="module")
def peer() -> Iterator[Peer]:
    """The SDK's app on 127.0.0.1, an OS-chosen port, in a background thread."""
    state = Peer(base_url="")

    async def handler(message: Any) -> dict[str, Any]:
        state.received.append(message)
        return {"payload_bytes": len(message.payload), "checksum_ok": True}

    app = sdk.create_app(handler)
    config = uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning", lifespan="off")
    server = uvicorn.Server(config)
    thread = threading.Thread(target=lambda: asyncio.run(server.serve()), name="avp-sdk-peer", daemon=True)
    thread.start()
    deadline = time.monotonic() + TIMEOUT
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            raise RuntimeError("the SDK peer did not start")
        time.sleep(0.01)
    port = server.servers[0].sockets[0].getsockname()[1]
    state.base_url = f"http://127.0.0.1:{port}"
    try:
        yield state
    finally:
        server.should_exit = True
        thread.join(timeout=TIMEOUT)
        assert not thread.is_alive(), "the SDK peer did not shut down"


@pytest.fixture
def client(peer: Peer) -> Iterator[httpx.Client]:
    peer.received.clear()
    with httpx.Client(base_url=peer.base_url, timeout=TIMEOUT) as c:
        yield c


def post(client: httpx.Client, parts: list[bytes | memoryview] | bytes) -> httpx.Response:
    body = parts if isinstance(parts, bytes) else b"".join(parts)
    return client.post(
        "/avp/v2/transmit",
        content=body,
        headers={"content-type": sdk.CONTENT_TYPE, "AVP-Version": "0.4", "AVP-Agent-ID": "m2mwire-test"},
    )


def test_health(client: httpx.Client) -> None:
    assert client.get("/health").json() == {"status": "ok"}


@pytest.mark.parametrize("compress", [False, True])
def test_hidden_state(client: httpx.Client, peer: Peer, compress: bool) -> None:
    hidden = np.random.default_rng(0).standard_normal((1, 4096)).astype(np.float32)
    parts = avp.encode_hidden_state_parts(
        hidden,
        compress=compress,
        session_id="s-1",
        source_agent_id="m2mwire",
        target_agent_id="sdk",
        model_id="meta-llama/Llama-2-7b",
        num_layers=32,
        extra={"k": "v"},
    )
    response = post(client, parts)
    assert response.status_code == 200, response.text
    assert response.json() == {"success": True, "payload_bytes": hidden.nbytes, "checksum_ok": True}
    (message,) = peer.received
    md = message.metadata
    assert (md.session_id, md.source_agent_id, md.target_agent_id, md.model_id) == (
        "s-1",
        "m2mwire",
        "sdk",
        "meta-llama/Llama-2-7b",
    )
    assert (md.hidden_dim, md.num_layers, tuple(md.tensor_shape)) == (4096, 32, (1, 4096))
    assert md.dtype is sdk.DataType.FLOAT32
    assert md.payload_type is sdk.PayloadType.HIDDEN_STATE
    assert md.compression == ("zstd" if compress else None)
    assert md.extra == {"k": "v"}
    assert message.payload == hidden.tobytes()
    np.testing.assert_array_equal(message.embedding, hidden.reshape(-1))


@pytest.mark.parametrize("compress", [False, 3])
def test_kv_cache(client: httpx.Client, peer: Peer, compress: int) -> None:
    rng = np.random.default_rng(1)
    shape = (2, 16, 8)
    layers = [
        (rng.standard_normal(shape).astype(np.float16), rng.standard_normal(shape).astype(np.float16))
        for _ in range(4)
    ]
    parts = avp.encode_kv_cache_parts(layers, compress=compress, model_id="tiny", avp_map_id="vocab:0123")
    response = post(client, parts)
    assert response.status_code == 200, response.text
    (message,) = peer.received
    assert message.header.is_kv_cache and message.header.has_map
    assert message.header.compressed == bool(compress)
    md = message.metadata
    assert md.payload_type is sdk.PayloadType.KV_CACHE
    assert md.dtype is sdk.DataType.FLOAT16
    assert (md.num_layers, md.model_id, md.avp_map_id) == (4, "tiny", "vocab:0123")
    payload = avp.build_kv_payload(layers)
    assert message.payload == payload
    assert zlib.crc32(message.payload) == avp.decode(b"".join(parts)).metadata.payload_checksum


def test_garbage_frame_is_400(client: httpx.Client, peer: Peer) -> None:
    response = post(client, b"definitely not an AVP frame")
    assert response.status_code == 400
    assert response.json()["success"] is False
    corrupted = bytearray(avp.encode(np.ones(8, dtype=np.float32)))
    corrupted[-1] ^= 0xFF
    response = post(client, bytes(corrupted))
    assert response.status_code == 400
    assert "checksum mismatch" in response.json()["message"].lower()
    assert peer.received == []
