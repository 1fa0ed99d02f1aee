"""`WrappingStore`: a `StateStore` that delegates to another, passing each operation through
one hook. `GuardedStore` (lease checks) and `procstore.testing.FaultyStore` (fault
injection) are both this, with a different `around`.
"""

from __future__ import annotations

from collections.abc import Callable, Coroutine, Sequence
from typing import Any, TypeVar

from procstore.store.state_store import StateStore

T = TypeVar("T")

WRITE_KINDS = frozenset({"put", "put_if_absent", "put_if_version"})
"""The operations that write a value."""
MUTATING_KINDS = WRITE_KINDS | {"batch_delete", "delete"}
"""The operations that change the store."""
CRASH_POINT = "crash_point"
"""Not a store operation: a place in a step where a test may kill the process."""


class WrappingStore(StateStore):
    """Delegates every operation to `inner` through `around(kind, key, call, value)`.

    `kind` is the method's name (`walk_modified` counts as `walk`), `key` the key it acts
    on (a batch delete's keys joined by commas, `""` for `check_access`), `call` does the
    operation on `inner`, and `value` is the bytes a write would store. `delete_in_order`
    is the base class's, made of this store's own deletes; `close` closes `inner`.
    """

    def __init__(self, inner: StateStore) -> None:
        self.inner = inner
        self.url = inner.url
        self.supports_create_only = inner.supports_create_only
        self.supports_compare_and_swap = inner.supports_compare_and_swap
        self.round_trips = inner.round_trips
        # A wrapper with its own `around` or `crash_point` sees every crash point unless it
        # says otherwise (this attribute hides the class's, so both are asked here).
        kind = type(self)
        self.observes_crash_points = (
            inner.observes_crash_points
            or kind.around is not WrappingStore.around
            or kind.crash_point is not WrappingStore.crash_point
        )

    def around(
        self, kind: str, key: str, call: Callable[[], Coroutine[Any, Any, T]], value: bytes | None = None
    ) -> Coroutine[Any, Any, T]:
        """Run `call`; override (an `async def` will do) to act before or after it.

        Neither this nor the operations below are coroutines themselves: each hands back the
        coroutine that does the work, so a wrapper adds no coroutine of its own to every
        procedure's chain of awaits (each one a frame to make, resume and trace for the
        garbage collector, per request), and one with nothing to do this time adds nothing."""
        return call()

    def passes(self, kind: str) -> bool:
        """Whether an operation of `kind` goes to `inner` untouched now (`around` would only
        call it): then it is handed the inner store's coroutine without a call of `around`
        nor a closure made for it. False here; a wrapper that acts on some operations only
        says so (the lease's guard passes reads, telemetry everything while nothing records)."""
        return False

    def put(self, key: str, value: bytes) -> Coroutine[Any, Any, None]:
        if self.passes("put"):
            return self.inner.put(key, value)
        return self.around("put", key, lambda: self.inner.put(key, value), value)

    def put_if_absent(self, key: str, value: bytes) -> Coroutine[Any, Any, bool]:
        if self.passes("put_if_absent"):
            return self.inner.put_if_absent(key, value)
        return self.around("put_if_absent", key, lambda: self.inner.put_if_absent(key, value), value)

    def put_if_version(self, key: str, value: bytes, version: str | None) -> Coroutine[Any, Any, bool]:
        return self.around("put_if_version", key, lambda: self.inner.put_if_version(key, value, version), value)

    def get(self, key: str) -> Coroutine[Any, Any, bytes | None]:
        if self.passes("get"):
            return self.inner.get(key)
        return self.around("get", key, lambda: self.inner.get(key))

    def get_versioned(self, key: str) -> Coroutine[Any, Any, tuple[bytes, str] | None]:
        return self.around("get_versioned", key, lambda: self.inner.get_versioned(key))

    def get_many(self, keys: Sequence[str]) -> Coroutine[Any, Any, list[bytes | Exception | None]]:
        return self.around("get_many", ",".join(keys[:1]), lambda: self.inner.get_many(keys))

    def walk(self, prefix: str) -> Coroutine[Any, Any, list[str]]:
        return self.around("walk", prefix, lambda: self.inner.walk(prefix))

    def walk_modified(self, prefix: str) -> Coroutine[Any, Any, dict[str, float | None]]:
        return self.around("walk", prefix, lambda: self.inner.walk_modified(prefix))

    async def batch_delete(self, keys: Sequence[str]) -> None:
        if keys:
            await self.around("batch_delete", ",".join(keys), lambda: self.inner.batch_delete(keys))

    def delete(self, key: str) -> Coroutine[Any, Any, None]:
        return self.around("delete", key, lambda: self.inner.delete(key))

    def crash_point(self, key: str) -> Coroutine[Any, Any, None]:
        return self.around("crash_point", key, lambda: self.inner.crash_point(key))

    def check_access(self) -> Coroutine[Any, Any, None]:
        return self.around("check_access", "", self.inner.check_access)

    async def close(self) -> None:
        await self.inner.close()
