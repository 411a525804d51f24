"""WebSocket data frames (RFC 6455 section 5.2) read and written without websockets' frame objects.

websockets parses every frame through a generator chain (``Protocol.parse`` -> ``Frame.parse`` ->
one ``read_exact`` per header field and the payload) and serializes each through ``Frame``,
``check()`` and a ``BytesIO``: about 550 Python bytecodes to receive a 100-byte message and 200 to
send one, as much as the whole session core spends on it. The common case, one whole text or
binary message in one final frame, needs far less. These two functions do only that case; the
transport (``websockets_compat``) uses them where websockets' protocol is in a state where they
are exact (open, between frames, no fragmented message in progress, no extension, no debug
logging) and hands everything else to websockets unchanged. ``tests/transport/test_wsframes.py``
holds them equal to websockets' own parser and serializer.
"""

from __future__ import annotations

import os
import struct
from collections.abc import Callable

try:  # websockets' masking, in C where built (as websockets.frames takes it); the names are
    # checked with websockets' other internals in websockets_compat.required_attributes()
    from websockets.speedups import apply_mask
except ImportError:  # pragma: no cover - a build without the C extension
    from websockets.utils import apply_mask

__all__ = ["data_frame", "parse_data_frames"]

# The first byte of a final, unextended text or binary frame: FIN, RSV1-3 clear, the opcode.
_FIN_TEXT = 0x81
_FIN_BINARY = 0x82
_MASK_BIT = 0x80
_PACK16 = struct.Struct("!BBH").pack
_PACK64 = struct.Struct("!BBQ").pack
# Payloads this large are masked from a view of the received bytes instead of a slice of them (the
# slice would be one more copy; below this size, making the view costs more than the copy).
_VIEW_FROM = 4096


def parse_data_frames(
    data: bytes, masked: bool, limit: int | None, deliver: Callable[[bytes, bool], None]
) -> int:
    """Hand ``deliver(payload, is_text)`` each whole final text or binary frame at the start of
    ``data`` (unmasked first when ``masked``, as a server receives them); returns how many bytes
    those frames took. Stops, without looking further, at the first thing that is anything else:
    a frame cut off by the end of ``data``, a control or continuation frame, a first fragment,
    RSV bits set, the wrong masking, a 64-bit length, or a payload over ``limit``. What follows is
    websockets' to parse (and to refuse, when it breaks a rule)."""
    pos = 0
    end = len(data)
    while end - pos >= 2:
        head1 = data[pos]
        if head1 != _FIN_TEXT and head1 != _FIN_BINARY:
            break
        head2 = data[pos + 1]
        if (head2 >= _MASK_BIT) is not masked:
            break
        length = head2 & 0x7F
        start = pos + 2
        if length == 126:
            if end - start < 2:
                break
            length = (data[start] << 8) | data[start + 1]
            start += 2
        elif length == 127:
            break  # 64 KiB or more: websockets' reader keeps such payloads as views, copying less
        if limit is not None and length > limit:
            break
        if masked:
            key = data[start : start + 4]
            start += 4
            stop = start + length
            if stop > end:
                break
            payload = apply_mask(
                data[start:stop] if length < _VIEW_FROM else memoryview(data)[start:stop], key
            )
        else:
            stop = start + length
            if stop > end:
                break
            payload = data[start:stop]
        deliver(payload, head1 == _FIN_TEXT)
        pos = stop
    return pos


def data_frame(payload: bytes | bytearray | memoryview, text: bool, mask: bool) -> bytes:
    """One final text or binary frame carrying ``payload``, masked with a fresh random key when
    ``mask`` (a client's frames), as websockets' ``Frame.serialize`` writes it."""
    length = len(payload) if type(payload) is bytes else memoryview(payload).nbytes
    head1 = _FIN_TEXT if text else _FIN_BINARY
    head2 = _MASK_BIT if mask else 0
    if length < 126:
        header = bytes((head1, head2 | length))
    elif length < 65536:
        header = _PACK16(head1, head2 | 126, length)
    else:
        header = _PACK64(head1, head2 | 127, length)
    if mask:
        key = os.urandom(4)  # what websockets uses (secrets.token_bytes)
        return header + key + apply_mask(payload, key)
    return header + payload
