"""Mode resolution: the SDK's rules 1-3 and 6, checked against avp.CompatibilityResolver."""

from __future__ import annotations

import itertools
from pathlib import Path

import avp as sdk
import pytest

from m2mwire.codecs.avp import CommunicationMode
from m2mwire.schemas.identity import ModelIdentity
from m2mwire.session.mode import ModeResolution, resolve_mode

TOK = "0123456789abcdef0123456789abcdef"


def test_rules_in_order() -> None:
    llama = ModelIdentity(
        model_family="llama", model_hash="h1", hidden_dim=8, num_layers=2, tokenizer_hash=TOK
    )
    assert resolve_mode(llama, llama) == ModeResolution("LATENT", "hash_match")
    other_hash = ModelIdentity(
        model_family="llama", model_hash="h2", hidden_dim=8, num_layers=2, num_kv_heads=9
    )
    assert resolve_mode(llama, other_hash) == ModeResolution("LATENT", "structural_match")
    qwen = ModelIdentity(
        model_family="qwen2", model_hash="h3", hidden_dim=8, num_layers=2, tokenizer_hash=TOK
    )
    assert resolve_mode(llama, qwen) == ModeResolution("LATENT", "shared_tokenizer", "vocab:0123456789abcdef")
    assert resolve_mode(llama, ModelIdentity(model_family="qwen2")) == ModeResolution("JSON", "json_fallback")
    assert resolve_mode(None, llama) == ModeResolution("JSON", "no_identity")
    assert resolve_mode(llama, None) == ModeResolution("JSON", "no_identity")


def test_empty_values_never_match() -> None:
    empty = ModelIdentity()
    assert resolve_mode(empty, empty).reason == "json_fallback"
    zeros = ModelIdentity(model_family="llama")
    assert resolve_mode(zeros, zeros).reason == "json_fallback"
    no_family = ModelIdentity(hidden_dim=8, num_layers=2)
    assert resolve_mode(no_family, no_family).reason == "json_fallback"


def test_resolution_helpers() -> None:
    assert ModeResolution("LATENT", "hash_match").latent
    assert ModeResolution("LATENT", "hash_match").communication_mode is CommunicationMode.LATENT
    assert ModeResolution("JSON", "json_fallback").communication_mode is CommunicationMode.JSON


# A pool of identities whose pairs hit every rule and every near miss.
POOL = [
    ModelIdentity(),
    ModelIdentity(model_hash="h1"),
    ModelIdentity(model_hash="h1", model_family="llama", hidden_dim=8, num_layers=2),
    ModelIdentity(
        model_hash="h2", model_family="llama", hidden_dim=8, num_layers=2, num_kv_heads=4, head_dim=2
    ),
    ModelIdentity(model_family="llama", hidden_dim=8, num_layers=3),
    ModelIdentity(model_family="llama", hidden_dim=16, num_layers=2),
    ModelIdentity(model_family="Llama", hidden_dim=8, num_layers=2),
    ModelIdentity(model_family="llama", hidden_dim=0, num_layers=0),
    ModelIdentity(model_family="", hidden_dim=8, num_layers=2),
    ModelIdentity(model_family="qwen2", hidden_dim=8, num_layers=2, tokenizer_hash=TOK),
    ModelIdentity(model_family="llama", model_hash="h3", tokenizer_hash=TOK),
    ModelIdentity(tokenizer_hash="ab"),
    ModelIdentity(tokenizer_hash="ab", model_hash="h1"),
]


@pytest.fixture
def no_sdk_map_files(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The SDK's rule 4 looks for calibrated map files; point it at an empty directory."""
    monkeypatch.setenv("AVP_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("HOME", str(tmp_path))


@pytest.mark.usefixtures("no_sdk_map_files")
def test_matrix_matches_sdk_resolver() -> None:
    for a, b in itertools.product(POOL, repeat=2):
        ours = resolve_mode(a, b)
        theirs = sdk.CompatibilityResolver.resolve(
            sdk.ModelIdentity(**a.to_dict()), sdk.ModelIdentity(**b.to_dict())
        )
        assert ours.mode == theirs.mode.name, (a, b)
        assert ours.reason == theirs.resolution_path, (a, b)
        assert ours.avp_map_id == theirs.avp_map_id, (a, b)
