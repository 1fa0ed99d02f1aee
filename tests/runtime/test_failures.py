"""Retries, failures, rollback, and bugs inside procedures: every path ends, none hangs."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from procstore import (
    Context,
    EndNotRecorded,
    Procedure,
    ProcedureFailed,
    ProcedureStateKind,
    ProcedureWithId,
    Status,
    StoreError,
)
from procstore.store import StateStore
from procstore.store.local import LocalDirStore
from procstore.testing import Fault, FaultyStore
from tests.procedures import JsonProcedure, Undoable, World
from tests.runtime.helpers import blocker, steps
from tests.support import StoreTarget, manager_for


async def collect_kinds(watcher: Any, gate: asyncio.Event | None = None) -> list[ProcedureStateKind]:
    """Every distinct state the watcher goes through; opens `gate` once it is listening."""
    kinds = [watcher.state.kind]
    if gate is not None:
        gate.set()
    while not watcher.state.is_ended():
        state = await watcher.wait_state_change()
        if state.kind is not kinds[-1]:
            kinds.append(state.kind)
    return kinds


async def test_retry_later_then_success(memory_target: StoreTarget) -> None:
    world = World.new()
    async with manager_for(memory_target, max_retry_times=3) as manager:
        name, gate = blocker()
        watcher = await manager.submit(steps(world, 2, retry_at=1, retries=3, block=name))
        kinds = asyncio.ensure_future(collect_kinds(watcher, gate))
        assert await watcher.wait() == "steps done"
        assert await kinds == [ProcedureStateKind.RUNNING, ProcedureStateKind.RETRYING, ProcedureStateKind.DONE]
        assert world.counts["steps/attempts/1"] == 4
        assert world.counts["steps/is_retrying"] == 3
        assert world.counts["steps/1"] == 1


async def test_retry_budget_resets_after_each_step(memory_target: StoreTarget) -> None:
    world = World.new()
    async with manager_for(memory_target, max_retry_times=2) as manager:
        watcher = await manager.submit(steps(world, 3, retry_at="all", retries=2))
        assert await watcher.wait() == "steps done"


async def test_retries_exhausted_fails(memory_target: StoreTarget) -> None:
    world = World.new()
    async with manager_for(memory_target, max_retry_times=2) as manager:
        watcher = await manager.submit(steps(world, 2, retry_at=0, retries=10))
        with pytest.raises(ProcedureFailed, match="gave up after 2 retries") as info:
            await watcher.wait()
        assert world.counts["steps/attempts/0"] == 3
        assert info.value.state.is_failed()
        assert "not ready" in info.value.error


async def test_failure_without_rollback_goes_straight_to_failed(tmp_path: Path) -> None:
    recorder = FaultyStore(LocalDirStore(tmp_path))
    world = World.new()
    async with manager_for(recorder) as manager:
        name, gate = blocker()
        watcher = await manager.submit(steps(world, 3, fail_at=1, block=name))
        kinds = asyncio.ensure_future(collect_kinds(watcher, gate))
        with pytest.raises(ProcedureFailed, match="failed at step 1") as info:
            await watcher.wait()
        assert await kinds == [ProcedureStateKind.RUNNING, ProcedureStateKind.FAILED]
        assert isinstance(info.value.cause, ValueError)
        assert world.effects == {"steps/0"}
    names = [op.key.rsplit("/", 1)[1] for op in recorder.ops if op.kind.startswith("put") and "procedure/" in op.key]
    # The failure is recorded, then its end: a `.commit` above the `.rollback`.
    assert names == ["0000000000.step", "0000000001.step", "0000000002.rollback", "0000000003.commit"]
    assert await LocalDirStore(tmp_path).walk("procedure/") == []


async def test_failure_with_rollback(store_target: StoreTarget) -> None:
    world = World.new()
    async with manager_for(store_target) as manager:
        name, gate = blocker()
        data = {"world": world.name, "steps": 4, "fail_at": 2, "rollback_failures": 2, "block": name}
        watcher = await manager.submit(ProcedureWithId.new(Undoable(data)))
        kinds = asyncio.ensure_future(collect_kinds(watcher, gate))
        with pytest.raises(ProcedureFailed, match="failed at step 2"):
            await watcher.wait()
        expected = [
            ProcedureStateKind.RUNNING,
            ProcedureStateKind.PREPARE_ROLLBACK,
            ProcedureStateKind.ROLLING_BACK,
            ProcedureStateKind.FAILED,
        ]
        seen = await kinds
        # A watcher sees the latest state, so a state that lasts no await (PREPARE_ROLLBACK on
        # memory://, whose writes never yield) can be skipped; the order never changes.
        assert [k for k in expected if k in seen] == seen
        assert ProcedureStateKind.ROLLING_BACK in seen
        if store_target.kind != "memory":
            assert seen == expected
        assert world.effects == {"steps/rolled-back"}
        assert world.counts["steps/rollbacks"] == 3
        assert await manager.store.store.walk("procedure/") == []


async def test_rollback_that_keeps_failing_is_kept_for_the_next_start(tmp_path: Path) -> None:
    target = StoreTarget("local", str(tmp_path))
    world = World.new()
    data = {"world": world.name, "steps": 3, "fail_at": 1, "rollback_failures": 3}
    async with manager_for(target, max_retry_times=2) as manager:
        watcher = await manager.submit(ProcedureWithId.new(Undoable(data)))
        with pytest.raises(ProcedureFailed, match="rollback failed.*next start"):
            await watcher.wait()
        keys = await manager.store.store.walk("procedure/")
        assert keys[-1].endswith("0000000002.rollback")
    async with manager_for(target) as manager:
        resumed = manager.procedure_watcher(watcher.procedure_id)
        assert resumed is not None
        with pytest.raises(ProcedureFailed, match="failed at step 1"):
            await resumed.wait()
        assert world.effects == {"steps/rolled-back"}
        assert await manager.store.store.walk("procedure/") == []


class ReturnsGarbage(JsonProcedure):
    type_name = "test::ReturnsGarbage"

    async def execute(self, ctx: Context) -> Status:
        return "not a status"  # type: ignore[return-value]


class Buggy(JsonProcedure):
    type_name = "test::Buggy"

    async def execute(self, ctx: Context) -> Status:
        statuses: dict[str, Status] = {}
        return statuses["missing"]


class BadDump(Procedure):
    type_name = "test::BadDump"

    def __init__(self, calls: int = 0) -> None:
        self.calls = calls

    async def execute(self, ctx: Context) -> Status:
        return Status.executing()

    def dump(self) -> str:
        self.calls += 1
        if self.calls > 1:
            raise RuntimeError("cannot serialise")
        return "{}"


@pytest.mark.parametrize(
    ("procedure", "fragment"),
    [
        (ReturnsGarbage({}), "not a Status"),
        (Buggy({}), "KeyError"),
        (BadDump(), "cannot serialise"),
    ],
)
async def test_bugs_end_in_failed_with_a_traceback(
    memory_target: StoreTarget, procedure: Procedure, fragment: str
) -> None:
    async with manager_for(memory_target) as manager:
        watcher = await manager.submit(ProcedureWithId.new(procedure))
        with pytest.raises(ProcedureFailed, match=fragment):
            await asyncio.wait_for(watcher.wait(), 5)
        state = watcher.state
        assert state.is_failed() and state.traceback is not None and "Traceback" in state.traceback


class FailingWrites(StateStore):
    """Fails every write after the first `ok` ones (a store that went read-only)."""

    def __init__(self, inner: StateStore, ok: int) -> None:
        self.inner, self.url, self.ok = inner, inner.url, ok

    def _allow(self, key: str) -> None:
        if self.ok <= 0:
            raise StoreError(f"writing {key} was denied", key=key)
        self.ok -= 1

    async def put(self, key: str, value: bytes) -> None:
        self._allow(key)
        await self.inner.put(key, value)

    async def put_if_absent(self, key: str, value: bytes) -> bool:
        self._allow(key)
        return await self.inner.put_if_absent(key, value)

    async def get(self, key: str) -> bytes | None:
        return await self.inner.get(key)

    async def walk(self, prefix: str) -> list[str]:
        return await self.inner.walk(prefix)

    async def batch_delete(self, keys: Any) -> None:
        await self.inner.batch_delete(keys)

    async def delete(self, key: str) -> None:
        await self.inner.delete(key)


async def test_store_errors_are_retried_then_end_unrecorded_with_a_clear_error(tmp_path: Path) -> None:
    world = World.new()
    store = FailingWrites(LocalDirStore(tmp_path), ok=2)  # the submitted state and step 1
    async with manager_for(store, max_retry_times=2) as manager:
        watcher = await manager.submit(steps(world, 4))
        with pytest.raises(EndNotRecorded) as info:  # not a failure: the store says it has not ended
            await watcher.wait()
        error = info.value.error
        assert "gave up after 2 retries" in error and "0000000002.step" in error
        assert "could not be written to the store" in error and "next start" in error
    # Nothing was lost: the last good step is still there, and resumes.
    assert (await LocalDirStore(tmp_path).walk("procedure/"))[-1].endswith("0000000001.step")


def first_write_fails(*whens: str) -> list[Fault]:
    """A transient fault on each listed attempt at writing a submitted state (`0.step`),
    "before" (nothing written) or "after" (written, answer lost)."""
    create = frozenset({"put_if_absent"})
    return [
        Fault("transient", kinds=create, key="*/0000000000.step", nth=i, when=when)  # type: ignore[arg-type]
        for i, when in enumerate(whens)
    ]


async def test_submit_retries_its_write_and_recognises_a_lost_answer(tmp_path: Path) -> None:
    world = World.new()
    store = FaultyStore(LocalDirStore(tmp_path), faults=first_write_fails("before", "after"))
    async with manager_for(store, max_retry_times=3) as manager:
        watcher = await manager.submit(steps(world, 2))
        await watcher.wait()
        assert manager.retry_budget.retries == 2
    assert world.log == ["steps/0", "steps/1"]  # ran once, from its own landed write


async def test_submit_gives_up_after_max_retry_times_and_a_resubmit_is_safe(tmp_path: Path) -> None:
    world = World.new()
    procedure = steps(world, 2)
    # The first attempt lands but its answer is lost; both retries fail.
    store = FaultyStore(LocalDirStore(tmp_path), faults=first_write_fails("after", "before", "before"))
    async with manager_for(store, max_retry_times=2) as manager:
        with pytest.raises(StoreError, match="0000000000.step"):
            await manager.submit(procedure)
        assert manager.procedure_state(procedure.id) is None
        assert world.log == []
        # Submitting the same procedure again finds its own bytes and runs it, once.
        await (await manager.submit(procedure)).wait()
    assert world.log == ["steps/0", "steps/1"]


@pytest.mark.parametrize("rollback", [False, True])
async def test_an_end_that_could_not_be_written_is_not_reported_as_a_failure(tmp_path: Path, rollback: bool) -> None:
    """Credentials expire mid-run (every write denied from then on): `wait()` must not say
    `ProcedureFailed`, since no `.rollback` was written and the next start runs it to its
    end; it raises `EndNotRecorded`, which is no `ProcedureFailed`."""
    world = World.new()
    procedure = ProcedureWithId.new(Undoable({"world": world.name, "steps": 3})) if rollback else steps(world, 3)
    async with manager_for(FailingWrites(LocalDirStore(tmp_path), ok=2), max_retry_times=1) as manager:
        watcher = await manager.submit(procedure)
        with pytest.raises(EndNotRecorded) as info:
            await watcher.wait()
    assert not isinstance(info.value, ProcedureFailed) and info.value.procedure_id == procedure.id
    assert "rollback" not in "".join(await LocalDirStore(tmp_path).walk("procedure/"))
    async with manager_for(LocalDirStore(tmp_path)) as manager:  # the credentials are back
        again = manager.procedure_watcher(procedure.id)
        assert again is not None  # recovered: it had not ended
        await again.wait()
        assert again.state.is_done()
