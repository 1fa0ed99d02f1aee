"""Step keys are never overwritten: a manager that loses the race for one is fenced and stops."""

from __future__ import annotations

import asyncio
import uuid
from pathlib import Path

import pytest

from procstore import Context, Fenced, ProcedureStateKind, ProcedureWithId, Status
from procstore.store import open_state_store
from procstore.store.local import LocalDirStore
from procstore.testing import Fault, FaultPlan, FaultyStore
from tests.procedures import Steps, World
from tests.runtime.helpers import blocker, eventually, steps, wait_for_state
from tests.support import StoreTarget, manager_for, store_targets


class Stamped(Steps):
    """`Steps` that also stores a fresh token each step, as real states carry timestamps:
    two managers running it write different bytes for the same step."""

    type_name = "test::Stamped"

    async def execute(self, ctx: Context) -> Status:
        status = await super().execute(ctx)
        self.data["stamp"] = uuid.uuid4().hex
        return status


shared_target = store_targets("local", "s3", doc="One store that two managers share (each with its own client).")


async def test_the_manager_that_loses_a_step_key_is_fenced(shared_target: StoreTarget) -> None:
    world = World.new()
    gate, opened = blocker()
    first_store, second_store = (
        FaultyStore(open_state_store(shared_target.url, shared_target.storage_options)) for _ in range(2)
    )
    first = manager_for(first_store)
    first.register(Stamped)
    await first.start()
    submitted = Stamped({"world": world.name, "name": "raced", "steps": 4, "block": gate, "block_at": 2})
    watcher = await first.submit(ProcedureWithId.new(submitted))
    await eventually(lambda: world.counts["raced/1"] == 1)
    await asyncio.sleep(0.05)  # 2.step is stored; the runner waits at the gate
    second = manager_for(second_store)  # a second manager on the same store, as after a bad failover
    second.register(Stamped)
    await second.start()
    await eventually(lambda: world.counts["raced/1"] == 1 and len(second.list_procedures()) == 1)
    opened.set()  # both run step 2 and race for 3.step

    pid = watcher.procedure_id
    await eventually(lambda: (first.fenced or second.fenced) is not None)
    loser, loser_store, winner = (first, first_store, second) if first.fenced else (second, second_store, first)
    state = await wait_for_state(winner, pid)
    assert state.is_done(), state
    assert isinstance(loser.fenced, Fenced) and loser.fenced.procedure_id == pid
    assert (await wait_for_state(loser, pid)).kind is ProcedureStateKind.POISONED
    # The loser wrote nothing after its fenced write, and submits no more.
    fenced_at = max(i for i, op in enumerate(loser_store.ops) if op.key == loser.fenced.key)
    assert not [op for op in loser_store.ops[fenced_at + 1 :] if op.kind in ("put", "put_if_absent", "put_if_version")]
    try:
        await loser.submit(steps(world, 1))
    except Fenced:
        pass
    else:
        raise AssertionError("a fenced manager accepted a submission")
    await first.stop()
    await second.stop()
    assert await second_store.walk("procedure/") == []
    for store in (first_store, second_store):
        await store.inner.close()


async def test_a_lost_answer_to_a_create_is_our_own_write(tmp_path: Path) -> None:
    world = World.new()
    # 1.step lands, then the answer is lost: the retry finds the key holding our own bytes.
    plan = FaultPlan([Fault("transient", frozenset({"put_if_absent"}), key="*/0000000001.step", when="after", times=1)])
    store = FaultyStore(LocalDirStore(tmp_path), plan=plan)
    async with manager_for(store) as manager:
        watcher = await manager.submit(steps(world, 3))
        assert (await wait_for_state(manager, watcher.procedure_id)).is_done()
        assert manager.fenced is None
    assert world.counts["steps/1"] == 1 and plan.faults[0].fired == 1


async def test_a_store_without_atomic_create_says_so_at_start(
    wrapped_target: StoreTarget, caplog: pytest.LogCaptureFixture
) -> None:
    async with manager_for(wrapped_target):
        pass
    assert "fencing between managers is best effort" in caplog.text
