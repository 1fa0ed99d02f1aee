"""An `uninterruptible()` block that outlives its step (in a task the step started) leaves
the next steps' blocks as they are: every first attempt of a run shares its `Context`, and
its end must not let a cancel cut a later step's own block."""

from __future__ import annotations

import asyncio
import uuid

from procstore import Context, ProcedureWithId, Status
from tests.procedures import LabelledSteps
from tests.runtime.helpers import eventually, wait_for_state
from tests.support import manager_for

SEEN: dict[str, list[str]] = {}
"""What each procedure did, by its label."""


class BlockOutlivesItsStep(LabelledSteps):
    """Step 0 starts a task holding `ctx.uninterruptible()` for 50 ms and returns; step 1
    holds a block of its own for 300 ms."""

    type_name = "tests::BlockOutlivesItsStep"

    async def execute(self, ctx: Context) -> Status:
        seen = SEEN.setdefault(self.label, [])
        if self.step == 0:

            async def side_job() -> None:
                with ctx.uninterruptible():
                    await asyncio.sleep(0.05)
                seen.append("side job ended")

            seen.append(f"started {asyncio.create_task(side_job()).get_name()}")
            self.step = 1
            return Status.executing()
        seen.append("block begins")
        with ctx.uninterruptible():
            await asyncio.sleep(0.3)
            seen.append("block ended whole")
        self.step = 2
        return Status.done()


async def side_job_ended_in_step_one(label: str) -> None:
    """Until step 1's block has begun and the side job's has ended inside it."""
    await eventually(lambda: {"block begins", "side job ended"} <= set(SEEN.get(label, [])))


async def test_a_block_that_outlived_its_step_does_not_let_a_cancel_cut_the_next_steps_block() -> None:
    label = uuid.uuid4().hex
    async with manager_for(f"memory://{label}/", BlockOutlivesItsStep) as manager:
        procedure = ProcedureWithId.new(BlockOutlivesItsStep(f"{label}:0"))
        await manager.submit(procedure)
        await side_job_ended_in_step_one(label)
        await manager.cancel(procedure.id)
        await wait_for_state(manager, procedure.id)
    assert "block ended whole" in SEEN[label]
