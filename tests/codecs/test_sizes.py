"""compress() then decompress() gives the content back at every size up to the limit, for every codec.

Issue 11.1: Brotli content of 2 MiB and more ("a" * 2 MiB, the corpus repeated to 2, 3, 4 or 12 MiB)
failed with "truncated Brotli stream" because the decoder took "all input consumed" for "truncated"
while output was still pending inside it. The explicit examples are those sizes; the property test
draws sizes up to a limit for every emittable codec.
"""

from __future__ import annotations

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from m2mwire.codecs import EMITTABLE_ALGORITHMS, Algorithm, compress, decompress
from m2mwire.codecs.jsonutil import dumps_compact
from m2mwire.codecs.limits import Limits
from m2mwire.samples import sample_payloads

MiB = 1 << 20
# Every emittable codec; TokenNative costs ~1 s per MiB, so the drawn sizes stay under this limit.
SMALL = Limits(max_message_bytes=512 * 1024, max_output_bytes=256 * 1024)
CORPUS = "".join(content for _, content in sample_payloads())


def _text_of(size: int) -> str:
    """The corpus repeated and cut to exactly ``size`` UTF-8 bytes (cut on a character boundary)."""
    text = (CORPUS * (size // len(CORPUS.encode()) + 1)).encode()[:size].decode("utf-8", "ignore")
    return text + "x" * (size - len(text.encode()))


def _json_of(size: int) -> str:
    """A JSON array of corpus strings, about ``size`` bytes of compact text (for the JSON-only codecs)."""
    text = _text_of(max(size - 2, 0) // 2)
    return dumps_compact([text[i : i + 4096] for i in range(0, len(text), 4096)])


def _round_trip(content: str, algorithm: Algorithm, limits: Limits) -> None:
    wire = compress(content, algorithm, limits=limits)
    assert decompress(wire, limits=limits) == content


@pytest.mark.parametrize(
    "content",
    [
        pytest.param("a" * (2 * MiB), id="a*2MiB"),
        *(pytest.param(_text_of(n * MiB), id=f"corpus*{n}MiB") for n in (2, 3, 4, 12)),
        pytest.param(_text_of(16 * MiB), id="corpus*16MiB(the limit)"),
    ],
)
def test_brotli_round_trips_large_content(content: str) -> None:
    _round_trip(content, Algorithm.BROTLI, Limits())


@pytest.mark.parametrize("algorithm", EMITTABLE_ALGORITHMS)
@settings(max_examples=12, deadline=None)
@given(size=st.integers(0, SMALL.max_output_bytes // 2))
@example(size=0)
@example(size=SMALL.max_output_bytes // 2)
def test_every_codec_round_trips_at_every_size(algorithm: Algorithm, size: int) -> None:
    json_only = algorithm in (Algorithm.TOKEN, Algorithm.M2M)  # these two carry JSON only
    content = _json_of(size) if json_only else _text_of(size)
    if algorithm is Algorithm.NONE:
        content = "x" + content[1:]  # never prefix-like
    _round_trip(content, algorithm, SMALL)


@settings(max_examples=6, deadline=None)
@given(size=st.integers(MiB, 16 * MiB))
def test_brotli_round_trips_at_any_size_up_to_the_default_limit(size: int) -> None:
    _round_trip("a" * size, Algorithm.BROTLI, Limits())
