"""The nats-py internals the NATS transport relies on, in one place, checked at import.

nats-py's ``publish()`` is a coroutine, although for a connected client with room in its pending
buffer it never waits: it appends the PUB command to the buffer and wakes the flusher task. The
channel's ``send_now`` (the transport contract's synchronous write, see ``transport.base``) needs
exactly that step without the coroutine, and :func:`publish_now` does it with the same private
fields ``publish()`` uses, read against nats-py :data:`VERIFIED_MINOR`. Importing this module with
another version, or with one of those fields missing, raises
:class:`m2mwire.errors.UnsupportedDependency` naming the supported versions.
"""

from __future__ import annotations

import asyncio

from nats.aio.client import Client
from nats.protocol.command import pub_cmd

from m2mwire.transport.pinned import Pinned

__all__ = ["VERIFIED_MINOR", "check_attributes", "check_version", "publish_now", "required_attributes"]

VERIFIED_MINOR = (2, 16)
PIN = Pinned("nats-py", VERIFIED_MINOR, "NATS")
check_version = PIN.check_version


def required_attributes() -> list[tuple[str, object, tuple[str, ...]]]:
    """(what, object, names it must have); a fresh Client (no connection) has the instance fields."""
    return [
        (
            "a nats.aio.client.Client",
            Client(),
            ("_pending", "_pending_data_size", "_max_pending_size", "_flush_queue", "_flusher_task", "stats"),
        ),
        ("nats.aio.client.Client", Client, ("is_connected", "is_draining_pubs", "max_payload")),
    ]


check_attributes = PIN.check_attributes


check_version()
check_attributes(required_attributes())


def publish_now(nc: Client, subject: str, payload: bytes) -> bool:
    """Queue ``payload`` on ``subject`` as ``nc.publish()`` would, or return False and queue nothing.

    False where ``publish()`` could wait or fail: not connected (reconnecting), draining, the
    flusher gone, or the pending buffer too full to take the command without a forced flush.
    The subject is the caller's own (never user input), so nats-py's subject check is skipped;
    ``payload`` must be within the server's max_payload (the channel's chunk size is).
    """
    if not nc.is_connected or nc.is_draining_pubs:
        return False
    flusher, queue = nc._flusher_task, nc._flush_queue
    if flusher is None or flusher.done() or queue is None:
        return False
    command = pub_cmd(subject, "", payload)
    size = len(command)
    limit = nc._max_pending_size
    if limit > 0 and nc._pending_data_size + size > limit:
        return False  # publish() would force a flush and wait for it
    nc._pending.append(command)
    nc._pending_data_size += size
    stats = nc.stats
    stats["out_msgs"] += 1
    stats["out_bytes"] += len(payload)
    if queue.empty():  # publish() kicks the flusher the same way (its queue holds wake-ups)
        queue.put_nowait(asyncio.get_running_loop().create_future())
    return True
