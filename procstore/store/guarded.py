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
from procstore.store.wrapping import MUTATING_KINDS, WrappingStore

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


def guard_request(method: str, url: str) -> None:
    """For a backend's request hook: call the `SEND_GUARD` of the write in progress, if any,
    when the request about to be sent changes the store."""
    guard = SEND_GUARD.get()
    if guard is not None and method in ("PUT", "POST", "DELETE", "PATCH"):
        guard(url)


class GuardedStore(WrappingStore):
    """Delegates to `inner`, calling `guard(key)` before each write or delete."""

    def __init__(self, inner: StateStore, guard: Guard) -> None:
        super().__init__(inner)
        self.guard = guard
        self.observes_crash_points = inner.observes_crash_points  # its `around` lets them through

    def passes(self, kind: str) -> bool:
        return kind not in MUTATING_KINDS  # reads are never refused

    async def around(self, kind: str, key: str, call: Callable[[], Awaitable[T]], value: bytes | None = None) -> T:
        if kind not in MUTATING_KINDS:
            return await call()
        self.guard(key.partition(",")[0])  # a batch delete is named by its first key
        token = SEND_GUARD.set(self.guard)
        try:
            return await call()
        finally:
            SEND_GUARD.reset(token)

    async def delete_in_order(self, first: Sequence[str], then: Sequence[str], folder: str) -> None:
        # The inner store's own (a local directory skips fsyncs it does not need), guarded once.
        await self.around("delete", folder, lambda: self.inner.delete_in_order(first, then, folder))
