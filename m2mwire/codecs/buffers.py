"""Buffer types and the numpy check every layer shares, without importing numpy.

``Buffer`` is what a binary message may be handed over as (codecs produce it, sessions retain it,
transports write it); it lives here, at the bottom, so that no layer imports a higher one for it.
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Any, TypeAlias, TypeGuard

if TYPE_CHECKING:
    import numpy as np

__all__ = ["Buffer", "is_ndarray"]

Buffer: TypeAlias = bytes | bytearray | memoryview


def is_ndarray(obj: object) -> TypeGuard[np.ndarray[Any, Any]]:
    """``isinstance(obj, numpy.ndarray)``, without importing numpy for text-only users.

    Correct because an array can only exist once numpy has been imported: when ``numpy`` is not in
    ``sys.modules``, nothing is an ndarray.
    """
    np_module = sys.modules.get("numpy")
    return np_module is not None and isinstance(obj, np_module.ndarray)
