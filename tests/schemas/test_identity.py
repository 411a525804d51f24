"""ModelIdentity and the SDK-compatible model/tokenizer hashes (checked against the real SDK)."""

from __future__ import annotations

import math
import warnings
from typing import Any

import avp as sdk
import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from m2mwire.schemas.identity import (
    ModelIdentity,
    compute_model_hash,
    compute_tokenizer_hash,
    identity_from_config,
)

LLAMA = {
    "model_type": "llama",
    "_name_or_path": "meta-llama/Llama-2-7b",
    "hidden_size": 4096,
    "num_hidden_layers": 32,
    "num_attention_heads": 32,
    "num_key_value_heads": 32,
    "head_dim": 128,
    "tie_word_embeddings": False,
}
LLAMA_HASH = "ecbf6eaf9964c8a9a57ee320fe274a8102b580276000f0b592cd4eb835802b15"
VOCAB = {"a": 0, "b": 1, "<s>": 2}
VOCAB_HASH = "e097082e07cab96b0d1bc97c0fe971de13bba8fe26c98fadb0679f559076e0be"


def sdk_identity(config: dict[str, Any], tokenizer: Any = None) -> dict[str, Any]:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the SDK warns when hidden_dim is 0
        ident = sdk.extract_model_identity(config, tokenizer)
    return dict(vars(ident))


def test_reference_vectors() -> None:
    assert compute_model_hash(LLAMA) == LLAMA_HASH
    assert (
        compute_model_hash({"a": 1, "b": 2})
        == "43258cff783fe7036d8a43033f830adfc60ec037382473548ac742b888292777"
    )
    assert compute_tokenizer_hash(VOCAB) == VOCAB_HASH


def test_identity_from_reference_config() -> None:
    ident = identity_from_config(LLAMA)
    assert ident == ModelIdentity(
        model_family="llama",
        model_id="meta-llama/Llama-2-7b",
        model_hash=LLAMA_HASH,
        hidden_dim=4096,
        num_layers=32,
        num_kv_heads=32,
        head_dim=128,
    )


class Tokenizer:
    def get_vocab(self) -> dict[str, int]:
        return dict(VOCAB)


def test_tokenizer_object_or_mapping() -> None:
    assert compute_tokenizer_hash(Tokenizer()) == VOCAB_HASH
    assert identity_from_config(LLAMA, tokenizer_vocab=Tokenizer()).tokenizer_hash == VOCAB_HASH
    assert sdk.compute_tokenizer_hash(Tokenizer()) == VOCAB_HASH


CONFIGS: list[dict[str, Any]] = [
    {},
    LLAMA,
    {"model_type": "gpt2", "n_embd": 768, "n_layer": 12, "n_head": 12, "_name_or_path": "gpt2"},
    {"model_type": "llama", "hidden_size": 4096, "num_hidden_layers": 32, "num_attention_heads": 32},
    {"model_type": "llama", "hidden_size": 4096, "num_attention_heads": 32, "num_key_value_heads": 8},
    {"model_type": "llama", "hidden_size": 4096, "num_attention_heads": 32, "head_dim": None},
    {"model_type": "llama", "hidden_size": 4096, "num_hidden_layers": 32, "num_attention_heads": 0},
    {"hidden_size": 4096, "n_embd": 10, "num_hidden_layers": 32, "n_layer": 3, "num_attention_heads": 32},
    {
        "hidden_size": 0,
        "n_embd": 10,
        "num_hidden_layers": 0,
        "n_layer": 3,
        "num_attention_heads": 0,
        "n_head": 5,
    },
    {"model_type": "qwen2", "hidden_size": 10, "num_attention_heads": 3, "rope_theta": 1e6, "é": "ü"},
    {"model_type": "x", "hidden_size": 4096, "num_key_value_heads": 8, "n_head": 32, "head_dim": 0},
    {"model_type": "x", "text_config": {"hidden_size": 8}, "torch_dtype": "bfloat16", "nan": math.nan},
]


@pytest.mark.parametrize("config", CONFIGS)
def test_identity_matches_sdk(config: dict[str, Any]) -> None:
    assert msgspec.structs.asdict(identity_from_config(config)) == sdk_identity(config)
    assert msgspec.structs.asdict(identity_from_config(config, tokenizer_vocab=VOCAB)) == sdk_identity(
        config, VOCAB
    )


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3),
    max_leaves=10,
)


@settings(max_examples=150, deadline=None)
@given(config=st.dictionaries(st.text(max_size=12), json_values, max_size=6))
def test_model_hash_matches_sdk(config: dict[str, Any]) -> None:
    assert compute_model_hash(config) == sdk.compute_model_hash(config)


@settings(max_examples=150, deadline=None)
@given(vocab=st.dictionaries(st.text(max_size=10), st.integers(0, 300_000), max_size=30))
def test_tokenizer_hash_matches_sdk(vocab: dict[str, int]) -> None:
    assert compute_tokenizer_hash(vocab) == sdk.compute_tokenizer_hash(vocab)


def test_unhashable_config_raises_type_error() -> None:
    with pytest.raises(TypeError):
        compute_model_hash({"x": object()})
    with pytest.raises(TypeError):
        compute_model_hash({1: 2, "a": 3})  # type: ignore[dict-item]


def test_non_integer_config_values_count_as_zero() -> None:
    """A deliberate difference: the SDK copies a string "4096" into hidden_dim."""
    assert identity_from_config({"hidden_size": "4096", "num_hidden_layers": 2.0}).hidden_dim == 0
    assert identity_from_config({"num_hidden_layers": 2.0}).num_layers == 2


def test_json_shape_matches_sdk_hello_identity() -> None:
    for tok in (None, VOCAB):
        ident = identity_from_config(LLAMA, tokenizer_vocab=tok)
        sdk_ident = sdk.extract_model_identity(LLAMA, tok)
        sdk_json = sdk.HelloMessage(agent_id="a", identity=sdk_ident).to_dict()["identity"]
        assert ident.to_dict() == sdk_json
        assert list(ident.to_dict()) == list(sdk_json)  # same keys, same order
        assert ModelIdentity.from_dict(sdk_json) == ident
        # msgspec's own encoding (used inside HELLO) always writes all eight keys; the SDK reads it back.
        native = msgspec.json.decode(msgspec.json.encode(ident))
        assert list(native) == [*list(ident.to_dict()), *(["tokenizer_hash"] if tok is None else [])]
        assert dict(vars(sdk.HelloMessage.from_dict({"agent_id": "a", "identity": native}).identity)) == dict(
            vars(sdk_ident)
        )
        assert msgspec.json.decode(msgspec.json.encode(ident), type=ModelIdentity) == ident


def test_from_dict_is_lenient_like_the_sdk() -> None:
    assert ModelIdentity.from_dict({"model_family": "llama", "unknown": 1}) == ModelIdentity(
        model_family="llama"
    )
    assert ModelIdentity.from_dict({}) == ModelIdentity()


def test_identity_is_frozen_and_keyword_only() -> None:
    ident = ModelIdentity(model_family="llama")
    with pytest.raises(AttributeError):
        ident.model_family = "qwen"  # type: ignore[misc]
    with pytest.raises(TypeError):
        ModelIdentity("llama")  # type: ignore[call-arg]
    assert hash(ident) == hash(ModelIdentity(model_family="llama"))
