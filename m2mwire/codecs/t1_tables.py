"""The Token T1 tables, as data.

Two dialects share the ``#T1|`` prefix:

* **seed** - the tables of the wire-format seed, section 5.3 (request keys, response keys, tool keys, role
  values, finish-reason values, models, default omission). This is what m2mwire sends by default.
* **reference** - what the existing Rust implementation (infernet-org/m2m-protocol 0.2-0.3, tables
  unchanged since e04a621) actually puts on the wire. Restated here as facts so that such wires decode,
  and so that ``dialect="reference"`` can reproduce them byte for byte.

All mappings are ``original -> abbreviation``; :mod:`m2mwire.codecs.t1` derives the reverse lookups once
at import. Nothing here is code: the collision and dialect-conflict rules live in ``t1.py`` and are
documented in ``docs/T1.md``.
"""

from __future__ import annotations

from typing import Final

__all__ = [
    "ESCAPE",
    "REFERENCE_DEFAULT_KEYS",
    "REFERENCE_KEYS",
    "REFERENCE_MODELS",
    "REFERENCE_RESTORED_DEFAULTS",
    "REFERENCE_ROLES",
    "SEED_DEFAULTS",
    "SEED_FINISH_REASONS",
    "SEED_MODELS",
    "SEED_REQUEST_KEYS",
    "SEED_RESPONSE_KEYS",
    "SEED_ROLES",
    "SEED_TOOL_KEYS",
]

#: Prefix of an escaped key or value on a seed-dialect wire: "take the rest literally". Not in the seed;
#: m2mwire's addition so that user keys/values equal to an abbreviation survive (see docs/T1.md).
ESCAPE: Final = "~"

# --- seed, section 5.3.2 --------------------------------------------------------------------------------

SEED_REQUEST_KEYS: Final[dict[str, str]] = {
    "messages": "m",
    "content": "c",
    "role": "r",
    "model": "M",
    "temperature": "T",
    "max_tokens": "x",
    "top_p": "p",
    "stream": "s",
    "stop": "S",
    "frequency_penalty": "f",
    "presence_penalty": "P",
    "logit_bias": "lb",
    "user": "u",
    "n": "n",
    "seed": "se",
    "tools": "ts",
    "tool_choice": "tc",
    "function_call": "fc",
    "functions": "fs",
    "response_format": "rf",
}

SEED_RESPONSE_KEYS: Final[dict[str, str]] = {
    "choices": "C",
    "index": "i",
    "message": "m",
    "finish_reason": "fr",
    "usage": "U",
    "prompt_tokens": "pt",
    "completion_tokens": "ct",
    "total_tokens": "tt",
    "delta": "d",
    "logprobs": "lp",
}

SEED_TOOL_KEYS: Final[dict[str, str]] = {
    "tool_calls": "tc",
    "function": "fn",
    "name": "n",
    "arguments": "a",
    "type": "t",
}

# --- seed, section 5.3.3 / 5.3.4 -------------------------------------------------------------------------

SEED_ROLES: Final[dict[str, str]] = {
    "system": "s",
    "user": "u",
    "assistant": "a",
    "function": "f",
    "tool": "t",
}

SEED_FINISH_REASONS: Final[dict[str, str]] = {
    "stop": "s",
    "length": "l",
    "tool_calls": "tc",
    "content_filter": "cf",
    "function_call": "fc",
}

SEED_MODELS: Final[dict[str, str]] = {
    # OpenAI
    "gpt-4o": "4o",
    "gpt-4o-mini": "4om",
    "gpt-4-turbo": "4t",
    "gpt-4": "4",
    "gpt-3.5-turbo": "35t",
    "o1": "o1",
    "o1-mini": "o1m",
    "o1-preview": "o1p",
    "o3": "o3",
    "o3-mini": "o3m",
    # Meta Llama
    "meta-llama/llama-3.3-70b": "ml3370",
    "meta-llama/llama-3.1-405b": "ml31405",
    "meta-llama/llama-3.1-70b": "ml3170",
    "meta-llama/llama-3.1-8b": "ml318",
    # Mistral
    "mistralai/mistral-large": "mim-l",
    "mistralai/mistral-small": "mim-s",
    "mistralai/mixtral-8x7b": "mimx87",
}

# --- seed, section 5.3.5 ---------------------------------------------------------------------------------

#: ``(key, default)`` in the seed's table order, which is also the order in which the decoder appends
#: restored parameters. A value is "the default" only if it has the same JSON type as well: ``1.0`` (float)
#: for temperature/top_p, the integer ``1`` for n, the integer ``0`` for the penalties.
SEED_DEFAULTS: Final[tuple[tuple[str, object], ...]] = (
    ("temperature", 1.0),
    ("top_p", 1.0),
    ("n", 1),
    ("stream", False),
    ("frequency_penalty", 0),
    ("presence_penalty", 0),
    ("logit_bias", {}),
    ("stop", None),
)

# --- reference implementation (m2m-reference.md section 1.3) ----------------------------------------------

REFERENCE_KEYS: Final[dict[str, str]] = {
    "content": "c",
    "model": "M",
    "temperature": "T",
    "max_tokens": "x",
    "stream": "s",
    "stop": "S",
    "top_p": "p",
    "frequency_penalty": "f",
    "presence_penalty": "P",
    "function_call": "fc",
    "arguments": "a",
    "tool_calls": "tc",
    "tool_choice": "tx",
    "response_format": "rf",
    "logit_bias": "lb",
    "logprobs": "lp",
    "top_logprobs": "tlp",
    "choices": "C",
    "finish_reason": "fr",
    "prompt_tokens": "pt",
    "completion_tokens": "ct",
    "total_tokens": "tt",
    "delta": "D",
    "system_fingerprint": "sf",
    "error": "E",
}

#: ``user`` is deliberately not abbreviated by the reference.
REFERENCE_ROLES: Final[dict[str, str]] = {
    "system": "S",
    "assistant": "A",
    "function": "F",
    "tool": "T",
}

REFERENCE_MODELS: Final[dict[str, str]] = {
    "gpt-4o": "g4o",
    "gpt-4o-mini": "g4om",
    "gpt-4-turbo": "g4t",
    "gpt-4": "g4",
    "gpt-3.5-turbo": "g35t",
    "llama-3.1-405b": "l31405",
    "llama-3.1-70b": "l3170",
    "llama-3.1-8b": "l318",
    "llama-3.3-70b": "l3370",
    "mistral-large-latest": "mll",
    "mistral-small-latest": "msl",
    "mixtral-8x7b": "mx87",
    "mixtral-8x22b": "mx822",
    "deepseek-v3": "dv3",
    "deepseek-r1": "dr1",
    "deepseek-coder": "dc",
    "qwen-2.5-72b": "q2572",
    "qwen-2.5-32b": "q2532",
    "qwen-2.5-coder-32b": "qc32",
}

#: Original key -> which default test the reference encoder applies to it (at any depth, against the key
#: as it appears in the input, so the single letters count too). See ``t1._reference_is_default``.
REFERENCE_DEFAULT_KEYS: Final[dict[str, str]] = {
    "temperature": "approx_one",
    "T": "approx_one",
    "top_p": "approx_one",
    "p": "approx_one",
    "n": "int_one",
    "stream": "false",
    "s": "false",
    "frequency_penalty": "zero",
    "f": "zero",
    "presence_penalty": "zero",
    "P": "zero",
    "logit_bias": "empty_object",
    "lb": "empty_object",
    "stop": "null",
    "S": "null",
}

#: What the reference decoder inserts, if absent, into every object holding ``messages`` or ``model``
#: (``logit_bias`` and ``stop`` are not restored by it).
REFERENCE_RESTORED_DEFAULTS: Final[tuple[tuple[str, object], ...]] = (
    ("temperature", 1.0),
    ("top_p", 1.0),
    ("n", 1),
    ("stream", False),
    ("frequency_penalty", 0),
    ("presence_penalty", 0),
)
