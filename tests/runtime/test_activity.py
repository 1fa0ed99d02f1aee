"""What a running procedure does between its steps is published for operators in other
processes (`activity/ID.json`), without a request for a procedure that only steps."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from procstore import Context, LockKey, Procedure, ProcedureWithId, RetryLater, Status, StringKey
from procstore.store.activity import Activity, ActivityStore
from procstore.store.local import LocalDirStore
from tests.procedures import World
from tests.runtime.helpers import steps
from tests.support import manager_for

GATES: dict[str, asyncio.Event] = {}
SLOW_RETRIES: dict[str, Any] = {"max_retry_times": 1000, "retry_delay": 0.2, "max_retry_delay": 0.2}
"""Retries slow enough that the publisher (one write a second) sees a few of them."""


class Waits(Procedure):
    """Retries until its gate opens (`retry`), holds its lock until it opens (`hold`), or
    waits for one child that retries (`parent`)."""

    type_name = "activity::Waits"

    def __init__(self, data: dict[str, Any]) -> None:
        self.data = data

    def dump(self) -> str:
        return json.dumps(self.data)

    def lock_key(self) -> LockKey:
        return LockKey([StringKey.exclusive(self.data["lock"])] if "lock" in self.data else [])

    async def execute(self, ctx: Context) -> Status:
        gate = GATES[self.data["gate"]]
        if self.data["how"] == "retry" and not gate.is_set():
            raise RetryLater("the datanode is busy")
        if self.data["how"] == "hold":
            await gate.wait()
        if self.data["how"] == "parent" and not self.data.get("waited"):
            self.data["waited"] = True
            return Status.suspended([ProcedureWithId.new(Waits({"how": "retry", "gate": self.data["gate"]}))])
        return Status.done()


async def _published(
    activities: ActivityStore, procedure: ProcedureWithId, wanted: Callable[[Activity], bool]
) -> Activity:
    for _ in range(500):
        found = await activities.get(procedure.id)
        if found is not None and wanted(found):
            return found
        await asyncio.sleep(0.02)
    raise AssertionError(f"no such activity for {procedure.id}: {found}")


async def _gone(activities: ActivityStore, procedure: ProcedureWithId) -> None:
    for _ in range(500):
        if await activities.get(procedure.id) is None:
            return
        await asyncio.sleep(0.02)
    raise AssertionError(f"the activity of {procedure.id} stayed")


async def _ended(wait: Awaitable[object]) -> None:
    await asyncio.wait_for(wait, 20)


async def test_a_procedure_backing_off_says_which_attempt_why_and_when_next(tmp_path: Path) -> None:
    GATES["retry"] = asyncio.Event()
    activities = ActivityStore(LocalDirStore(tmp_path))
    async with manager_for(
        LocalDirStore(tmp_path), Waits, max_retry_times=1000, retry_delay=0.2, max_retry_delay=0.2
    ) as manager:
        procedure = ProcedureWithId.new(Waits({"how": "retry", "gate": "retry"}))
        watcher = await manager.submit(procedure)
        found = await _published(activities, procedure, lambda a: a.doing == "backing off" and a.attempt >= 2)
        assert found.run == 1 and found.step == 1 and found.next_try is not None
        assert found.last_error is not None and "the datanode is busy" in found.last_error
        assert [r.attempt for r in found.retries][:2] == [1, 2]
        GATES["retry"].set()
        await _ended(watcher.wait())
        await _gone(activities, procedure)


async def test_a_procedure_waiting_on_a_lock_names_its_holder(tmp_path: Path) -> None:
    GATES["lock"] = asyncio.Event()
    activities = ActivityStore(LocalDirStore(tmp_path))
    async with manager_for(LocalDirStore(tmp_path), Waits) as manager:
        holder = ProcedureWithId.new(Waits({"how": "hold", "gate": "lock", "lock": "table/1"}))
        first = await manager.submit(holder)
        queued = ProcedureWithId.new(Waits({"how": "hold", "gate": "lock", "lock": "table/1"}))
        second = await manager.submit(queued)
        found = await _published(activities, queued, lambda a: a.doing == "waiting on a lock")
        assert found.lock == "table/1" and found.held_by == [str(holder.id)]
        GATES["lock"].set()
        await _ended(first.wait())
        await _ended(second.wait())
        await _gone(activities, queued)


async def test_a_parent_waiting_on_its_children_says_so(tmp_path: Path) -> None:
    GATES["tree"] = asyncio.Event()
    activities = ActivityStore(LocalDirStore(tmp_path))
    async with manager_for(
        LocalDirStore(tmp_path), Waits, max_retry_times=1000, retry_delay=0.2, max_retry_delay=0.2
    ) as manager:
        parent = ProcedureWithId.new(Waits({"how": "parent", "gate": "tree"}))
        watcher = await manager.submit(parent)
        found = await _published(activities, parent, lambda a: a.doing == "waiting on children")
        assert found.children == 1
        GATES["tree"].set()
        await _ended(watcher.wait())
        await _gone(activities, parent)


async def test_a_procedure_that_only_steps_publishes_nothing(tmp_path: Path) -> None:
    store = LocalDirStore(tmp_path)
    async with manager_for(store) as manager:
        await (await manager.submit(steps(World.new(), 5))).wait()
    assert not await ActivityStore(store).stored_ids()
    assert not await store.walk("activity/")


class RetriesThenSleeps(Procedure):
    """Retries once, then sleeps an hour in a durable wait."""

    type_name = "activity::RetriesThenSleeps"

    def __init__(self, data: dict[str, Any]) -> None:
        self.data = data

    def dump(self) -> str:
        return json.dumps(self.data)

    async def execute(self, ctx: Context) -> Status:
        if not ctx.is_retrying and not self.data.get("slept"):
            raise RetryLater("the datanode is busy")
        self.data["slept"] = True
        return Status.sleep(3600)


async def test_a_procedure_parked_after_its_activity_was_shown_says_it_waits(tmp_path: Path) -> None:
    """Its stored step says it sleeps; an activity saying "running" would be stale for an hour."""
    activities = ActivityStore(LocalDirStore(tmp_path))
    async with manager_for(LocalDirStore(tmp_path), RetriesThenSleeps, **SLOW_RETRIES) as manager:
        procedure = ProcedureWithId.new(RetriesThenSleeps({}))
        await manager.submit(procedure)
        found = await _published(activities, procedure, lambda a: a.doing == "waiting")
        assert found.reason is not None and "sleeping until" in found.reason
