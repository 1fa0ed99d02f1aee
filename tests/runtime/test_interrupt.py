"""A cancel or fail reaches the running step: the step is interrupted where it awaits, unless
it holds `ctx.uninterruptible()`; the procedure then fails (rolling back) as asked."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest

from procstore import Context, Procedure, ProcedureFailed, ProcedureWithId, Status
from procstore.store.local import LocalDirStore
from procstore.store.requests import OperatorRequest, RequestStore
from procstore.testing import Fault, FaultyStore
from tests.support import manager_for

SEEN: dict[str, list[str]] = {}
"""What each test's procedures did, by the test's name."""
IN_STEP: dict[str, asyncio.Event] = {}


class Blocked(Procedure):
    """A step blocked in an hour's await (`block`), optionally inside `ctx.uninterruptible()`
    after a first await there (`hold`); or a parent of one such child (`child`)."""

    type_name = "interrupt::Blocked"
    rollback_supported = True

    def __init__(self, data: dict[str, Any]) -> None:
        self.data = data

    def dump(self) -> str:
        return json.dumps(self.data)

    async def execute(self, ctx: Context) -> Status:
        seen = SEEN[self.data["test"]]
        if "child" in self.data:
            if not self.data.get("waited"):
                self.data["waited"] = True
                child = {"test": self.data["test"], "name": "child"}
                return Status.suspended([ProcedureWithId.new(Blocked(child))])
            return Status.done()
        seen.append(f"{self.data.get('name', 'step')} began")
        if self.data.get("hold"):
            with ctx.uninterruptible():
                IN_STEP[self.data["test"]].set()
                await asyncio.sleep(0.05)
                seen.append("held block ended")
            seen.append("after the held block")  # no await since the block: still runs
        else:
            IN_STEP[self.data["test"]].set()
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            seen.append(f"{self.data.get('name', 'step')} interrupted")
            raise
        seen.append("slept an hour")
        return Status.done()

    async def rollback(self, ctx: Context) -> None:
        SEEN[self.data["test"]].append(f"{self.data.get('name', 'step')} rolled back")


def _start(test: str) -> asyncio.Event:
    SEEN[test] = []
    IN_STEP[test] = asyncio.Event()
    return IN_STEP[test]


async def test_a_cancel_interrupts_a_step_blocked_in_a_long_await(tmp_path: Path) -> None:
    in_step = _start("cancel")
    async with manager_for(LocalDirStore(tmp_path), Blocked) as manager:
        watcher = await manager.submit(ProcedureWithId.new(Blocked({"test": "cancel"})))
        await asyncio.wait_for(in_step.wait(), 10)
        await manager.cancel(watcher.procedure_id, "wrong region")
        with pytest.raises(ProcedureFailed, match="wrong region"):
            await asyncio.wait_for(watcher.wait(), 10)
    assert SEEN["cancel"] == ["step began", "step interrupted", "step rolled back"]


async def test_a_request_from_another_process_interrupts_the_step_within_a_poll(tmp_path: Path) -> None:
    """As `procstore fail` writes it: the manager's poll of `requests/` finds it."""
    in_step = _start("poll")
    async with manager_for(LocalDirStore(tmp_path), Blocked, request_poll_interval=0.05) as manager:
        watcher = await manager.submit(ProcedureWithId.new(Blocked({"test": "poll"})))
        await asyncio.wait_for(in_step.wait(), 10)
        requests = RequestStore(LocalDirStore(tmp_path))
        assert await requests.put(watcher.procedure_id, OperatorRequest.new("fail", "the disk is gone"))
        with pytest.raises(ProcedureFailed, match="the disk is gone"):
            await asyncio.wait_for(watcher.wait(), 10)
    assert SEEN["poll"] == ["step began", "step interrupted", "step rolled back"]


async def test_an_uninterruptible_block_runs_to_its_end_and_the_step_stops_at_its_next_await(
    tmp_path: Path,
) -> None:
    in_step = _start("hold")
    async with manager_for(LocalDirStore(tmp_path), Blocked) as manager:
        watcher = await manager.submit(ProcedureWithId.new(Blocked({"test": "hold", "hold": True})))
        await asyncio.wait_for(in_step.wait(), 10)
        await manager.cancel(watcher.procedure_id, "stop")
        with pytest.raises(ProcedureFailed, match="stop"):
            await asyncio.wait_for(watcher.wait(), 10)
    assert SEEN["hold"] == [
        "step began",
        "held block ended",
        "after the held block",
        "step interrupted",
        "step rolled back",
    ]


class HeldThenReturns(Procedure):
    """A step that returns right after its `ctx.uninterruptible()` block, with no await."""

    type_name = "interrupt::HeldThenReturns"
    rollback_supported = True

    def __init__(self, data: dict[str, Any]) -> None:
        self.data = data

    def dump(self) -> str:
        return json.dumps(self.data)

    async def execute(self, ctx: Context) -> Status:
        if self.data.get("stepped"):
            return Status.done()
        with ctx.uninterruptible():
            IN_STEP[self.data["test"]].set()
            await asyncio.sleep(0.05)
        self.data["stepped"] = True
        return Status.executing()

    async def rollback(self, ctx: Context) -> None:
        SEEN[self.data["test"]].append("rolled back")


async def test_a_request_held_to_the_end_of_a_step_that_returns_at_once_stops_the_next_step(tmp_path: Path) -> None:
    """The interrupt owed at the block's end must not land in procstore's own awaits once the
    step has returned: the procedure fails as asked before its next step (not with a stray
    `CancelledError` of procstore's own writes)."""
    in_step = _start("returns")
    async with manager_for(LocalDirStore(tmp_path), HeldThenReturns) as manager:
        watcher = await manager.submit(ProcedureWithId.new(HeldThenReturns({"test": "returns"})))
        await asyncio.wait_for(in_step.wait(), 10)
        await manager.cancel(watcher.procedure_id, "stop it")
        with pytest.raises(ProcedureFailed) as failed:
            await asyncio.wait_for(watcher.wait(), 10)
    assert "stop it" in str(failed.value) and "CancelledError" not in str(failed.value)
    assert SEEN["returns"] == ["rolled back"]


async def test_a_cancel_of_a_parent_interrupts_its_childs_running_step(tmp_path: Path) -> None:
    in_step = _start("tree")
    async with manager_for(LocalDirStore(tmp_path), Blocked) as manager:
        watcher = await manager.submit(ProcedureWithId.new(Blocked({"test": "tree", "child": True})))
        await asyncio.wait_for(in_step.wait(), 10)
        await manager.cancel(watcher.procedure_id, "abandon the table")
        with pytest.raises(ProcedureFailed, match="abandon the table"):
            await asyncio.wait_for(watcher.wait(), 10)
    assert SEEN["tree"][:3] == ["child began", "child interrupted", "child rolled back"]


async def test_a_stop_during_an_interrupted_step_is_a_stop(tmp_path: Path) -> None:
    """The manager stops while the interrupt is on its way: the procedure stays unfinished
    (the next start runs it, and meets the request), nothing is recorded as failed."""
    in_step = _start("stop")
    # The interrupted step's `.rollback` write waits until the stop cuts it: without the
    # wait, how far the rollback got before the stop would depend on the machine's load.
    held = Fault("delay", key="*.rollback", seconds=3600, times=1)
    manager = manager_for(FaultyStore(LocalDirStore(tmp_path), faults=[held]), Blocked)
    await manager.start()
    watcher = await manager.submit(ProcedureWithId.new(Blocked({"test": "stop"})))
    await asyncio.wait_for(in_step.wait(), 10)
    await manager.cancel(watcher.procedure_id, "stop it")
    async with asyncio.timeout(10):
        while not held.fired:
            await asyncio.sleep(0.01)
    await manager.stop()
    assert "step rolled back" not in SEEN["stop"]
    async with manager_for(LocalDirStore(tmp_path), Blocked) as again:
        resumed = again.procedure_watcher(watcher.procedure_id)
        assert resumed is not None
        with pytest.raises(ProcedureFailed, match="stop it"):
            await asyncio.wait_for(resumed.wait(), 10)
    assert SEEN["stop"][-1] == "step rolled back"
