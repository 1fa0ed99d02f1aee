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
from procstore.store.wrapping import CRASH_POINT, WRITE_KINDS, WrappingStore
from procstore.testing.naming import ProcedureNames
from procstore.testing.plan import ATTEMPT, ATTEMPT_MARK, Fault, FaultPlan, SimulatedCrash, StoreOp, torn

T = TypeVar("T")

__all__ = ["FaultyStore", "SimulatedCrash", "StoreOp"]


class FaultyStore(WrappingStore):
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
        super().__init__(inner)
        self.plan = plan or FaultPlan(list(faults))
        self.plan.crash_before_new = crash_before_new if crash_before_new is not None else self.plan.crash_before_new
        self.crash_at = crash_at
        self.crash_when = crash_when
        if crash_at is not None:
            self.plan.faults.append(Fault("crash", nth=crash_at, when=crash_when))
        self.names: ProcedureNames | None = None
        """If set, learns the type and parent of each procedure whose step is written."""

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

    async def around(self, kind: str, key: str, call: Callable[[], Awaitable[T]], value: bytes | None = None) -> T:
        if kind == CRASH_POINT and key.endswith(ATTEMPT_MARK):
            kind = ATTEMPT  # the runner's mark before an attempt: numbered apart, not a crash point
        if self.names is not None and value is not None:
            self.names.learn(key, value)
        op, later = self.plan.begin(kind, key)
        for fault in later:
            if fault.action == "delay":
                await asyncio.sleep(fault.seconds)
            elif fault.action == "tear" and kind in WRITE_KINDS and value is not None:
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
