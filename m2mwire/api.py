"""The public entry points, re-exported from the shell modules that hold them.

``connect()`` lives in :mod:`m2mwire.shell.client`, ``serve()`` and ``Server`` in
:mod:`m2mwire.shell.server`, ``Session`` in :mod:`m2mwire.shell.session`. This module stays so
that ``from m2mwire.api import ...`` keeps working.
"""

from __future__ import annotations

from m2mwire.session.states import State
from m2mwire.shell.client import connect, open_quic_connection
from m2mwire.shell.server import Handler, Server, serve
from m2mwire.shell.serverstats import ServerStats
from m2mwire.shell.session import Session

__all__ = ["Handler", "Server", "ServerStats", "Session", "State", "connect", "open_quic_connection", "serve"]
