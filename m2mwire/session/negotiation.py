"""HELLO/ACCEPT negotiation: the seed's rules (section 5.8), pure functions.

Unlike the existing implementation (which picks one algorithm per side and answers with its own full
capabilities), ACCEPT carries the negotiated result: the intersection of algorithms in the client's
order, exactly one encoding, the smaller max_payload, and the resolved latent mode.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Literal

import msgspec

from m2mwire.codecs import Algorithm, Encoding, resolve_algorithm, resolve_encoding
from m2mwire.codecs.zstdcontext import normalize_window
from m2mwire.errors import M2MError
from m2mwire.schemas.codes import RejectCode
from m2mwire.schemas.identity import ModelIdentity
from m2mwire.schemas.messages import PROTOCOL_VERSION, Capabilities, CompressionCaps, LatentCaps, ZstdCaps
from m2mwire.session.mode import resolve_mode

__all__ = [
    "CANONICAL_ENCODING",
    "Negotiated",
    "Refusal",
    "ZstdAgreement",
    "accept_capabilities",
    "negotiate_client",
    "negotiate_server",
    "parse_algorithms",
    "parse_encodings",
    "version_compatible",
]

CANONICAL_ENCODING = Encoding.CL100K
# The docs number the same protocol "1.x"; the code has always said "3.0". Both majors interoperate.
_COMPATIBLE_MAJORS = frozenset({"1", "3"})


@dataclass(frozen=True, slots=True)
class ZstdAgreement:
    """Session-context zstd as agreed: both directions use ``window`` and ``dictionary``."""

    window: int  # bytes: the smaller of both offers
    dictionary: str | None  # SHA-256 (hex) of the shared dictionary, or None
    peer_binary: bool  # the peer accepts the binary form
    history: bool = False  # shared history across directions (both offered it)


@dataclass(frozen=True, slots=True)
class Negotiated:
    """What both ends agreed on."""

    algorithms: tuple[Algorithm, ...]
    encoding: Encoding
    max_payload: int  # 0 = none announced (each side keeps limits.max_message_bytes)
    mode: Literal["LATENT", "JSON"]
    mode_reason: str
    avp_map_id: str = ""
    zstd: ZstdAgreement | None = None  # set when "zstd" is among the algorithms
    binary_text: bool = False  # both ends take large text DATA in binary form (kind 'T')


@dataclass(frozen=True, slots=True)
class Refusal:
    """Why a HELLO was refused: a seed REJECT code and a message for humans."""

    code: RejectCode
    message: str


def version_compatible(version: str) -> bool:
    return version.split(".", 1)[0] in _COMPATIBLE_MAJORS


def parse_algorithms(names: Iterable[str]) -> list[Algorithm]:
    """Map wire names (any spelling we know) to algorithms, dropping unknown ones and duplicates."""
    out: list[Algorithm] = []
    for name in names:
        try:
            alg = resolve_algorithm(name)
        except M2MError:
            continue  # e.g. the reference's "m2m": we cannot speak it, so it is not common
        if alg is not Algorithm.ZLIB and alg not in out:
            out.append(alg)
    return out


def parse_encodings(names: Iterable[str]) -> list[Encoding]:
    out: list[Encoding] = []
    for name in names:
        try:
            enc = resolve_encoding(name)
        except M2MError:
            continue
        if enc not in out:
            out.append(enc)
    return out


def _pick_encoding(
    preferred: Encoding | None, theirs_in_order: Sequence[Encoding], ours: Sequence[Encoding]
) -> Encoding:
    if preferred is not None and preferred in ours:
        return preferred
    for enc in theirs_in_order:
        if enc in ours:
            return enc
    return CANONICAL_ENCODING


def _client_encoding(
    theirs: Sequence[Encoding], preferred: Encoding | None, ours: Sequence[Encoding]
) -> Encoding:
    """The tokenizer a client uses after ACCEPT.

    An ACCEPT naming exactly one encoding carries the server's decision (ours always does), and the
    client follows it even when it did not offer it: that is the canonical cl100k fallback of a
    server that has none of the client's tokenizers, and that server may be unable to read any
    other. An ACCEPT listing several is a server's full capabilities (the reference answers so); the
    client then applies the reference's own rule from its side: its preferred encoding if the server
    lists it, else its first one the server lists, else the canonical fallback.
    """
    if len(theirs) == 1:
        return theirs[0]
    if preferred is not None and preferred in theirs:
        return preferred
    for enc in ours:
        if enc in theirs:
            return enc
    return CANONICAL_ENCODING


def _min_payload(a: int, b: int) -> int:
    if a <= 0:
        return max(b, 0)
    if b <= 0:
        return a
    return min(a, b)


def _preferred(name: str) -> Encoding | None:
    if not name:
        return None
    try:
        return resolve_encoding(name)
    except M2MError:
        return None


def _their_zstd(caps: CompressionCaps) -> ZstdCaps:
    return caps.zstd if isinstance(caps.zstd, ZstdCaps) else ZstdCaps()  # absent: the defaults


def _agree_zstd(ours: ZstdCaps | None, theirs: ZstdCaps) -> ZstdAgreement:
    own = ours or ZstdCaps()
    window = min(normalize_window(own.window), normalize_window(theirs.window))
    # Server: the first of the client's dictionaries it has too (the client's order of preference).
    # Client: the one the ACCEPT names, if the client offered it.
    dictionary = next((d for d in theirs.dictionaries if d in own.dictionaries), None)
    # Server: both offered it. Client: the ACCEPT says it is used, and we offered it.
    history = own.history and theirs.history
    return ZstdAgreement(window=window, dictionary=dictionary, peer_binary=theirs.binary, history=history)


def negotiate_server(
    hello: Capabilities,
    *,
    algorithms: Sequence[Algorithm],
    encodings: Sequence[Encoding],
    max_payload: int,
    identity: ModelIdentity | None,
    zstd: ZstdCaps | None = None,
    binary_text: bool = False,
) -> Negotiated | Refusal:
    """The server's decision on a client's HELLO (``binary_text``: the server takes text DATA in
    binary form)."""
    if not version_compatible(hello.version):
        return Refusal(
            RejectCode.VERSION_MISMATCH, f"Version {hello.version} not compatible with {PROTOCOL_VERSION}"
        )
    theirs = parse_algorithms(hello.compression.algorithms)
    common = tuple(a for a in theirs if a in algorithms)
    if not common:
        offered = ", ".join(hello.compression.algorithms)
        offer = f"client offered: {offered}" if offered else "the client offered no algorithm"
        ours = ", ".join(a.value for a in algorithms)
        return Refusal(
            RejectCode.NO_COMMON_ALGORITHM,
            f"No common compression algorithm ({offer}; server supports: {ours})",
        )
    their_encodings = parse_encodings(hello.compression.encodings)
    encoding = _pick_encoding(_preferred(hello.compression.preferred_encoding), their_encodings, encodings)
    remote_identity = hello.avp.identity if isinstance(hello.avp, LatentCaps) else None
    resolution = resolve_mode(identity, remote_identity)
    agreed = _agree_zstd(zstd, _their_zstd(hello.compression)) if Algorithm.ZSTD in common else None
    return Negotiated(
        algorithms=common,
        encoding=encoding,
        max_payload=_min_payload(max_payload, hello.compression.max_payload),
        mode=resolution.mode,
        mode_reason=resolution.reason,
        avp_map_id=resolution.avp_map_id,
        zstd=agreed,
        binary_text=binary_text and hello.binary_text is True,
    )


def accept_capabilities(server_caps: Capabilities, result: Negotiated) -> Capabilities:
    """The ACCEPT payload: the server's identity fields with the negotiated compression and mode."""
    identity = server_caps.avp.identity if isinstance(server_caps.avp, LatentCaps) else None
    zstd: ZstdCaps | msgspec.UnsetType = msgspec.UNSET
    if result.zstd is not None:
        zstd = ZstdCaps(
            window=result.zstd.window,
            binary=_their_zstd(server_caps.compression).binary,
            dictionaries=[result.zstd.dictionary] if result.zstd.dictionary else [],
            history=result.zstd.history,
        )
    return Capabilities(
        version=PROTOCOL_VERSION,
        agent_id=server_caps.agent_id,
        agent_type=server_caps.agent_type,
        compression=CompressionCaps(
            algorithms=[a.value for a in result.algorithms],
            max_payload=result.max_payload,
            streaming=server_caps.compression.streaming,
            ml_routing=server_caps.compression.ml_routing,
            encodings=[result.encoding.reference_name],
            preferred_encoding=result.encoding.reference_name,
            zstd=zstd,
        ),
        security=server_caps.security,
        extensions=server_caps.extensions,
        avp=LatentCaps(
            identity=identity, mode=result.mode, reason=result.mode_reason, avp_map_id=result.avp_map_id
        ),
        binary_text=True if result.binary_text else msgspec.UNSET,
    )


def negotiate_client(
    accept: Capabilities,
    *,
    algorithms: Sequence[Algorithm],
    encodings: Sequence[Encoding],
    preferred_encoding: Encoding | None,
    max_payload: int,
    zstd: ZstdCaps | None = None,
    binary_text: bool = False,
) -> Negotiated | Refusal:
    """The client's view of an ACCEPT (``binary_text``: the client offered text DATA in binary form).

    Works both with our servers (ACCEPT holds the negotiated set) and with servers that answer with
    their full capabilities, as the existing implementation does: the client intersects again.
    """
    if not version_compatible(accept.version):
        return Refusal(
            RejectCode.VERSION_MISMATCH, f"Version {accept.version} not compatible with {PROTOCOL_VERSION}"
        )
    theirs = parse_algorithms(accept.compression.algorithms)
    common = tuple(a for a in algorithms if a in theirs)
    if not common:
        return Refusal(RejectCode.NO_COMMON_ALGORITHM, "ACCEPT lists no algorithm this client offered")
    encoding = _client_encoding(parse_encodings(accept.compression.encodings), preferred_encoding, encodings)
    latent = accept.avp if isinstance(accept.avp, LatentCaps) else None
    mode: Literal["LATENT", "JSON"] = "JSON"
    if latent is not None and latent.mode is not None:
        mode = latent.mode
    reason = (latent.reason or "") if latent is not None else "no_identity"
    agreed: ZstdAgreement | None = None
    if Algorithm.ZSTD in common:
        accepted = _their_zstd(accept.compression)
        agreed = _agree_zstd(zstd, accepted)
        # Our servers name the one dictionary they chose; one we never offered cannot be used.
        if accepted.dictionaries and agreed.dictionary is None:
            return Refusal(RejectCode.UNKNOWN, "ACCEPT names a zstd dictionary this client did not offer")
    return Negotiated(
        algorithms=common,
        encoding=encoding,
        max_payload=_min_payload(max_payload, accept.compression.max_payload),
        mode=mode,
        mode_reason=reason,
        avp_map_id=latent.avp_map_id if latent is not None else "",
        zstd=agreed,
        binary_text=binary_text and accept.binary_text is True,
    )
