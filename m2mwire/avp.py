"""AVP (Agent Vector Protocol) latent frames: the public API in one place.

    from m2mwire import avp

    frame = avp.encode_hidden_state(hidden, model_id="meta-llama/Llama-2-7b", compress=True)
    msg = avp.decode(frame)
    msg.tensor()          # numpy view of the payload, shaped by tensor_shape
    msg.metadata          # AVPMetadata: every protobuf field

    frame = avp.encode_kv_cache([(k0, v0), (k1, v1)], model_id="...")
    kv = avp.decode(frame).kv_cache()   # kv.layers[i] == (K_i, V_i), views [heads, seq, head_dim]

Frames are byte-compatible with the reference SDK ``avp`` 0.6.2; docs/AVP.md has the details.
"""

from __future__ import annotations

from m2mwire.codecs.avp import (
    CONTENT_TYPE,
    DEFAULT_MAX_OUTPUT_BYTES,
    DEFAULT_ZSTD_LEVEL,
    FLAG_COMPRESSED,
    FLAG_HAS_MAP,
    FLAG_KV_CACHE,
    FLAG_RESERVED_MASK,
    HEADER_SIZE,
    MAGIC,
    MAX_PAYLOAD_LENGTH,
    VERSION,
    AVPHeader,
    AVPMessage,
    AVPMetadata,
    CommunicationMode,
    DataType,
    MetadataFields,
    PayloadType,
    bfloat16_to_float32,
    crc32,
    decode,
    encode,
    encode_hidden_state,
    encode_hidden_state_parts,
    encode_parts,
    float32_to_bfloat16,
    frame_length,
    parse_header,
)
from m2mwire.codecs.kvcache import (
    KV_HEADER_SIZE,
    MAX_KV_LAYERS,
    KVCache,
    KVLayers,
    KVLayerView,
    build_kv_payload,
    encode_kv_cache,
    encode_kv_cache_parts,
    kv_payload_parts,
    kv_payload_size,
    pack_kv_header,
    parse_kv_payload,
    unpack_kv_header,
)
from m2mwire.errors import ChecksumMismatch, DecodeError, EncodeError, LimitExceeded
from m2mwire.schemas.identity import (
    ModelIdentity,
    compute_model_hash,
    compute_tokenizer_hash,
    identity_from_config,
)
from m2mwire.session.mode import ModeResolution, resolve_mode

__all__ = [
    "CONTENT_TYPE",
    "DEFAULT_MAX_OUTPUT_BYTES",
    "DEFAULT_ZSTD_LEVEL",
    "FLAG_COMPRESSED",
    "FLAG_HAS_MAP",
    "FLAG_KV_CACHE",
    "FLAG_RESERVED_MASK",
    "HEADER_SIZE",
    "KV_HEADER_SIZE",
    "MAGIC",
    "MAX_KV_LAYERS",
    "MAX_PAYLOAD_LENGTH",
    "VERSION",
    "AVPHeader",
    "AVPMessage",
    "AVPMetadata",
    "ChecksumMismatch",
    "CommunicationMode",
    "DataType",
    "DecodeError",
    "EncodeError",
    "KVCache",
    "KVLayerView",
    "KVLayers",
    "LimitExceeded",
    "MetadataFields",
    "ModeResolution",
    "ModelIdentity",
    "PayloadType",
    "bfloat16_to_float32",
    "build_kv_payload",
    "compute_model_hash",
    "compute_tokenizer_hash",
    "crc32",
    "decode",
    "encode",
    "encode_hidden_state",
    "encode_hidden_state_parts",
    "encode_kv_cache",
    "encode_kv_cache_parts",
    "encode_parts",
    "float32_to_bfloat16",
    "frame_length",
    "identity_from_config",
    "kv_payload_parts",
    "kv_payload_size",
    "pack_kv_header",
    "parse_header",
    "parse_kv_payload",
    "resolve_mode",
    "unpack_kv_header",
]
