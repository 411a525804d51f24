"""Deterministic session workloads: whole exchanges, message by message, for context compression.

``samples.py`` holds single payloads; these are sessions a user would recognise, in order and with
the side that sends each message: a multi-turn chat whose requests resend the growing history, a
tool-using agent loop that resends its tools every step, a streamed response (~300 chunks), JSON
status events, and per-message traffic that never repeats across messages (the worst case for a
context). New text in every message is generated, not drawn from a sentence bank: words from the
cl100k vocabulary with a Zipf distribution, so only what the protocol really resends repeats.
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable
from functools import cache
from typing import Any, Literal

from m2mwire.samples import _SYSTEM_PROMPTS

__all__ = ["WORKLOADS", "Sender", "Step", "workload"]

Sender = Literal["client", "server"]
Step = tuple[Sender, dict[str, Any] | str]
_SEED = 20261124
_MODEL = "gpt-4o-2024-08-06"


@cache
def _vocabulary() -> tuple[list[str], list[float]]:
    from m2mwire.codecs.tokenizers import get_tokenizer

    tokenizer = get_tokenizer("cl100k_base")
    words: list[str] = []
    for token in range(300, 100_000):
        piece = tokenizer.decode_single_token_bytes(token)
        if piece.startswith(b" ") and len(piece) >= 4 and piece[1:].isalpha() and piece[1:].islower():
            words.append(piece[1:].decode("ascii"))
            if len(words) == 2000:
                break
    # Zipf: BPE merges frequent words first, so a lower id is roughly a more frequent word.
    return words, [1.0 / (rank + 10) ** 1.2 for rank in range(len(words))]


# About a third of English running text is these words; with them the generated text compresses
# like English prose (zstd -3: ~43 % here; GPL-3's text: 36 %), a little worse, never better.
_FUNCTION_WORDS = [
    "the",
    "of",
    "and",
    "to",
    "a",
    "in",
    "is",
    "that",
    "for",
    "it",
    "with",
    "as",
    "on",
    "be",
    "this",
    "are",
    "by",
    "we",
    "can",
    "you",
    "not",
    "or",
    "will",
    "an",
    "at",
]


def _sentence(rng: random.Random) -> str:
    words, weights = _vocabulary()
    chosen = [
        rng.choice(_FUNCTION_WORDS) if rng.random() < 0.35 else rng.choices(words, weights)[0]
        for _ in range(rng.randint(7, 18))
    ]
    if rng.random() < 0.3:
        chosen.insert(rng.randint(1, len(chosen) - 1), str(rng.randint(2, 9999)))
    if rng.random() < 0.3:
        chosen[rng.randint(1, len(chosen) - 2)] += ","
    return " ".join(chosen).capitalize() + rng.choice(".....?!")


def _text(rng: random.Random, min_chars: int, max_chars: int) -> str:
    target = rng.randint(min_chars, max_chars)
    parts: list[str] = []
    size = 0
    while size < target:
        parts.append(_sentence(rng))
        size += len(parts[-1]) + 1
    return " ".join(parts)


def _completion(rng: random.Random, message: dict[str, Any], finish: str) -> dict[str, Any]:
    prompt, completion = rng.randint(500, 9000), rng.randint(20, 600)
    return {
        "id": f"chatcmpl-{rng.getrandbits(96):024x}",
        "object": "chat.completion",
        "created": 1_764_000_000 + rng.randint(0, 100_000),
        "model": _MODEL,
        "choices": [{"index": 0, "message": message, "logprobs": None, "finish_reason": finish}],
        "usage": {
            "prompt_tokens": prompt,
            "completion_tokens": completion,
            "total_tokens": prompt + completion,
        },
        "system_fingerprint": "fp_7f1c2d9e44",
    }


def multi_turn(turns: int = 16) -> list[Step]:
    """Chat completions: every request resends the system prompt (~2.5 KB, a typical production
    assistant's) and the whole conversation so far."""
    rng = random.Random(_SEED + 1)
    system = _SYSTEM_PROMPTS[2] + " " + _text(rng, 2200, 2400)
    messages: list[dict[str, Any]] = [{"role": "system", "content": system}]
    steps: list[Step] = []
    for _ in range(turns):
        messages.append({"role": "user", "content": _text(rng, 150, 500)})
        steps.append(("client", {"model": _MODEL, "messages": list(messages), "temperature": 0.2}))
        reply = {"role": "assistant", "content": _text(rng, 400, 1600)}
        steps.append(("server", _completion(rng, reply, "stop")))
        messages.append(reply)
    return steps


def _tool(name: str, description: str, properties: dict[str, Any], required: list[str]) -> dict[str, Any]:
    return {
        "type": "function",
        "function": {
            "name": name,
            "description": description,
            "parameters": {"type": "object", "properties": properties, "required": required},
        },
    }


def _tools(rng: random.Random) -> list[dict[str, Any]]:
    def prop(kind: str, chars: int = 80) -> dict[str, Any]:
        return {"type": kind, "description": _text(rng, chars, chars + 60)}

    return [
        _tool(
            "web_search",
            _text(rng, 150, 250),
            {"query": prop("string"), "max_results": prop("integer")},
            ["query"],
        ),
        _tool(
            "fetch_url", _text(rng, 120, 200), {"url": prop("string"), "render_js": prop("boolean")}, ["url"]
        ),
        _tool(
            "run_python",
            _text(rng, 200, 300),
            {
                "code": prop("string", 120),
                "timeout_s": prop("number"),
                "packages": {"type": "array", "items": {"type": "string"}},
            },
            ["code"],
        ),
        _tool(
            "read_file",
            _text(rng, 100, 180),
            {"path": prop("string"), "offset": prop("integer"), "limit": prop("integer")},
            ["path"],
        ),
        _tool(
            "write_file",
            _text(rng, 100, 180),
            {"path": prop("string"), "content": prop("string")},
            ["path", "content"],
        ),
        _tool(
            "sql_query",
            _text(rng, 180, 260),
            {"database": {"type": "string", "enum": ["sales", "crm", "ops"]}, "sql": prop("string", 100)},
            ["database", "sql"],
        ),
    ]


def agent_loop(steps: int = 12) -> list[Step]:
    """A tool-using agent: each step resends system prompt, tools and history; the model calls a tool."""
    rng = random.Random(_SEED + 2)
    tools = _tools(rng)
    names = [t["function"]["name"] for t in tools]
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": _SYSTEM_PROMPTS[3] + " " + _text(rng, 900, 1200)},
        {"role": "user", "content": _text(rng, 200, 400)},
    ]
    out: list[Step] = []
    for step in range(steps):
        out.append(
            ("client", {"model": _MODEL, "messages": list(messages), "tools": tools, "tool_choice": "auto"})
        )
        if step == steps - 1:
            out.append(
                ("server", _completion(rng, {"role": "assistant", "content": _text(rng, 600, 1200)}, "stop"))
            )
            break
        name = rng.choice(names)
        call = {
            "id": f"call_{rng.getrandbits(64):016x}",
            "type": "function",
            "function": {
                "name": name,
                "arguments": json.dumps({"query": _text(rng, 30, 90), "limit": rng.randint(1, 20)}),
            },
        }
        assistant = {"role": "assistant", "content": None, "tool_calls": [call]}
        out.append(("server", _completion(rng, assistant, "tool_calls")))
        result = {"status": "ok", "elapsed_ms": rng.randint(20, 3000), "output": _text(rng, 300, 1500)}
        messages += [assistant, {"role": "tool", "tool_call_id": call["id"], "content": json.dumps(result)}]
    return out


def streaming(chunks: int = 300) -> list[Step]:
    """One request, then a response streamed as chat.completion.chunk objects of one to three words."""
    rng = random.Random(_SEED + 3)
    words, weights = _vocabulary()
    out: list[Step] = [
        (
            "client",
            {
                "model": _MODEL,
                "stream": True,
                "messages": [{"role": "user", "content": _text(rng, 200, 400)}],
            },
        )
    ]
    base = {
        "id": f"chatcmpl-{rng.getrandbits(96):024x}",
        "object": "chat.completion.chunk",
        "created": 1_764_000_123,
    }
    for i in range(chunks):
        last = i == chunks - 1
        delta = {} if last else {"content": " " + " ".join(rng.choices(words, weights, k=rng.randint(1, 3)))}
        if i == 0:
            delta = {"role": "assistant", "content": ""}
        chunk = {
            **base,
            "model": _MODEL,
            "system_fingerprint": "fp_7f1c2d9e44",
            "choices": [
                {"index": 0, "delta": delta, "logprobs": None, "finish_reason": "stop" if last else None}
            ],
        }
        out.append(("server", json.dumps(chunk, separators=(",", ":"))))
    return out


def json_events(count: int = 200) -> list[Step]:
    """Task status events (A2A-style JSON-RPC notifications) from a worker, acknowledged in batches."""
    rng = random.Random(_SEED + 4)
    tasks = [f"{rng.getrandbits(128):032x}" for _ in range(6)]
    states = ["submitted", "working", "working", "working", "input-required", "completed"]
    out: list[Step] = []
    for i in range(count):
        task = rng.choice(tasks)
        event = {
            "jsonrpc": "2.0",
            "method": "tasks/status",
            "params": {
                "id": task,
                "status": {
                    "state": rng.choice(states),
                    "timestamp": f"2026-11-24T00:{i // 60 % 60:02d}:{i % 60:02d}.{rng.randint(0, 999):03d}Z",
                    "message": {"role": "agent", "parts": [{"kind": "text", "text": _text(rng, 20, 120)}]},
                },
                "progress": round(rng.random(), 3),
                "metrics": {
                    "tokens_in": rng.randint(0, 50_000),
                    "tokens_out": rng.randint(0, 5000),
                    "cost_usd": round(rng.random() / 10, 5),
                },
                "final": False,
            },
        }
        out.append(("server", event))
        if i % 20 == 19:
            out.append(
                ("client", {"jsonrpc": "2.0", "method": "tasks/ack", "params": {"upto": i, "ids": tasks}})
            )
    return out


def no_repetition(count: int = 40) -> list[Step]:
    """Independent messages with nothing resent: new text, new ids, new numbers each time."""
    rng = random.Random(_SEED + 5)
    out: list[Step] = []
    for i in range(count):
        sender: Sender = "client" if i % 2 == 0 else "server"
        if i % 3 == 0:
            out.append((sender, _text(rng, 400, 3000)))
        else:
            record = {
                f"{_sentence(rng).split()[0].lower()}_{j}": rng.choice(
                    [
                        rng.randint(0, 10**9),
                        round(rng.uniform(-1000, 1000), 4),
                        f"{rng.getrandbits(80):020x}",
                        _text(rng, 20, 80),
                    ]
                )
                for j in range(rng.randint(10, 40))
            }
            out.append((sender, record))
    return out


def long_agent_loop() -> list[Step]:
    """The agent loop over 40 steps: requests grow past 100 KB, beyond a 32 KiB deflate window."""
    return agent_loop(40)


WORKLOADS: dict[str, Callable[[], list[Step]]] = {
    "multi_turn": multi_turn,
    "agent_loop": agent_loop,
    "long_agent_loop": long_agent_loop,
    "streaming": streaming,
    "json_events": json_events,
    "no_repetition": no_repetition,
}


def workload(name: str) -> list[Step]:
    """The messages of one workload, in order, with the side that sends each."""
    try:
        return WORKLOADS[name]()
    except KeyError:
        raise ValueError(f"unknown workload {name!r}: one of {', '.join(WORKLOADS)}") from None
