import pytest
from hypothesis import given
from hypothesis import strategies as st

from m2mwire.codecs.utf8 import check_utf8, cut_utf8, utf8_len
from m2mwire.errors import DecodeError


@given(st.text())
def test_utf8_len_is_the_encoded_size(text: str) -> None:
    assert utf8_len(text) == len(text.encode("utf-8", "surrogatepass"))


def test_utf8_len_counts_multibyte_and_lone_surrogates() -> None:
    assert utf8_len("aé€😀") == 1 + 2 + 3 + 4
    assert utf8_len("\ud800") == 3


_BAD = [
    b"\xff",
    b"\xc3",
    b"\xc3(",
    b"\xc0\x80",
    b"\xed\xa0\x80",
    b"\xf4\x90\x80\x80",
    b"\xf8\x88\x80\x80\x80",
]


@given(st.binary() | st.text().map(lambda t: t.encode("utf-8", "surrogatepass")))
def test_check_utf8_refuses_exactly_what_a_strict_decode_refuses(data: bytes) -> None:
    try:
        data.decode("utf-8")
    except UnicodeDecodeError:
        with pytest.raises(DecodeError, match="not valid UTF-8"):
            check_utf8(data)
    else:
        check_utf8(data)
        check_utf8(memoryview(data))


@pytest.mark.parametrize("bad", _BAD)
def test_check_utf8_names_the_bad_byte(bad: bytes) -> None:
    with pytest.raises(DecodeError, match="at byte 3"):
        check_utf8(b"abc" + bad)


@given(st.text(), st.integers(min_value=0, max_value=40))
def test_cut_utf8_keeps_the_longest_prefix_of_whole_characters(text: str, limit: int) -> None:
    data = text.encode("utf-8", "replace")
    cut = cut_utf8(data, limit)
    assert len(cut) <= limit and data.startswith(cut)
    kept = cut.decode("utf-8")  # whole characters only: a strict decode accepts it
    rest = data[len(cut) :].decode("utf-8")
    assert not rest or len(cut) + len(rest[0].encode()) > limit  # the next character did not fit
    assert kept + rest == data.decode("utf-8")
