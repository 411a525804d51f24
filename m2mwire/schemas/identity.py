"""Model identity for AVP latent mode, with the reference SDK's hashes.

:class:`ModelIdentity` travels inside HELLO/ACCEPT as JSON. Its field names are those of the SDK's
``identity`` object. ``to_dict()`` gives the SDK's exact object (``tokenizer_hash`` left out when
empty); msgspec's own encoding of the struct always writes all eight keys, which the SDK reads back
to the same identity.

Hashes, as the SDK computes them (``avp.compute_model_hash`` / ``avp.compute_tokenizer_hash``):

* ``model_hash`` = SHA-256 hex of ``json.dumps(config, sort_keys=True, separators=(",", ":"))``
  over the *whole* config dict (``_name_or_path`` included, so the same weights loaded from two
  paths hash differently; cross-implementation matches normally come through ``structural_match``);
* ``tokenizer_hash`` = SHA-256 hex of ``json.dumps(sorted(vocab.items()), separators=(",", ":"))``.

Both use Python's ``json`` defaults otherwise: ASCII escapes, ``NaN``/``Infinity`` allowed, float repr.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from typing import Any, Protocol, runtime_checkable

import msgspec

__all__ = [
    "ModelIdentity",
    "compute_model_hash",
    "compute_tokenizer_hash",
    "identity_from_config",
]


class ModelIdentity(msgspec.Struct, frozen=True, kw_only=True):
    """What an agent says about its model; compared by :func:`m2mwire.session.mode.resolve_mode`."""

    model_family: str = ""  # HF config "model_type", e.g. "llama"
    model_id: str = ""  # HF "_name_or_path", e.g. "meta-llama/Llama-2-7b"
    model_hash: str = ""  # compute_model_hash(config): 64 lowercase hex digits, no prefix
    hidden_dim: int = 0
    num_layers: int = 0
    num_kv_heads: int = 0
    head_dim: int = 0
    tokenizer_hash: str = ""  # compute_tokenizer_hash(vocab), or ""

    def to_dict(self) -> dict[str, Any]:
        """The SDK's JSON ``identity`` object: every key, ``tokenizer_hash`` only when non-empty."""
        out: dict[str, Any] = {
            "model_family": self.model_family,
            "model_id": self.model_id,
            "model_hash": self.model_hash,
            "hidden_dim": self.hidden_dim,
            "num_layers": self.num_layers,
            "num_kv_heads": self.num_kv_heads,
            "head_dim": self.head_dim,
        }
        if self.tokenizer_hash:
            out["tokenizer_hash"] = self.tokenizer_hash
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> ModelIdentity:
        """Read an SDK ``identity`` object; missing keys take their defaults, unknown keys are ignored."""
        return msgspec.convert(
            {k: v for k, v in data.items() if k in cls.__struct_fields__}, cls, strict=False
        )


@runtime_checkable
class _HasVocab(Protocol):
    def get_vocab(self) -> Mapping[str, int]: ...


def _sha256_json(obj: object, *, sort_keys: bool) -> str:
    text = json.dumps(obj, sort_keys=sort_keys, separators=(",", ":"))
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def compute_model_hash(config: Mapping[str, Any]) -> str:
    """SHA-256 hex of the canonical JSON of a model config (same digest as the SDK).

    Raises ``TypeError`` for values JSON cannot represent, and for keys that cannot be sorted
    together (mixed ``str``/``int`` keys), as the SDK does.
    """
    return _sha256_json(dict(config), sort_keys=True)


def compute_tokenizer_hash(vocab: Mapping[str, int] | _HasVocab) -> str:
    """SHA-256 hex of the JSON of the sorted (token, id) pairs; takes a vocab or a tokenizer."""
    mapping = vocab.get_vocab() if isinstance(vocab, _HasVocab) else vocab
    return _sha256_json(sorted(mapping.items()), sort_keys=False)


def _int(value: object) -> int:
    """Config integers: 0 for missing, null, booleans and anything that is not integral."""
    if isinstance(value, bool) or value is None:
        return 0
    if isinstance(value, int):
        return value
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return 0


def identity_from_config(
    config: Mapping[str, Any], *, tokenizer_vocab: Mapping[str, int] | _HasVocab | None = None
) -> ModelIdentity:
    """The identity the SDK's ``extract_model_identity`` derives from an HF-style config dict.

    * family ``model_type``; id ``_name_or_path``; hash over the whole config;
    * hidden ``hidden_size`` or else ``n_embd``; layers ``num_hidden_layers`` or else ``n_layer``;
    * heads ``num_attention_heads`` or else ``n_head``; kv heads ``num_key_value_heads`` or else
      heads; head_dim ``head_dim`` or else hidden // heads (0 without heads). "Or else" means the
      first key that is present and non-zero, as in the SDK;
    * ``tokenizer_hash`` from ``tokenizer_vocab`` when given.

    Unlike the SDK, values that are not integers (e.g. ``"4096"``) count as 0, and no warning is
    printed when ``hidden_dim`` is 0.
    """
    hidden = _int(config.get("hidden_size")) or _int(config.get("n_embd"))
    layers = _int(config.get("num_hidden_layers")) or _int(config.get("n_layer"))
    heads = _int(config.get("num_attention_heads")) or _int(config.get("n_head"))
    kv_heads = _int(config.get("num_key_value_heads")) or heads
    head_dim = _int(config.get("head_dim")) or (hidden // heads if heads else 0)
    family = config.get("model_type")
    model_id = config.get("_name_or_path")
    return ModelIdentity(
        model_family=family if isinstance(family, str) else "",
        model_id=model_id if isinstance(model_id, str) else "",
        model_hash=compute_model_hash(config),
        hidden_dim=hidden,
        num_layers=layers,
        num_kv_heads=kv_heads,
        head_dim=head_dim,
        tokenizer_hash=compute_tokenizer_hash(tokenizer_vocab) if tokenizer_vocab is not None else "",
    )
