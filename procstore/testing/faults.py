"""`FaultyStore`: a `StateStore` wrapper that records operations and simulates a crash.

A crash is `SimulatedCrash`, a `BaseException`: procstore's error handling does not catch
it, so the runner that hit it dies like a killed process, with no cleanup. From then on
every operation raises it too, so nothing reaches the store after the crash point.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Literal, TypeVar

from procstore.store.state_store import StateStore

T = TypeVar("T")

MUTATING = frozenset({"put", "put_if_absent", "put_if_version", "batch_delete", "delete"})


class SimulatedCrash(BaseException):
    """The process "died" at a store operation. Not an `Exception`, so nothing handles it."""


@dataclass(frozen=True, slots=True)
class StoreOp:
    """One operation the store saw: its position among counted operations, kind and key."""

    index: int
    kind: str
    key: str


class FaultyStore(StateStore):
    """Wraps `inner`; crashes before or after the `crash_at`-th counted operation.

    Only operations that change the store (`put`, `put_if_absent`, `batch_delete`,
    `delete`) are counted and recorded: a crash around a read is the same as a crash
    around the write next to it.
    """

    def landed(self) -> list[StoreOp]:
        """The recorded operations that completed (the one crashed "after" included)."""
        return [op for op in self.ops if op.index in self.completed]

    def maybe_landed(self) -> list[StoreOp]:
        """Operations cut off by a cancel (a stop after the crash): landed or not, unknown."""
        return [op for op in self.ops if op.index in self.interrupted]

    def __init__(
        self,
        inner: StateStore,
        *,
        crash_at: int | None = None,
        crash_when: Literal["before", "after"] = "before",
        crash_before_new: set[tuple[str, str]] | None = None,
    ) -> None:
        self.inner = inner
        self.url = inner.url
        self.supports_create_only = inner.supports_create_only
        self.supports_compare_and_swap = inner.supports_compare_and_swap
        self.crash_at = crash_at
        self.crash_when = crash_when
        self.crash_before_new = crash_before_new
        """If set: crash before any counted operation not in it (then add it), so that a
        chain of restarts is killed once before every distinct store update."""
        self.ops: list[StoreOp] = []
        self.completed: set[int] = set()
        """Indexes of the recorded operations that returned."""
        self.interrupted: set[int] = set()
        """Indexes of operations cancelled while running: they may or may not have landed."""
        self.crashed = asyncio.Event()

    async def _op(self, kind: str, key: str, call: Callable[[], Awaitable[T]]) -> T:
        if self.crashed.is_set():
            raise SimulatedCrash(f"the store is gone: crashed earlier ({kind} {key})")
        if kind not in MUTATING:
            return await call()
        op = StoreOp(len(self.ops), kind, key)
        self.ops.append(op)
        hit = op.index == self.crash_at
        if self.crash_before_new is not None and (kind, key) not in self.crash_before_new:
            self.crash_before_new.add((kind, key))
            self.crash_when = "before"
            self._crash(op)
        if hit and self.crash_when == "before":
            self._crash(op)
        try:
            result = await call()
        except asyncio.CancelledError:
            self.interrupted.add(op.index)
            raise
        self.completed.add(op.index)
        if hit and self.crash_when == "after":
            self._crash(op)
        return result

    def _crash(self, op: StoreOp) -> None:
        self.crashed.set()
        raise SimulatedCrash(f"crash {self.crash_when} operation {op.index}: {op.kind} {op.key}")

    async def put(self, key: str, value: bytes) -> None:
        await self._op("put", key, lambda: self.inner.put(key, value))

    async def put_if_absent(self, key: str, value: bytes) -> bool:
        return await self._op("put_if_absent", key, lambda: self.inner.put_if_absent(key, value))

    async def get_versioned(self, key: str) -> tuple[bytes, str] | None:
        return await self._op("get_versioned", key, lambda: self.inner.get_versioned(key))

    async def put_if_version(self, key: str, value: bytes, version: str | None) -> bool:
        return await self._op("put_if_version", key, lambda: self.inner.put_if_version(key, value, version))

    async def get(self, key: str) -> bytes | None:
        return await self._op("get", key, lambda: self.inner.get(key))

    async def get_many(self, keys: Sequence[str]) -> list[bytes | Exception | None]:
        return await self._op("get_many", ",".join(keys[:1]), lambda: self.inner.get_many(keys))

    async def walk(self, prefix: str) -> list[str]:
        return await self._op("walk", prefix, lambda: self.inner.walk(prefix))

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
