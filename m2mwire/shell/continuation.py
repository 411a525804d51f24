"""Carrying on a coroutine in a task of its own after it first suspended in its caller's task.

``Session`` starts each channel write in the caller's task, so a write that need not wait costs
no task and no loop turn; one that must wait is moved into a task (see ``Session._start_write``).
"""

from __future__ import annotations

from collections.abc import Coroutine, Generator
from typing import Any

__all__ = ["continue_in_task"]


class _Resume:
    """Awaitable that drives a coroutine which already suspended once, on ``waiting_on``.

    What a Task does for a coroutine, from its second step on: it lets _start_write run a send
    in the caller's task until it must wait, and only then move it into a task of its own.
    """

    def __init__(self, coro: Coroutine[Any, Any, None], waiting_on: Any) -> None:
        self._coro = coro
        self._waiting_on = waiting_on

    def __await__(self) -> Generator[Any, Any, None]:
        coro, pending = self._coro, self._waiting_on
        while True:
            try:
                try:
                    yield pending  # the future the coroutine waits on (or None: one loop turn)
                except BaseException as exc:  # e.g. the task was cancelled at shutdown
                    pending = coro.throw(exc)
                else:
                    pending = coro.send(None)
            except StopIteration:
                return


async def continue_in_task(coro: Coroutine[Any, Any, None], waiting_on: Any) -> None:
    await _Resume(coro, waiting_on)
