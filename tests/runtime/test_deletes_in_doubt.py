"""A deletion whose request failed may still land: the folder is not created again before
it can no longer (`late_write_grace`), so a late delete never takes a new run's keys."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Sequence
from typing import ClassVar

import pytest

from procstore import (
    Context,
    Lease,
    Procedure,
    ProcedureId,
    ProcedureManager,
    ProcedureWithId,
    Status,
)
from procstore.errors import EndNotRecorded, StoreError
from procstore.store.memory import MemoryStore
from tests.procedures import CountingProcedure

CHILD = ProcedureId.parse("0193e7a2-0000-7000-8000-0000000000c1")
LATE = 0.5
"""Seconds after its caller was told it failed that the first deletion of the child lands."""


class LateDeletes(MemoryStore):
    """The first deletion naming the child's keys fails at once and lands `LATE` later (a
    timeout whose request the store carried out anyway). `child_keys_seen` notes, each time
    the child's step 1 runs, whether its `0.step` is stored."""

    def __init__(self) -> None:
        super().__init__(f"deletes-in-doubt-{uuid.uuid4().hex}")
        self.armed = False
        self.late: set[asyncio.Task[None]] = set()
        self.refuse_ends_of: ProcedureId | None = None
        """Whose `.rollback` and `.commit` writes fail (its end is not stored: its tree stays)."""

    async def put_if_absent(self, key: str, value: bytes) -> bool:
        if self.refuse_ends_of is not None and f"/{self.refuse_ends_of}/" in f"/{key}" and not key.endswith(".step"):
            raise StoreError("injected: access denied", key=key)
        return await super().put_if_absent(key, value)

    async def batch_delete(self, keys: Sequence[str]) -> None:
        if self.armed and any(f"/{CHILD}/" in f"/{key}" for key in keys):
            self.armed = False
            task = asyncio.get_running_loop().create_task(self._land(list(keys)))
            self.late.add(task)
            raise StoreError("injected: timed out (the request goes on)", key=keys[0])
        await super().batch_delete(keys)

    async def _land(self, keys: list[str]) -> None:
        await asyncio.sleep(LATE)
        await super().batch_delete(keys)


class Child(CountingProcedure):
    """Two steps; its second waits until the late deletion has landed, then notes whether
    its `0.step` is still stored."""

    type_name = "doubt::Child"
    STORE: ClassVar[LateDeletes | None] = None
    SEEN: ClassVar[list[bool]] = []

    async def execute(self, ctx: Context) -> Status:
        self.n += 1
        if self.n == 1:
            return Status.executing(persist=True)
        store = Child.STORE
        assert store is not None
        await asyncio.sleep(LATE * 2)
        Child.SEEN.append(await store.get(f"procedure/{CHILD}/0000000000.step") is not None)
        return Status.done()


class Maker(CountingProcedure):
    """Creates `CHILD` and ends done once it has."""

    type_name = "doubt::Maker"

    async def execute(self, ctx: Context) -> Status:
        self.n += 1
        if self.n == 1:
            return Status.suspended([ProcedureWithId(CHILD, Child())])
        return Status.done()


class Parent(Maker):
    """Creates `CHILD`, then fails in its first run (whose end the store refuses: the tree
    stays stored) and ends done in the next."""

    type_name = "doubt::Parent"
    RUNS: ClassVar[int] = 0

    async def execute(self, ctx: Context) -> Status:
        status = await super().execute(ctx)
        if self.n == 1:
            return status
        Parent.RUNS += 1
        if Parent.RUNS == 1:
            raise RuntimeError("the first run fails after its child ended")
        return status


def _manager_on(store: LateDeletes, *types: type[Procedure]) -> ProcedureManager:
    """A leased manager whose retries go at once (0.05 s), well before a failed request lands."""
    lease = Lease(ttl=2.0, late_write_grace=LATE * 2)
    manager = ProcedureManager(store, lease=lease, max_retry_times=1, retry_delay=0.05, max_retry_delay=0.05)
    registered: list[type[Procedure]] = [*types, Child]
    for procedure_type in registered:
        manager.register(procedure_type)
    return manager


async def test_a_rewind_creates_a_child_again_only_once_its_failed_deletion_cannot_land() -> None:
    store = LateDeletes()
    Child.STORE, Child.SEEN, Parent.RUNS = store, [], 0
    manager = _manager_on(store, Parent)
    async with manager:
        parent = ProcedureWithId.new(Parent())
        store.refuse_ends_of = parent.id
        first = await manager.submit(parent)
        with pytest.raises(EndNotRecorded):
            await asyncio.wait_for(first.wait(), 10)
        assert Child.SEEN == [True]
        assert await store.get(f"procedure/{CHILD}/0000000000.step") is not None  # the tree stays
        # The rewind deletes the first run's ended child before its new run creates it again.
        store.refuse_ends_of, store.armed = None, True
        again = await manager.rewind(parent.id, 0)
        await asyncio.wait_for(again.wait(), 20)
        await asyncio.gather(*store.late)
    assert not store.armed  # the deletion did fail once
    assert Child.SEEN == [True, True]  # the new run's `0.step` outlived the late deletion


async def after_a_deletion_in_doubt(store: LateDeletes) -> ProcedureManager:
    """A stopped manager on `store` whose first `Maker` ended, and whose deletion of that
    tree failed for the child (the request landing `LATE` later)."""
    Child.STORE, Child.SEEN = store, []
    manager = _manager_on(store, Maker)
    async with manager:
        store.armed = True
        first = await manager.submit(ProcedureWithId.new(Maker()))
        await asyncio.wait_for(first.wait(), 10)
        for _ in range(100):
            if not store.armed:
                break
            await asyncio.sleep(0.01)
        assert not store.armed  # the deletion did fail once
    return manager


async def test_a_restarted_manager_still_waits_for_a_deletion_its_earlier_term_left_in_doubt() -> None:
    # The failed request belongs to this process, whichever term sent it: a stop() and
    # start() (or a lease lost and won back) within the grace must not forget it.
    store = LateDeletes()
    manager = await after_a_deletion_in_doubt(store)
    async with manager:
        second = await manager.submit(ProcedureWithId.new(Maker()))
        await asyncio.wait_for(second.wait(), 20)
        await asyncio.gather(*store.late)
    assert Child.SEEN == [True, True]  # the new run's `0.step` outlived the late deletion


async def test_a_stop_while_a_child_waits_out_the_grace_neither_loses_the_child_nor_the_wait() -> None:
    # stop() cuts the wait short; the parent's next start must still create and run the
    # child (its step recording the child was not stored before the child could be), and
    # still wait the rest of the grace first.
    store = LateDeletes()
    manager = await after_a_deletion_in_doubt(store)
    async with manager:  # its metadata forgets the child: a new maker creates it again
        second = ProcedureWithId.new(Maker())
        await manager.submit(second)
        await asyncio.sleep(LATE / 10)  # its child's create waits out the grace
    async with manager:
        for _ in range(200):
            if (watcher := manager.procedure_watcher(second.id)) is not None:
                break
            await asyncio.sleep(0.01)
        assert watcher is not None
        await asyncio.wait_for(watcher.wait(), 20)
        await asyncio.gather(*store.late)
    assert Child.SEEN == [True, True]  # the new run's `0.step` outlived the late deletion
