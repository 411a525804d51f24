"""Pin a benchmark's client and its server processes to a CPU each (Linux; elsewhere a no-op).

Unpinned on a 2-vCPU machine, the scheduler sometimes runs the client and the server on one CPU,
or moves them, and a trial's CPU time per message doubles for a while: 64 KiB text over
WebSocket costs ~16 us per message, with trials at 26-38 us in either arm of a comparison; pinned,
the trials of one arm agree within ~2 % and an A/A comparison reads 0.995-1.002 (stop 23,
benchmarks/results/stop23.txt). Both arms of a comparison run under the same placement, so what
a benchmark compares is unchanged; what pinning removes is the placement's noise.
"""

from __future__ import annotations

import os
from collections.abc import Iterable

__all__ = ["pin_client_and_servers", "unpin"]

_ORIGINAL = os.sched_getaffinity(0) if hasattr(os, "sched_getaffinity") else None


def pin_client_and_servers(server_pids: Iterable[int]) -> str:
    """This process on the first allowed CPU, the servers on the second; returns what was done."""
    if _ORIGINAL is None:
        return "not pinned (no sched_setaffinity here)"
    cpus = sorted(_ORIGINAL)
    if len(cpus) < 2:
        return "not pinned (one CPU)"
    os.sched_setaffinity(0, {cpus[0]})
    for pid in server_pids:
        os.sched_setaffinity(pid, {cpus[1]})
    return f"client pinned to CPU {cpus[0]}, server(s) to CPU {cpus[1]}"


def unpin(server_pids: Iterable[int] = ()) -> str:
    """Give this process (and ``server_pids``) the CPUs this process started with."""
    if _ORIGINAL is None:
        return "not pinned (no sched_setaffinity here)"
    for pid in (0, *server_pids):
        os.sched_setaffinity(pid, _ORIGINAL)
    return "client and servers unpinned (the scheduler places them)"
