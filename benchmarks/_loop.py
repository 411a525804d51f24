"""Run a benchmark (client and its spawned server processes) on uvloop when asked.

``M2M_BENCH_LOOP=uvloop python benchmarks/bench_session_ws.py ...``: the variable is inherited by
the spawned server processes, which import the benchmark module again and so call this too. uvloop
is an optional extra (``pip install m2mwire[uvloop]``), never a default.
"""

from __future__ import annotations

import asyncio
import os


def use_loop_from_env() -> str:
    """Install the event loop policy named by M2M_BENCH_LOOP; returns the loop's name."""
    if os.environ.get("M2M_BENCH_LOOP", "asyncio") != "uvloop":
        return "asyncio"
    import uvloop

    asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())
    return "uvloop"
