from hypothesis import given
from hypothesis import strategies as st

from m2mwire.codecs.utf8 import utf8_len


@given(st.text())
def test_utf8_len_is_the_encoded_size(text: str) -> None:
    assert utf8_len(text) == len(text.encode("utf-8", "surrogatepass"))


def test_utf8_len_counts_multibyte_and_lone_surrogates() -> None:
    assert utf8_len("aé€😀") == 1 + 2 + 3 + 4
    assert utf8_len("\ud800") == 3
