"""The precise rules docs/CODECS.md and docs/T1.md state for other implementers, checked against the code.

Each test quotes the document's example, so a change of behaviour fails here until the text is updated.
"""

from __future__ import annotations

import base64
from pathlib import Path

import pytest

from m2mwire.codecs import Algorithm, Encoding, get_tokenizer, select_algorithm
from m2mwire.codecs.dictionary import REFERENCE_PATTERNS, decode_dictionary
from m2mwire.codecs.t1 import decode_t1, encode_t1
from m2mwire.codecs.tokenizers import CL100K_PAT_STR, LLAMA3_PAT_STR, O200K_PAT_STR
from m2mwire.errors import DecodeError

DOCS = Path(__file__).resolve().parents[2] / "docs"


def test_reference_dictionary_table_has_34_codes() -> None:
    assert len(REFERENCE_PATTERNS) == 34
    text = " ".join((DOCS / "CODECS.md").read_text().split())
    assert "table has **34 codes**" in text and "45-code" not in text


def _dictionary(body: bytes) -> str:
    return decode_dictionary("#M2M|" + base64.b64encode(b"\xf9" + body).decode())


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        (b"\xc4\xf8\x80", "Ā"),  # escape: F8 80 is the byte 80, never its pattern
        (b"\x80x\x83", '{"role":"user","content":"x"}'),
        (b"\xf8\xf8\x80", None),  # the first F8 is copied: invalid UTF-8
        (b"ab\xf8", None),  # F8 at the end
        (b"a\xf8A", None),  # F8 before a byte outside 80-87
        (b"a\xf9", None),  # a second marker
        (b"\xfe", None),
    ],
)
def test_dictionary_escape_rules(body: bytes, expected: str | None) -> None:
    if expected is not None:
        assert _dictionary(body) == expected
    else:
        with pytest.raises(DecodeError, match="not valid UTF-8 at byte"):
            _dictionary(body)


def test_multibyte_share_counts_continuation_bytes() -> None:
    # CODECS.md section 5, rule 2: 100 ASCII + 20 "é" is 14 % (not Brotli); 60 ASCII + 20 "日" is 33 %.
    latin = "a" * 100 + "é" * 20
    cjk = "a" * 60 + "日" * 20
    assert select_algorithm(latin) is Algorithm.TOKENNATIVE
    assert select_algorithm(cjk) is Algorithm.BROTLI


def test_llama3_pattern_and_specials_as_documented() -> None:
    text = (DOCS / "CODECS.md").read_text()
    assert LLAMA3_PAT_STR in text
    # and OpenAI's, written out for implementers who cannot download tiktoken's (a clean-room
    # client found only their constant names here)
    assert f"```\n{CL100K_PAT_STR}\n```" in text and f"```\n{O200K_PAT_STR}\n```" in text
    tokenizer = get_tokenizer(Encoding.LLAMA3)
    specials = {
        "<|begin_of_text|>": 128000,
        "<|end_of_text|>": 128001,
        "<|reserved_special_token_1|>": 128003,
        "<|finetune_right_pad_id|>": 128004,
        "<|eot_id|>": 128009,
        "<|image|>": 128011,
        "<|reserved_special_token_2|>": 128012,
        "<|reserved_special_token_245|>": 128255,
    }
    for name, ident in specials.items():
        assert tokenizer.encode(name, allowed_special="all") == [ident]
    assert tokenizer.n_vocab == 128256
    assert tokenizer.encode("hi") == tokenizer.encode("hi", allowed_special="all")  # no BOS added


@pytest.mark.parametrize("dialect", ["seed", "reference"])
def test_t1_number_spelling(dialect: str) -> None:
    # T1.md section 1.5, "How numbers are written".
    source = (
        '{"v":[1E2,1e+2,100.0,-0,1.50,1e-5,1e-6,1e16,9999999999999998.0,2,2e0,-0.0,'
        "12345678901234567890123,123456789012345678901.5]}"
    )
    expected = (
        "[100.0,100.0,100.0,0,1.5,0.00001,1e-6,1e16,9999999999999998.0,2,2.0,-0.0,"
        "12345678901234567890123,1.2345678901234568e20]"
    )
    wire = encode_t1(source, dialect=dialect)  # type: ignore[arg-type]
    assert wire.endswith(expected + "}")
    assert decode_t1(wire) == '{"v":' + expected + "}"
