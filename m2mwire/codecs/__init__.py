"""M2M wire codecs: TokenNative (``#TK|``), T1 (``#T1|``), Brotli, Dictionary, M2M v1 frames (``#M2M|1|``),
None, and zlib (decode only).

    >>> from m2mwire.codecs import compress, decompress
    >>> wire = compress('{"model":"gpt-4o","messages":[{"role":"user","content":"Hello"}]}', "tokennative")
    >>> decompress(wire)
    '{"model":"gpt-4o","messages":[{"role":"user","content":"Hello"}]}'

Names are imported on first use (PEP 562), so importing a light submodule such as
``m2mwire.codecs.limits`` does not load tiktoken, numpy, protobuf or brotli. docs/CODECS.md describes
every wire format, the selection rules and where m2mwire is stricter than the Rust reference.
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

_LAZY = {
    "Encoding": "m2mwire.codecs.tokenizers",
    "resolve_encoding": "m2mwire.codecs.tokenizers",
    "get_tokenizer": "m2mwire.codecs.tokenizers",
    "count_tokens": "m2mwire.codecs.tokenizers",
    "available_encodings": "m2mwire.codecs.tokenizers",
    "tokenizer_path": "m2mwire.codecs.tokenizers",
    "register_tokenizer_file": "m2mwire.codecs.tokenizers",
    "clear_tokenizer_cache": "m2mwire.codecs.tokenizers",
    "preload": "m2mwire.codecs.tokenizers",
    "Algorithm": "m2mwire.codecs.select",
    "resolve_algorithm": "m2mwire.codecs.select",
    "select_algorithm": "m2mwire.codecs.select",
    "EMITTABLE_ALGORITHMS": "m2mwire.codecs.select",
    "compress": "m2mwire.codecs.wire",
    "decompress": "m2mwire.codecs.wire",
    "detect_algorithm": "m2mwire.codecs.wire",
    "decode_wire": "m2mwire.codecs.wire",
    "Decoded": "m2mwire.codecs.wire",
    "compress_binary": "m2mwire.codecs.tokennative",
    "decompress_binary": "m2mwire.codecs.tokennative",
    "encode_m2m_binary": "m2mwire.codecs.m2mframe",
    "decode_m2m_binary": "m2mwire.codecs.m2mframe",
    "Limits": "m2mwire.codecs.limits",
    "DEFAULT_LIMITS": "m2mwire.codecs.limits",
}

__all__ = sorted(_LAZY)

if TYPE_CHECKING:
    from m2mwire.codecs.limits import DEFAULT_LIMITS as DEFAULT_LIMITS
    from m2mwire.codecs.limits import Limits as Limits
    from m2mwire.codecs.m2mframe import decode_m2m_binary as decode_m2m_binary
    from m2mwire.codecs.m2mframe import encode_m2m_binary as encode_m2m_binary
    from m2mwire.codecs.select import EMITTABLE_ALGORITHMS as EMITTABLE_ALGORITHMS
    from m2mwire.codecs.select import Algorithm as Algorithm
    from m2mwire.codecs.select import resolve_algorithm as resolve_algorithm
    from m2mwire.codecs.select import select_algorithm as select_algorithm
    from m2mwire.codecs.tokenizers import Encoding as Encoding
    from m2mwire.codecs.tokenizers import available_encodings as available_encodings
    from m2mwire.codecs.tokenizers import clear_tokenizer_cache as clear_tokenizer_cache
    from m2mwire.codecs.tokenizers import count_tokens as count_tokens
    from m2mwire.codecs.tokenizers import get_tokenizer as get_tokenizer
    from m2mwire.codecs.tokenizers import preload as preload
    from m2mwire.codecs.tokenizers import register_tokenizer_file as register_tokenizer_file
    from m2mwire.codecs.tokenizers import resolve_encoding as resolve_encoding
    from m2mwire.codecs.tokenizers import tokenizer_path as tokenizer_path
    from m2mwire.codecs.tokennative import compress_binary as compress_binary
    from m2mwire.codecs.tokennative import decompress_binary as decompress_binary
    from m2mwire.codecs.wire import Decoded as Decoded
    from m2mwire.codecs.wire import compress as compress
    from m2mwire.codecs.wire import decode_wire as decode_wire
    from m2mwire.codecs.wire import decompress as decompress
    from m2mwire.codecs.wire import detect_algorithm as detect_algorithm


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'm2mwire.codecs' has no attribute {name!r}")
    value = getattr(import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))
