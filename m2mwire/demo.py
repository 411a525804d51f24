"""The live demo behind `make demo`: a server agent and a client agent on 127.0.0.1.

It prints what the codecs do to sample payloads, then opens a WebSocket session and a QUIC session,
shows the negotiated capabilities and, per message, the algorithm, original and wire bytes and
tokens, and what the server agent answered.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Sequence
from typing import Any

import numpy as np

from m2mwire.api import Session, connect, serve
from m2mwire.codecs import Algorithm, compress, count_tokens, select_algorithm
from m2mwire.codecs.jsonutil import dumps_compact
from m2mwire.errors import EncodeError
from m2mwire.samples import sample_payloads
from m2mwire.schemas.identity import ModelIdentity
from m2mwire.session.config import DEFAULT_ALGORITHMS
from m2mwire.session.payload import Message, SentInfo
from m2mwire.workloads import workload

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
        value = message.json()  # untyped (Any): the demo reads nested fields of its own replies
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


WIDTH = 100  # every line fits a 100-column terminal (tests/test_cli.py checks it)
_TABLE_ALGORITHMS = (Algorithm.TOKENNATIVE, Algorithm.TOKEN, Algorithm.BROTLI, Algorithm.DICTIONARY)
_TABLE_PAYLOADS = (
    "req_hello_min",
    "req_system_user",
    "req_travel_3turns",
    "req_tools_weather",
    "resp_tool_calls",
    "req_multilingual_conversation",
    "prose_paragraph_1k",
    "resp_markdown_4k",
    "req_rag_context_11k",
)


def _cell(size: int, tokens: int) -> str:
    return f"{size:>7}/{tokens:<5}"


def _codec_table() -> None:
    print("== Codecs: sample agent payloads, wire size as bytes/cl100k tokens ('none' sends the original)")
    print(f"{'payload':29} {'original':>13}" + "".join(f" {a.value:>13}" for a in _TABLE_ALGORITHMS))
    totals = {alg: [0, 0] for alg in (Algorithm.NONE, *_TABLE_ALGORITHMS)}
    dictionary_larger = rows = 0
    payloads = dict(sample_payloads())
    for name in _TABLE_PAYLOADS:
        content = payloads[name]
        size, tokens = len(content.encode()), count_tokens(content)
        totals[Algorithm.NONE][0] += size
        totals[Algorithm.NONE][1] += tokens
        row = f"{name[:29]:29} {_cell(size, tokens)}"
        for alg in _TABLE_ALGORITHMS:
            try:
                wire = compress(content, alg)
            except EncodeError:  # T1 on content that is not JSON: not applicable
                row += f" {'n/a':^13}"
                continue
            wire_size = len(wire.encode())
            row += f" {_cell(wire_size, count_tokens(wire))}"
            if alg in (Algorithm.TOKENNATIVE, Algorithm.DICTIONARY):
                totals[alg][0] += wire_size
                totals[alg][1] += count_tokens(wire)
            if alg is Algorithm.DICTIONARY:
                dictionary_larger += wire_size > size
        rows += 1
        print(row.rstrip())
    (size, tokens), (tk_size, tk_tokens) = totals[Algorithm.NONE], totals[Algorithm.TOKENNATIVE]
    print(
        f"   TokenNative (cl100k token ids) takes {tk_size / size:.2f}x the bytes but "
        f"{tk_tokens / tokens:.1f}x the tokens of the original;\n"
        "   T1 abbreviates JSON keys (JSON only, equivalent rather than byte-identical); Brotli wins on\n"
        f"   large text; Dictionary was larger than the original for {dictionary_larger} of {rows} payloads."
    )
    print()


def _print_sent(label: str, sent: SentInfo) -> None:
    tokens = ""
    if sent.original_tokens is not None and sent.wire_tokens is not None:
        tokens = f" {sent.original_tokens:>5} -> {sent.wire_tokens:>5} tok"
    kind = "binary" if sent.binary else "text"
    sizes = f"{sent.original_bytes:>6} -> {sent.wire_bytes:>6} B"
    print(f"  {label:28} {sent.algorithm:11} {kind:6} {sizes}{tokens}")


def _shorten(text: str, room: int) -> str:
    """``text`` within ``room`` characters: cut at a word, marked with an ellipsis and the full length."""
    if len(text) <= room:
        return text
    tail = f"... ({len(text)} chars)"
    cut = text[: max(0, room - len(tail))].rsplit(" ", 1)[0]
    return cut + tail


def _describe(reply: Message, room: int) -> str:
    """What the server agent answered, whole or summarised: JSON is never cut mid-object."""
    if reply.kind == "avp" and reply.avp is not None:
        t = reply.avp.tensor()
        return f"AVP hidden state, shape {list(t.shape)}, {t.dtype}"
    if reply.kind == "json":
        value = reply.json()  # untyped (Any), as above
        if isinstance(value, dict) and value.get("object") == "chat.completion":
            content = str(value["choices"][0]["message"]["content"])
            return "completion " + _shorten(json.dumps(content, ensure_ascii=False), room - 11)
        whole = json.dumps(value, ensure_ascii=False)
        if len(whole) <= room:
            return whole
        keys = ", ".join(value) if isinstance(value, dict) else f"{len(value)} items"
        return _shorten(f"JSON {type(value).__name__} ({keys})", room)
    return _shorten(json.dumps(reply.text or "", ensure_ascii=False), room)


def _print_reply(reply: Message) -> None:
    head = f"{'':5}reply ({reply.algorithm}, {reply.wire_bytes} B): "
    print(head + _describe(reply, WIDTH - len(head)))


def _explain_auto(request: Any, sent: dict[str, SentInfo], allowed: Sequence[Algorithm]) -> None:
    """Why automatic selection chose what it did, from the sizes this session just measured."""
    auto = sent["auto"]
    original = auto.original_bytes
    exact = sorted(
        (info.wire_bytes, alg) for alg, info in sent.items() if alg in ("tokennative", "brotli") and info
    )
    ranking = " < ".join(f"{alg} {size}" for size, alg in [*exact, (original, "none")])
    for_tokens = select_algorithm(dumps_compact(request), allowed=allowed, optimize="tokens")
    lines = [
        f"auto chose {auto.algorithm}: smallest byte-exact wire of {ranking} B;",
        f"T1 ({sent['token'].wire_bytes} B) is JSON-equivalent, not byte-exact; "
        f"dictionary ({sent['dictionary'].wire_bytes} B) is larger than the original.",
    ]
    if auto.wire_tokens is not None and auto.original_tokens is not None:
        lines.append(
            f"{auto.algorithm} costs {auto.wire_tokens} tokens vs {auto.original_tokens}: "
            f'optimize="tokens" (an LLM reads the wire) picks {for_tokens.value}.'
        )
    for line in lines:
        print(f"{'':5}{line}")


# The live sessions tour the per-message codecs; session-context zstd has its own section
# (_context_demo): offered here, automatic selection would send every text message through it.
PER_MESSAGE_ALGORITHMS = tuple(a for a in DEFAULT_ALGORITHMS if a is not Algorithm.ZSTD)


async def _client_run(url: str, **options: Any) -> None:
    async with connect(
        url, identity=DEMO_IDENTITY, token_stats=True, algorithms=PER_MESSAGE_ALGORITHMS, **options
    ) as session:
        info = session.info
        print(f"   session {info.session_id}")
        print(
            f"   negotiated algorithms {','.join(a.value for a in info.algorithms)}; "
            f"encoding {info.encoding.value}"
        )
        print(f"   mode {info.mode} ({info.mode_reason}); max_payload {info.max_payload} bytes")
        print(f"  {'message':28} {'algorithm':11} {'frame':6} {'bytes':>16} {'cl100k tokens':>18}")
        request = json.loads(dict(sample_payloads())["req_travel_3turns"])
        plan: list[tuple[str, str, Any, str | None, bool]] = [
            ("auto", "chat request (auto)", request, None, False),
            ("tokennative", "chat request (tokennative)", request, "tokennative", False),
            ("token", "chat request (token/T1)", request, "token", False),
            ("brotli", "chat request (brotli)", request, "brotli", False),
            ("dictionary", "chat request (dictionary)", request, "dictionary", False),
            ("text", "plain text (none)", "Status: all tools ready.", "none", False),
            ("binary", "text as TokenNative binary", "Summarise the findings in three bullets.", None, True),
        ]
        sent_by_key: dict[str, SentInfo] = {}
        for key, label, content, alg, binary in plan:
            sent = await session.send(content, algorithm=alg, binary=binary)
            sent_by_key[key] = sent
            _print_sent(label, sent)
            _print_reply(await session.recv())
        _explain_auto(request, sent_by_key, info.algorithms)
        if info.mode == "LATENT":
            hidden = np.random.default_rng(7).standard_normal(DEMO_IDENTITY.hidden_dim).astype(np.float32)
            sent = await session.send(hidden)
            _print_sent("hidden state (AVP, float32)", sent)
            _print_reply(await session.recv())
        st = session.stats
        print(
            f"   sent {st.messages_sent} messages: {st.original_bytes_sent} -> {st.wire_bytes_sent} bytes; "
            f"text {st.original_tokens_sent} -> {st.wire_tokens_sent} cl100k tokens"
        )


async def _context_demo(turns: int = 8) -> None:
    """Session-context zstd against per-message Brotli on a multi-turn chat over WebSocket."""
    steps = workload("multi_turn")[: 2 * turns]
    requests = [content for sender, content in steps if sender == "client"]
    replies = [content for sender, content in steps if sender == "server"]

    async def chat_agent(session: Session) -> None:
        for reply in replies:  # answers each request with the next completion, the same way it came
            request = await session.recv()
            await session.send(reply, algorithm=request.algorithm)

    print("== Context compression: a multi-turn chat resending its history (WebSocket)")
    print("   wire bytes per turn, both directions; brotli: the #M2M wire strings; zstd: whole")
    print("   binary messages, envelopes included")
    print(f"   {'turn':>4} {'request':>9} {'reply':>7} | {'brotli':>8} {'zstd':>7}")
    totals = {"brotli": 0, "zstd": 0}
    original = 0
    async with serve(chat_agent, "ws://127.0.0.1:0", algorithms=["zstd", "brotli"]) as server:
        async with (
            connect(server.url, algorithms=["zstd", "brotli"]) as plain,
            connect(server.url, algorithms=["zstd", "brotli"]) as ctx,
        ):
            for turn, request in enumerate(requests, 1):
                row = {}
                for algorithm, session in (("brotli", plain), ("zstd", ctx)):
                    sent = await session.send(request, algorithm=algorithm)
                    reply = await session.recv()
                    row[algorithm] = sent.wire_bytes + reply.wire_bytes
                    totals[algorithm] += row[algorithm]
                original += sent.original_bytes + reply.original_bytes
                print(
                    f"   {turn:>4} {sent.original_bytes:>8}B {reply.original_bytes:>6}B |"
                    f" {row['brotli']:>7}B {row['zstd']:>6}B"
                )
    brotli, zstd = totals["brotli"] / original, totals["zstd"] / original
    print(f"   {original:,} bytes of content: brotli put {brotli:.1%} of them on the wire, zstd {zstd:.1%}")
    print()


async def run_demo() -> None:
    _codec_table()
    await _context_demo()
    for scheme in ("ws", "quic"):
        # cert_dir=False: a throwaway server, nothing worth keeping in the user's state directory.
        kept: dict[str, Any] = {"cert_dir": False} if scheme == "quic" else {}
        async with serve(_server_agent, f"{scheme}://127.0.0.1:0", identity=DEMO_IDENTITY, **kept) as server:
            print(f"== Live session over {scheme.upper()} ({server.url})")
            options: dict[str, Any] = {}
            if server.fingerprint is not None:
                options["fingerprint"] = server.fingerprint  # pin the server's generated certificate
            await _client_run(server.url, **options)
            print()
    await run_nats_demo()
    print("next: examples/server.py + examples/client.py, an agent pair to copy (python examples/server.py)")
    print("      m2mwire serve ws://127.0.0.1:8765   then   m2mwire send ws://127.0.0.1:8765 'hello'")
    print("      README.md (Use: connect, serve, Message) and docs/PROTOCOL.md")


def main() -> None:
    asyncio.run(run_demo())


async def run_nats_demo() -> None:
    """The same session over NATS (a throwaway nats-server on loopback), then through a gateway."""
    from m2mwire.shell.gateway import gateway
    from m2mwire.transport.nats.local import LocalNatsServer, find_nats_server

    try:
        find_nats_server()
    except FileNotFoundError as exc:
        print(f"== NATS: skipped ({exc})")
        return
    with LocalNatsServer() as nats_server:
        url = f"{nats_server.url}/m2mwire.demo"
        async with serve(_server_agent, url, identity=DEMO_IDENTITY, agent_id="demo-worker-1"):
            print(f"== Live session over NATS ({url}, one worker of its queue group)")
            await _client_run(url)
            async with gateway("ws://127.0.0.1:0", url) as gw:
                print(f"== Through a gateway: WebSocket {gw.url} -> NATS {url}")
                async with connect(gw.url) as session:
                    await session.send("hello through the gateway", algorithm="none")
                    reply = await session.recv()
                    print(f"   worker {session.info.peer_agent_id} answered: {_describe(reply, 60)}")
            print()
