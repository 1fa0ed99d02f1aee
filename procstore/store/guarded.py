"""`GuardedStore`: a `StateStore` that asks permission before every write.

A manager that leads by lease wraps its store in one, with the lease's `check_writable` as
the guard, so that no runner writes or deletes anything once the lease may have passed to
another manager, even if the task that renews the lease has not run yet (the event loop
was blocked, or the process was paused). Reads are never refused.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from contextvars import ContextVar
from typing import TypeVar

from procstore.store.state_store import StateStore

T = TypeVar("T")

Guard = Callable[[str], None]
"""Called with the key about to be written; raises to refuse the write."""

SEND_GUARD: ContextVar[Guard | None] = ContextVar("procstore_send_guard", default=None)
"""The guard of the write in progress, for a backend to call again at the last moment.

Between the check in `GuardedStore` and the request leaving the process, a backend may
spend milliseconds (signing, connecting); a process paused there sends its write late. A
backend that can run code right before a request is sent (S3: botocore's `before-send`
event) calls this guard there too, which shrinks that window to microseconds.
"""


class GuardedStore(StateStore):
    """Delegates to `inner`, calling `guard(key)` before each write or delete."""

    def __init__(self, inner: StateStore, guard: Guard) -> None:
        self.inner = inner
        self.guard = guard
        self.url = inner.url
        self.supports_create_only = inner.supports_create_only
        self.supports_compare_and_swap = inner.supports_compare_and_swap

    async def _guarded(self, key: str, write: Callable[[], Awaitable[T]]) -> T:
        self.guard(key)
        token = SEND_GUARD.set(self.guard)
        try:
            return await write()
        finally:
            SEND_GUARD.reset(token)

    async def put(self, key: str, value: bytes) -> None:
        await self._guarded(key, lambda: self.inner.put(key, value))

    async def put_if_absent(self, key: str, value: bytes) -> bool:
        return await self._guarded(key, lambda: self.inner.put_if_absent(key, value))

    async def put_if_version(self, key: str, value: bytes, version: str | None) -> bool:
        return await self._guarded(key, lambda: self.inner.put_if_version(key, value, version))

    async def batch_delete(self, keys: Sequence[str]) -> None:
        if keys:
            await self._guarded(keys[0], lambda: self.inner.batch_delete(keys))

    async def delete(self, key: str) -> None:
        await self._guarded(key, lambda: self.inner.delete(key))

    async def delete_in_order(self, first: Sequence[str], then: Sequence[str], folder: str) -> None:
        await self._guarded(folder, lambda: self.inner.delete_in_order(first, then, folder))

    async def get(self, key: str) -> bytes | None:
        return await self.inner.get(key)

    async def get_versioned(self, key: str) -> tuple[bytes, str] | None:
        return await self.inner.get_versioned(key)

    async def get_many(self, keys: Sequence[str]) -> list[bytes | Exception | None]:
        return await self.inner.get_many(keys)

    async def walk(self, prefix: str) -> list[str]:
        return await self.inner.walk(prefix)

    async def walk_modified(self, prefix: str) -> dict[str, float | None]:
        return await self.inner.walk_modified(prefix)

    async def check_access(self) -> None:
        await self.inner.check_access()

    async def close(self) -> None:
        await self.inner.close()
