"""Asyncio helpers of the core; `run_blocking` and `gather_settled` keep the promise
"nothing is written after stop() returns"."""

from __future__ import annotations

import asyncio
import contextlib
import functools
from collections.abc import Awaitable, Callable
from concurrent.futures import Executor
from typing import TypeVar

T = TypeVar("T")


async def run_blocking(fn: Callable[..., T], *args: object, executor: Executor | None = None) -> T:
    """Run blocking `fn(*args)` in a thread (of `executor`, else the loop's default pool); if
    cancelled, wait for the thread, then re-raise.

    A thread cannot be interrupted, so returning on cancellation would let a write land
    after the caller believed everything had stopped.
    """
    loop = asyncio.get_running_loop()
    future = loop.run_in_executor(executor, functools.partial(fn, *args))
    try:
        return await asyncio.shield(future)
    except asyncio.CancelledError:
        # However many cancels arrive (a stop, then a lease loss), the thread is waited for.
        while not future.done():
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.wait([future])
        raise


async def gather_settled(*awaitables: Awaitable[T]) -> list[T]:
    """Like `asyncio.gather`, but when one fails, wait for all the others before raising.

    Plain `gather` raises at the first failure and leaves its siblings running, so their
    writes could land after the caller has given up (or the manager has stopped). One
    awaitable alone is awaited in the caller's task, with no task and future made for it
    (a finished procedure's one history record, say).
    """
    if len(awaitables) == 1:
        return [await awaitables[0]]
    results = await asyncio.gather(*awaitables, return_exceptions=True)
    for result in results:
        if isinstance(result, BaseException):
            raise result
    return results  # type: ignore[return-value]


async def unless_set(waiting: Callable[[], Awaitable[object]], event: asyncio.Event) -> bool:
    """Await `waiting()` unless `event` is set first (then it is cancelled): True if it ended."""
    if event.is_set():
        return False
    task = asyncio.ensure_future(waiting())
    woken = asyncio.ensure_future(event.wait())
    try:
        await asyncio.wait((task, woken), return_when=asyncio.FIRST_COMPLETED)
    finally:
        for pending in (task, woken):
            pending.cancel()
        await asyncio.gather(task, woken, return_exceptions=True)
    return task.done() and not task.cancelled() and task.exception() is None


class LockPerLoop:
    """An `asyncio.Lock` of the running event loop (a lock serves one loop only): the
    objects that hold one (a manager, a retry budget) may serve two `asyncio.run`s one after
    the other."""

    def __init__(self) -> None:
        self._lock: tuple[asyncio.AbstractEventLoop, asyncio.Lock] | None = None

    def __call__(self) -> asyncio.Lock:
        loop = asyncio.get_running_loop()
        if self._lock is None or self._lock[0] is not loop:
            self._lock = (loop, asyncio.Lock())
        return self._lock[1]
