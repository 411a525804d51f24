"""The seed's negotiation rules: algorithm intersection, encoding choice, max_payload, versions."""

from __future__ import annotations

import itertools

import pytest

from m2mwire.codecs import Algorithm, Encoding
from m2mwire.schemas.identity import ModelIdentity
from m2mwire.schemas.messages import Capabilities, CompressionCaps, LatentCaps
from m2mwire.session.negotiation import (
    Negotiated,
    Refusal,
    accept_capabilities,
    negotiate_client,
    negotiate_server,
    version_compatible,
)

A = Algorithm
E = Encoding


def hello(
    algorithms: list[str],
    encodings: list[str] | None = None,
    preferred: str = "Cl100kBase",
    *,
    version: str = "3.0",
    max_payload: int = 0,
    identity: ModelIdentity | None = None,
) -> Capabilities:
    return Capabilities(
        version=version,
        agent_id="client",
        agent_type="test",
        compression=CompressionCaps(
            algorithms=algorithms,
            max_payload=max_payload,
            encodings=encodings or [],
            preferred_encoding=preferred,
        ),
        avp=LatentCaps(identity=identity),
    )


def server(
    caps: Capabilities, algs: tuple[Algorithm, ...], encs: tuple[Encoding, ...], **kw: object
) -> Negotiated:
    result = negotiate_server(
        caps,
        algorithms=algs,
        encodings=encs,
        max_payload=int(kw.get("max_payload", 0)),  # type: ignore[call-overload]
        identity=kw.get("identity"),  # type: ignore[arg-type]
    )
    assert isinstance(result, Negotiated), result
    return result


def test_seed_example() -> None:
    # Seed 5.8: client [TOKEN_NATIVE, TOKEN, BROTLI] / [CL100K, O200K] pref O200K;
    # server [TOKEN_NATIVE, BROTLI] / [CL100K] -> [TOKEN_NATIVE, BROTLI], CL100K.
    caps = hello(["TOKEN_NATIVE", "TOKEN", "BROTLI"], ["CL100K_BASE", "O200K_BASE"], "O200K_BASE")
    result = server(caps, (A.TOKENNATIVE, A.BROTLI), (E.CL100K,))
    assert result.algorithms == (A.TOKENNATIVE, A.BROTLI)
    assert result.encoding is E.CL100K


def test_intersection_follows_client_order() -> None:
    caps = hello(["brotli", "none", "tokennative"])
    result = server(caps, (A.TOKENNATIVE, A.TOKEN, A.NONE, A.BROTLI), (E.CL100K,))
    assert result.algorithms == (A.BROTLI, A.NONE, A.TOKENNATIVE)


ALL_ALGS = [A.TOKENNATIVE, A.TOKEN, A.BROTLI, A.DICTIONARY, A.NONE]


@pytest.mark.parametrize(
    ("client_algs", "server_algs"),
    [
        (c, s)
        for c, s in itertools.product(
            [ALL_ALGS[:k] for k in range(1, 6)] + [ALL_ALGS[2:], ALL_ALGS[::-1]],
            [ALL_ALGS[:k] for k in range(1, 6)] + [ALL_ALGS[3:], [A.NONE]],
        )
    ],
)
def test_algorithm_matrix(client_algs: list[Algorithm], server_algs: list[Algorithm]) -> None:
    caps = hello([a.value for a in client_algs])
    result = negotiate_server(
        caps, algorithms=tuple(server_algs), encodings=(E.CL100K,), max_payload=0, identity=None
    )
    expected = tuple(a for a in client_algs if a in server_algs)
    if expected:
        assert isinstance(result, Negotiated) and result.algorithms == expected
    else:
        assert result == Refusal("NO_COMMON_ALGORITHM", result.message)  # type: ignore[union-attr]


@pytest.mark.parametrize(
    ("client_encs", "preferred", "server_encs", "expected"),
    [
        (["Cl100kBase", "O200kBase"], "O200kBase", (E.CL100K, E.O200K), E.O200K),  # preferred, server has it
        (["Cl100kBase", "O200kBase"], "O200kBase", (E.CL100K,), E.CL100K),  # first common
        (["O200kBase", "LlamaBpe"], "LlamaBpe", (E.O200K, E.CL100K), E.O200K),  # first common (client order)
        (["LlamaBpe"], "LlamaBpe", (E.O200K,), E.CL100K),  # nothing common -> canonical fallback
        ([], "Cl100kBase", (E.O200K,), E.CL100K),
        (["llama3", "o200k_base"], "L", (E.LLAMA3, E.O200K), E.LLAMA3),  # any spelling
        (["CL100K_BASE"], "CL100K_BASE", (E.CL100K,), E.CL100K),  # docs' spelling
    ],
)
def test_encoding_rules(
    client_encs: list[str], preferred: str, server_encs: tuple[Encoding, ...], expected: Encoding
) -> None:
    result = server(hello(["tokennative"], client_encs, preferred), (A.TOKENNATIVE,), server_encs)
    assert result.encoding is expected


def test_no_common_algorithm_refusal_names_both_sides() -> None:
    result = negotiate_server(
        hello(["dictionary"]), algorithms=(A.BROTLI,), encodings=(E.CL100K,), max_payload=0, identity=None
    )
    assert isinstance(result, Refusal) and result.code == "NO_COMMON_ALGORITHM"
    assert "dictionary" in result.message and "brotli" in result.message


def test_an_empty_offer_is_not_told_as_the_algorithm_none() -> None:
    """The refusal of ``algorithms: []`` said "client offered: none", which reads as the algorithm
    ``none`` (a clean-room client's report)."""
    result = negotiate_server(
        hello([]), algorithms=(A.BROTLI,), encodings=(E.CL100K,), max_payload=0, identity=None
    )
    assert isinstance(result, Refusal) and result.code == "NO_COMMON_ALGORITHM"
    assert "offered no algorithm" in result.message and "offered: none" not in result.message


def test_unknown_algorithm_names_are_ignored_not_fatal() -> None:
    result = server(hello(["m2m", "m3", "tokennative"]), (A.TOKENNATIVE,), (E.CL100K,))
    assert result.algorithms == (A.TOKENNATIVE,)


@pytest.mark.parametrize(
    ("version", "ok"),
    [
        ("3.0", True),
        ("3.7", True),
        ("1.0", True),
        ("1.2", True),
        ("2.0", False),
        ("4.0", False),
        ("", False),
        ("x", False),
    ],
)
def test_versions(version: str, ok: bool) -> None:
    assert version_compatible(version) is ok
    result = negotiate_server(
        hello(["none"], version=version),
        algorithms=(A.NONE,),
        encodings=(E.CL100K,),
        max_payload=0,
        identity=None,
    )
    if ok:
        assert isinstance(result, Negotiated)
    else:
        assert isinstance(result, Refusal) and result.code == "VERSION_MISMATCH"
        assert version in result.message


@pytest.mark.parametrize(
    ("ours", "theirs", "expected"), [(0, 0, 0), (0, 5, 5), (5, 0, 5), (10, 5, 5), (5, 10, 5)]
)
def test_max_payload_is_the_minimum(ours: int, theirs: int, expected: int) -> None:
    result = server(hello(["none"], max_payload=theirs), (A.NONE,), (E.CL100K,), max_payload=ours)
    assert result.max_payload == expected


def test_latent_mode_needs_compatible_identities() -> None:
    ident = ModelIdentity(
        model_family="llama", model_id="m", model_hash="ab" * 32, hidden_dim=8, num_layers=2
    )
    other = ModelIdentity(
        model_family="qwen", model_id="q", model_hash="cd" * 32, hidden_dim=16, num_layers=4
    )
    same = server(hello(["none"], identity=ident), (A.NONE,), (E.CL100K,), identity=ident)
    assert (same.mode, same.mode_reason) == ("LATENT", "hash_match")
    diff = server(hello(["none"], identity=other), (A.NONE,), (E.CL100K,), identity=ident)
    assert diff.mode == "JSON"
    none = server(hello(["none"]), (A.NONE,), (E.CL100K,), identity=ident)
    assert none.mode == "JSON"


def test_accept_carries_negotiated_result_and_client_reads_it() -> None:
    ident = ModelIdentity(
        model_family="llama", model_id="m", model_hash="ab" * 32, hidden_dim=8, num_layers=2
    )
    own = hello(["tokennative", "brotli", "none"], ["Cl100kBase", "O200kBase"], identity=ident)
    result = server(
        hello(["brotli", "tokennative"], ["O200kBase"], "O200kBase", max_payload=1000, identity=ident),
        (A.TOKENNATIVE, A.BROTLI, A.NONE),
        (E.CL100K, E.O200K),
        identity=ident,
        max_payload=5000,
    )
    accept = accept_capabilities(own, result)
    assert accept.compression.algorithms == ["brotli", "tokennative"]
    assert accept.compression.encodings == ["O200kBase"]
    assert accept.compression.max_payload == 1000
    assert isinstance(accept.avp, LatentCaps) and accept.avp.mode == "LATENT"
    client = negotiate_client(
        accept,
        algorithms=(A.BROTLI, A.TOKENNATIVE),
        encodings=(E.O200K,),
        preferred_encoding=E.O200K,
        max_payload=1000,
    )
    assert isinstance(client, Negotiated)
    assert (client.algorithms, client.encoding, client.max_payload, client.mode) == (
        (A.BROTLI, A.TOKENNATIVE),
        E.O200K,
        1000,
        "LATENT",
    )


def test_client_intersects_again_when_server_sends_full_caps() -> None:
    # The reference answers with its own full capabilities; the client must still agree on a subset.
    accept = hello(["m2m", "tokennative", "brotli", "none"], ["Cl100kBase", "O200kBase"])
    client = negotiate_client(
        accept,
        algorithms=(A.BROTLI, A.TOKEN),
        encodings=(E.O200K, E.CL100K),
        preferred_encoding=E.O200K,
        max_payload=0,
    )
    assert isinstance(client, Negotiated)
    assert client.algorithms == (A.BROTLI,)
    assert client.encoding is E.O200K
    assert client.mode == "JSON"


def test_client_refuses_accept_without_common_algorithm() -> None:
    client = negotiate_client(
        hello(["m2m"]), algorithms=(A.BROTLI,), encodings=(E.CL100K,), preferred_encoding=None, max_payload=0
    )
    assert isinstance(client, Refusal) and client.code == "NO_COMMON_ALGORITHM"


def test_absent_preferred_encoding_means_no_preference() -> None:
    # A client offering only O200k and naming no preference must get O200k, not the cl100k fallback.
    from m2mwire.schemas.messages import decode_message

    raw = (
        '{"type":"HELLO","payload":{"version":"3.0","agent_id":"a","agent_type":"t","compression":'
        '{"algorithms":["tokennative"],"max_payload":0,"streaming":false,"ml_routing":false,'
        '"encodings":["O200kBase"]},"security":{"threat_detection":false,"blocking_mode":false,'
        '"block_threshold":0.8}},"timestamp":1}'
    )
    caps = decode_message(raw).payload
    assert isinstance(caps, Capabilities)
    result = server(caps, (A.TOKENNATIVE,), (E.CL100K, E.O200K))
    assert result.encoding is E.O200K


@pytest.mark.parametrize(
    ("accept_encs", "accept_pref", "client_encs", "client_pref", "expected"),
    [
        # Issue 12.3: the documented fallback, announced as the single negotiated encoding, is used
        # although the client offered only Llama 3 (it used to keep llama3 and send #TK|L|).
        (["Cl100kBase"], "Cl100kBase", (E.LLAMA3,), E.LLAMA3, E.CL100K),
        (["O200kBase"], "O200kBase", (E.LLAMA3, E.CL100K), E.LLAMA3, E.O200K),
        # Full capabilities (the reference's ACCEPT): the reference's rule, from the client's side.
        (["Cl100kBase", "O200kBase"], "Cl100kBase", (E.LLAMA3,), E.LLAMA3, E.CL100K),
        (["Cl100kBase", "O200kBase"], "Cl100kBase", (E.LLAMA3, E.O200K), E.LLAMA3, E.O200K),
        (["Cl100kBase", "O200kBase"], "Cl100kBase", (E.O200K, E.CL100K), E.CL100K, E.CL100K),
        ([], "Cl100kBase", (E.O200K,), E.O200K, E.CL100K),
    ],
)
def test_client_uses_the_encoding_accept_names(
    accept_encs: list[str],
    accept_pref: str,
    client_encs: tuple[Encoding, ...],
    client_pref: Encoding,
    expected: Encoding,
) -> None:
    client = negotiate_client(
        hello(["tokennative"], accept_encs, accept_pref),
        algorithms=(A.TOKENNATIVE,),
        encodings=client_encs,
        preferred_encoding=client_pref,
        max_payload=0,
    )
    assert isinstance(client, Negotiated)
    assert client.encoding is expected
