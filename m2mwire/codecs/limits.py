"""Size limits from the wire-format seed (section 3.5), shared by every codec and the session layer."""

from __future__ import annotations

from dataclasses import dataclass

from m2mwire.errors import LimitExceeded

__all__ = ["DEFAULT_LIMITS", "Limits", "MiB", "check_size"]

MiB = 1024 * 1024


@dataclass(frozen=True, slots=True)
class Limits:
    """Limits applied while decoding (and, where it makes sense, encoding).

    The defaults are the seed's: a 16 MiB message, JSON nested at most 32 levels, strings of at most
    10 MiB, arrays of at most 10,000 elements. ``max_output_bytes`` caps what any decompressor may
    produce, so a small compressed "bomb" cannot allocate more than this.
    """

    max_message_bytes: int = 16 * MiB
    max_json_depth: int = 32
    max_string_bytes: int = 10 * MiB
    max_array_elements: int = 10_000
    max_output_bytes: int = 16 * MiB
    # An AVP frame's metadata (ids, model fields, the ``extra`` map): a real one is a few hundred
    # bytes. Checked before it is parsed: a 16 MiB map of a million 1-byte keys took ~1 s of CPU
    # and ~200 MB to parse and hold (stop 30's attack run).
    max_metadata_bytes: int = 64 * 1024


DEFAULT_LIMITS = Limits()


def check_size(what: str, size: int, limit: int) -> None:
    """Raise :class:`LimitExceeded` when ``size`` exceeds ``limit``; ``what`` names the thing measured."""
    if size > limit:
        message = f"{what} is {size} bytes, over the limit of {limit} bytes"
        raise LimitExceeded(message, limit=limit, actual=size)
