"""`Client.result()` and `wait()` of a subprocedure that ended while its parent runs on
answer at once: its error if it failed, `ResultNotKept` (saying when it will be) if done,
whose output is kept with its end record, written once its root's tree ends."""

from __future__ import annotations

import asyncio
import contextlib
import json
from typing import ClassVar

import pytest

from procstore import (
    Client,
    Context,
    Procedure,
    ProcedureFailed,
    ProcedureId,
    ProcedureWithId,
    ResultNotKept,
    Status,
)
from tests.support import StoreTarget, manager_for, store_targets

target = store_targets("memory", "local")


class Child(Procedure):
    type_name = "tests::SubResultChild"

    def __init__(self, fails: bool) -> None:
        self.fails = fails

    async def execute(self, ctx: Context) -> Status:
        if self.fails:
            raise ValueError("the child broke")
        return Status.done(output=[1, 2])

    def dump(self) -> str:
        return json.dumps(self.fails)

    @classmethod
    def load(cls, data: str) -> Child:
        return cls(json.loads(data))


class Parent(Procedure):
    """Runs its child, then waits for the test's go before it ends."""

    type_name = "tests::SubResultParent"
    go: ClassVar[asyncio.Event | None] = None

    def __init__(self, data: dict[str, object]) -> None:
        self.data = data

    async def execute(self, ctx: Context) -> Status:
        if not self.data.get("spawned"):
            self.data["spawned"] = True
            child = ProcedureWithId(ProcedureId.parse(str(self.data["child"])), Child(bool(self.data["fails"])))
            return Status.suspended([child])
        assert Parent.go is not None
        await Parent.go.wait()
        return Status.done()

    def dump(self) -> str:
        return json.dumps(self.data)

    @classmethod
    def load(cls, data: str) -> Parent:
        return cls(json.loads(data))


@pytest.mark.parametrize("fails", [False, True])
async def test_a_subprocedure_that_ended_answers_while_its_parent_runs(target: StoreTarget, fails: bool) -> None:
    Parent.go = go = asyncio.Event()
    child = ProcedureWithId.new(Child(fails)).id
    parent = ProcedureWithId.new(Parent({"child": str(child), "fails": fails}))
    async with manager_for(target, Parent, Child, max_retry_times=0) as manager:
        watcher = await manager.submit(parent)
        async with Client(target.url, target.storage_options, poll_interval=0.02) as client:
            while not await manager.store.procedure_keys(child) or not (await client.get(child)).is_ended:
                await asyncio.sleep(0.02)
            expected = (ProcedureFailed, "the child broke") if fails else (ResultNotKept, "parent still runs")
            with pytest.raises(expected[0], match=expected[1]):
                await client.result(child)
            with pytest.raises(expected[0], match=expected[1]):
                await client.wait(child, timeout=2)
            assert not (await client.get(parent.id)).is_ended
            go.set()
            with contextlib.suppress(ProcedureFailed):
                await watcher.wait()
            if not fails:
                assert await client.wait(child, timeout=5) == [1, 2], "kept once its root's tree ended"
