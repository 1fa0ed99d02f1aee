"""`FaultyStore`: a `StateStore` wrapper that records operations and injects faults.

Faults come from a `FaultPlan` (see `procstore.testing.plan`). The common case, a crash
before or after the n-th operation that changes the store, is `crash_at=n`. A crash is
`SimulatedCrash`, a `BaseException`: procstore's error handling does not catch it, so the
runner that hit it dies like a killed process, with no cleanup; from then on every
operation raises it too, so nothing reaches the store after the crash point.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from typing import Literal, TypeVar

from procstore.store.state_store import StateStore
from procstore.testing.plan import WRITES, Fault, FaultPlan, SimulatedCrash, StoreOp, torn

T = TypeVar("T")

__all__ = ["FaultyStore", "SimulatedCrash", "StoreOp"]


class FaultyStore(StateStore):
    """Wraps `inner`; records every operation that changes the store, and injects faults.

    Only `put`, `put_if_absent`, `put_if_version`, `batch_delete` and `delete` are counted
    (a crash around a read is the same as a crash around the write next to it); faults can
    match reads too, by kind.
    """

    def __init__(
        self,
        inner: StateStore,
        *,
        crash_at: int | None = None,
        crash_when: Literal["before", "after"] = "before",
        crash_before_new: set[tuple[str, str]] | None = None,
        faults: Sequence[Fault] = (),
        plan: FaultPlan | None = None,
    ) -> None:
        self.inner = inner
        self.url = inner.url
        self.supports_create_only = inner.supports_create_only
        self.supports_compare_and_swap = inner.supports_compare_and_swap
        self.plan = plan or FaultPlan(list(faults))
        self.plan.crash_before_new = crash_before_new if crash_before_new is not None else self.plan.crash_before_new
        self.crash_at = crash_at
        self.crash_when = crash_when
        if crash_at is not None:
            self.plan.faults.append(Fault("crash", nth=crash_at, when=crash_when))

    @property
    def ops(self) -> list[StoreOp]:
        return self.plan.ops

    @property
    def crashed(self) -> asyncio.Event:
        return self.plan.crashed

    def landed(self) -> list[StoreOp]:
        """The recorded operations that completed (one crashed "after" included)."""
        return self.plan.landed()

    def maybe_landed(self) -> list[StoreOp]:
        """Operations cut off by a cancel (a stop after the crash): landed or not, unknown."""
        return self.plan.maybe_landed()

    async def _op(self, kind: str, key: str, call: Callable[[], Awaitable[T]], value: bytes | None = None) -> T:
        op, later = self.plan.begin(kind, key)
        for fault in later:
            if fault.action == "delay":
                await asyncio.sleep(fault.seconds)
            elif fault.action == "tear" and kind in WRITES and value is not None:
                await self.inner.put(key, torn(value))
                raise self.plan.crash(f"torn write of {key}")
        try:
            result = await call()
        except asyncio.CancelledError:
            if op is not None:
                self.plan.interrupted.add(op.index)
            raise
        self.plan.end(op, later, kind, key)
        return result

    async def put(self, key: str, value: bytes) -> None:
        await self._op("put", key, lambda: self.inner.put(key, value), value)

    async def put_if_absent(self, key: str, value: bytes) -> bool:
        return await self._op("put_if_absent", key, lambda: self.inner.put_if_absent(key, value), value)

    async def put_if_version(self, key: str, value: bytes, version: str | None) -> bool:
        return await self._op("put_if_version", key, lambda: self.inner.put_if_version(key, value, version), value)

    async def get_versioned(self, key: str) -> tuple[bytes, str] | None:
        return await self._op("get_versioned", key, lambda: self.inner.get_versioned(key))

    async def get(self, key: str) -> bytes | None:
        return await self._op("get", key, lambda: self.inner.get(key))

    async def get_many(self, keys: Sequence[str]) -> list[bytes | Exception | None]:
        return await self._op("get_many", ",".join(keys[:1]), lambda: self.inner.get_many(keys))

    async def walk(self, prefix: str) -> list[str]:
        return await self._op("walk", prefix, lambda: self.inner.walk(prefix))

    async def walk_modified(self, prefix: str) -> dict[str, float | None]:
        return await self._op("walk", prefix, lambda: self.inner.walk_modified(prefix))

    async def batch_delete(self, keys: Sequence[str]) -> None:
        if not keys:
            return
        await self._op("batch_delete", ",".join(keys), lambda: self.inner.batch_delete(keys))

    async def delete(self, key: str) -> None:
        await self._op("delete", key, lambda: self.inner.delete(key))

    async def check_access(self) -> None:
        await self._op("check_access", "", self.inner.check_access)

    async def close(self) -> None:
        await self.inner.close()
