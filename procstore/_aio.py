"""Asyncio helpers that keep the promise "nothing is written after stop() returns"."""

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
