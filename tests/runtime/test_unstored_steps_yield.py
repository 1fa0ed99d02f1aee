"""A run of steps that store nothing (`Status.executing(persist=False)`) still lets the event
loop run between them: on a store that answers a missing key at once (memory://, a local
directory), nothing else in such a step may yield, and the lease's renewal or an operator's
cancel would wait for the whole run."""

from __future__ import annotations

import asyncio
import uuid

from procstore import Context, Procedure, ProcedureWithId, Status
from tests.support import manager_for


class SpinsWithoutStoring(Procedure):
    """Many steps that never await and store nothing, every other one a sleep already over."""

    type_name = "tests::SpinsWithoutStoring"

    def __init__(self, data: str = "0") -> None:
        self.step = int(data)

    def dump(self) -> str:
        return str(self.step)

    async def execute(self, ctx: Context) -> Status:
        self.step += 1
        if self.step >= 20_000:
            return Status.done()
        # A sleep already over goes on at once, as a step that stores nothing does.
        return Status.sleep(0, persist=False) if self.step % 2 else Status.executing(persist=False)


async def test_steps_that_store_nothing_let_other_tasks_run_between_them() -> None:
    turns = 0

    async def count_turns() -> None:
        nonlocal turns
        while True:
            await asyncio.sleep(0)
            turns += 1

    async with manager_for(f"memory://{uuid.uuid4().hex}/", SpinsWithoutStoring) as manager:
        counter = asyncio.create_task(count_turns())
        watcher = await manager.submit(ProcedureWithId.new(SpinsWithoutStoring()))
        before = turns
        await watcher.wait()
        counter.cancel()
    # About one turn of the loop per step; a starved loop gives the counter none.
    assert turns - before > 1_000, f"the loop turned {turns - before} times in 20,000 steps"
