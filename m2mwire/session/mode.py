"""Latent (AVP) or JSON mode, from the two agents' model identities, by the reference SDK's rules.

First match wins (``avp.CompatibilityResolver.resolve``):

1. both ``model_hash`` equal and non-empty           -> LATENT, ``hash_match``
2. same non-empty ``model_family`` and equal non-zero ``hidden_dim`` and ``num_layers``
   (``num_kv_heads`` and ``head_dim`` are not compared) -> LATENT, ``structural_match``
3. both ``tokenizer_hash`` equal and non-empty       -> LATENT, ``shared_tokenizer``,
   ``avp_map_id = "vocab:" + tokenizer_hash[:16]``
4. (SDK only) a calibrated map file ``~/.avp/maps/<src16>_<tgt16>.pt`` exists -> ``avp_map_file``
5. (SDK only) tokenizer objects share >= 100 tokens   -> ``vocab_overlap``
6. otherwise                                         -> JSON, ``json_fallback``

Rules 4 and 5 are not implemented: they need local files or tokenizer objects, not what travels in
a HELLO (the SDK's own client never supplies tokenizers either). When either side offers no
identity the result is JSON with reason ``no_identity`` (the SDK requires both identities).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal, TypeAlias

from m2mwire.schemas.identity import ModelIdentity

if TYPE_CHECKING:
    from m2mwire.codecs.avp import CommunicationMode

__all__ = ["Mode", "ModeReason", "ModeResolution", "resolve_mode"]

Mode: TypeAlias = Literal["LATENT", "JSON"]
ModeReason: TypeAlias = Literal[
    "hash_match", "structural_match", "shared_tokenizer", "json_fallback", "no_identity"
]


@dataclass(frozen=True, slots=True)
class ModeResolution:
    """The negotiated mode, why, and the projection map id (``""`` unless ``shared_tokenizer``)."""

    mode: Mode
    reason: ModeReason
    avp_map_id: str = ""

    @property
    def latent(self) -> bool:
        return self.mode == "LATENT"

    @property
    def communication_mode(self) -> CommunicationMode:
        """The mode as the AVP metadata enum (``mode`` field 10)."""
        from m2mwire.codecs.avp import CommunicationMode  # local: numpy/protobuf stay off text paths

        return CommunicationMode.LATENT if self.mode == "LATENT" else CommunicationMode.JSON


def resolve_mode(local: ModelIdentity | None, remote: ModelIdentity | None) -> ModeResolution:
    """Decide the mode for a session between ``local`` and ``remote`` (symmetric in its result)."""
    if local is None or remote is None:
        return ModeResolution("JSON", "no_identity")
    if local.model_hash and local.model_hash == remote.model_hash:
        return ModeResolution("LATENT", "hash_match")
    if (
        local.model_family
        and local.model_family == remote.model_family
        and local.hidden_dim
        and local.hidden_dim == remote.hidden_dim
        and local.num_layers
        and local.num_layers == remote.num_layers
    ):
        return ModeResolution("LATENT", "structural_match")
    if local.tokenizer_hash and local.tokenizer_hash == remote.tokenizer_hash:
        return ModeResolution("LATENT", "shared_tokenizer", "vocab:" + local.tokenizer_hash[:16])
    return ModeResolution("JSON", "json_fallback")
