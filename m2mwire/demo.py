"""The live demo behind `make demo`: a server agent and a client agent on 127.0.0.1.

It prints what the codecs do to sample payloads, then opens a WebSocket session and a QUIC session,
shows the negotiated capabilities and, per message, the algorithm, original and wire bytes and
tokens, and what the server agent answered.
"""

from __future__ import annotations

import asyncio
import json
import logging
from typing import Any

import numpy as np

from m2mwire.api import Session, connect, serve
from m2mwire.codecs import Algorithm, compress, count_tokens
from m2mwire.samples import sample_payloads
from m2mwire.schemas.identity import ModelIdentity
from m2mwire.session.core import Message, SentInfo

__all__ = ["answer", "run_demo"]

# Both demo agents run the same (pretend) model, so they negotiate latent mode.
DEMO_IDENTITY = ModelIdentity(
    model_family="llama",
    model_id="meta-llama/Llama-3.2-1B",
    model_hash="5f0c1e2d3b4a59687766554433221100ffeeddccbbaa99887766554433221100",
    hidden_dim=2048,
    num_layers=16,
    num_kv_heads=8,
    head_dim=64,
)


def answer(message: Message) -> str | dict[str, Any] | np.ndarray[Any, Any]:
    """The server agent's reply to one message."""
    if message.kind == "avp":
        assert message.avp is not None
        hidden = message.avp.tensor().astype(np.float32)
        return np.tanh(hidden)  # "one more layer", sent back as a hidden state
    if message.kind == "json":
        value = message.value
        if isinstance(value, dict) and "messages" in value:
            last = value["messages"][-1].get("content", "") if value["messages"] else ""
            content = (
                f"Got {len(value['messages'])} message(s); the last one had {len(str(last))} characters."
            )
            return {
                "id": "chatcmpl-demo",
                "object": "chat.completion",
                "model": value.get("model", "demo"),
                "choices": [
                    {
                        "index": 0,
                        "message": {"role": "assistant", "content": content},
                        "finish_reason": "stop",
                    }
                ],
                "usage": {
                    "prompt_tokens": count_tokens(str(last)),
                    "completion_tokens": count_tokens(content),
                },
            }
        return {"ack": True, "type": type(value).__name__}
    text = message.text or ""
    return f"ack: {len(text)} characters received"


async def _server_agent(session: Session) -> None:
    async for message in session:
        await session.send(answer(message))


def _codec_table() -> None:
    print("== Codecs: sample agent payloads, original vs wire (bytes / cl100k tokens)")
    algs = [Algorithm.TOKENNATIVE, Algorithm.TOKEN, Algorithm.BROTLI, Algorithm.DICTIONARY, Algorithm.NONE]
    header = f"{'payload':28} {'original':>14}" + "".join(f" {a.value:>16}" for a in algs)
    print(header)
    shown = {
        "req_hello_min",
        "req_system_user",
        "req_travel_3turns",
        "req_tools_weather",
        "resp_tool_calls",
        "req_multilingual_conversation",
        "prose_paragraph_1k",
        "resp_markdown_4k",
        "req_rag_context_11k",
    }
    for name, content in (item for item in sample_payloads() if item[0] in shown):
        row = f"{name[:28]:28} {len(content.encode()):>6}B/{count_tokens(content):>5}t"
        for alg in algs:
            try:
                wire = compress(content, alg)
                row += f" {len(wire.encode()):>8}B/{count_tokens(wire):>5}t"
            except Exception:  # e.g. T1 on non-JSON content: not applicable
                row += f" {'n/a':>16}"
        print(row)
    print()


def _print_sent(label: str, sent: SentInfo) -> None:
    tokens = ""
    if sent.original_tokens is not None and sent.wire_tokens is not None:
        tokens = f"  tokens {sent.original_tokens:>5} -> {sent.wire_tokens:>5}"
    kind = "binary" if sent.binary else "text"
    sizes = f"bytes {sent.original_bytes:>7} -> {sent.wire_bytes:>7}"
    print(f"  {label:30} {sent.algorithm:12} {kind:6} {sizes}{tokens}")


def _print_reply(reply: Message) -> None:
    if reply.kind == "avp" and reply.avp is not None:
        t = reply.avp.tensor()
        what = f"AVP hidden state shape={list(t.shape)} dtype={t.dtype}"
    elif reply.kind == "json":
        what = str(reply.value)[:90]
    else:
        what = (reply.text or "")[:90]
    print(f"  {'':30} reply via {reply.algorithm:10} ({reply.wire_bytes} wire bytes): {what}")


async def _client_run(url: str, **options: Any) -> None:
    async with connect(url, identity=DEMO_IDENTITY, token_stats=True, **options) as session:
        info = session.info
        print(f"   session {info.session_id}")
        print(f"   algorithms {[a.value for a in info.algorithms]}  encoding {info.encoding.value}")
        print(f"   mode {info.mode} ({info.mode_reason})  max_payload {info.max_payload}")
        request = json.loads(dict(sample_payloads())["req_travel_3turns"])
        plan: list[tuple[str, Any, str | None, bool]] = [
            ("chat request (auto)", request, None, False),
            ("chat request (tokennative)", request, "tokennative", False),
            ("chat request (token/T1)", request, "token", False),
            ("chat request (brotli)", request, "brotli", False),
            ("chat request (dictionary)", request, "dictionary", False),
            ("plain text (none)", "Status: all tools ready.", "none", False),
            ("text as TokenNative binary", "Summarise the findings in three bullet points.", None, True),
        ]
        for label, content, alg, binary in plan:
            sent = await session.send(content, algorithm=alg, binary=binary)
            _print_sent(label, sent)
            _print_reply(await session.recv())
        if info.mode == "LATENT":
            hidden = np.random.default_rng(7).standard_normal(DEMO_IDENTITY.hidden_dim).astype(np.float32)
            sent = await session.send(hidden)
            _print_sent("hidden state (AVP, float32)", sent)
            _print_reply(await session.recv())
        st = session.stats
        print(
            f"   sent {st.messages_sent} messages: {st.original_bytes_sent} original bytes -> "
            f"{st.wire_bytes_sent} wire bytes; text messages "
            f"{st.original_tokens_sent} -> {st.wire_tokens_sent} tokens"
        )


async def run_demo() -> None:
    logging.basicConfig(level=logging.ERROR)
    _codec_table()
    for scheme in ("ws", "quic"):
        async with serve(_server_agent, f"{scheme}://127.0.0.1:0", identity=DEMO_IDENTITY) as server:
            print(f"== Live session over {scheme.upper()} ({server.url})")
            options: dict[str, Any] = {}
            if server.fingerprint is not None:
                options["fingerprint"] = server.fingerprint  # pin the server's generated certificate
            await _client_run(server.url, **options)
            print()


def main() -> None:
    asyncio.run(run_demo())
