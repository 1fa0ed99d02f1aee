"""`StateStore`: the key-value interface the procedure store is written against.

Keys are `/`-separated paths relative to the store's root (`procedure/<id>/0000000001.step`).
Every method is async; a backend over a blocking filesystem runs its calls in a thread and
waits for that thread even when cancelled, so nothing is written after the awaiting task
has been cancelled (see `run_blocking`).
"""

from __future__ import annotations

import abc
import asyncio
import functools
from collections.abc import Callable, Sequence
from typing import TypeVar

T = TypeVar("T")


class StateStore(abc.ABC):
    """Async key-value access to a store's objects.

    Errors: a missing key is `None` from `get` and ignored by the deletes; anything else
    raises `procstore.errors.StoreError` (or its subclass `StoreUnavailable`) naming the key.
    """

    url: str
    """Where the store lives, for messages (`s3://bucket/prefix/`, `/var/lib/cp/`)."""

    supports_create_only: bool = True
    """Whether `put_if_absent` is atomic (one winner among concurrent writers)."""

    @abc.abstractmethod
    async def put(self, key: str, value: bytes) -> None:
        """Write `value` under `key`, replacing any old value, atomically and durably."""

    @abc.abstractmethod
    async def put_if_absent(self, key: str, value: bytes) -> bool:
        """Create `key` with `value`; `False` (and nothing written) if the key exists."""

    @abc.abstractmethod
    async def get(self, key: str) -> bytes | None:
        """The value under `key`, or `None` if there is none."""

    async def get_many(self, keys: Sequence[str]) -> list[bytes | None | Exception]:
        """The values of `keys`, in order; a failed read is returned as its exception."""
        results = await asyncio.gather(*(self.get(k) for k in keys), return_exceptions=True)
        out: list[bytes | None | Exception] = []
        for r in results:
            if isinstance(r, BaseException) and not isinstance(r, Exception):
                raise r
            out.append(r)
        return out

    @abc.abstractmethod
    async def walk(self, prefix: str) -> list[str]:
        """Every key under `prefix` (recursively), sorted; always a fresh listing."""

    @abc.abstractmethod
    async def batch_delete(self, keys: Sequence[str]) -> None:
        """Delete `keys`; the deletes are durable when this returns. Missing keys are fine."""

    @abc.abstractmethod
    async def delete(self, key: str) -> None:
        """Delete one key, or a folder (`key` ending in `/`) once it is empty."""

    async def check_access(self) -> None:
        """Raise `StoreUnavailable` if the store cannot be listed (wrong URL, no bucket...)."""
        await self.walk("")

    async def close(self) -> None:  # noqa: B027 - most backends hold nothing
        """Release connections. The store must not be used afterwards."""


async def run_blocking(fn: Callable[..., T], *args: object) -> T:
    """Run blocking `fn(*args)` in a thread; if cancelled, wait for the thread, then re-raise.

    A thread cannot be interrupted, so returning on cancellation would let a write land
    after the caller believed everything had stopped.
    """
    loop = asyncio.get_running_loop()
    future = loop.run_in_executor(None, functools.partial(fn, *args))
    try:
        return await asyncio.shield(future)
    except asyncio.CancelledError:
        await asyncio.wait([future])
        raise
