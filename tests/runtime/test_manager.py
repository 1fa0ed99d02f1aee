"""`ProcedureManager`: submitting, step numbering, errors, metadata, pausing and stopping."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TypeVar

import pytest

from procstore import (
    DuplicateProcedure,
    LoaderConflict,
    ManagerNotStarted,
    ManagerStopped,
    ProcedureId,
    ProcedureManager,
    ProcedureStateKind,
    ProcedureWithId,
    StoreUnavailable,
    SubmissionsPaused,
    TooManyRunningProcedures,
)
from procstore.store import open_state_store
from procstore.store.local import LocalDirStore
from procstore.store.wrapping import WrappingStore
from procstore.testing import FaultyStore
from procstore.testing.pytest_plugin import free_port
from tests.procedures import Steps, World
from tests.runtime.helpers import blocker, eventually, steps
from tests.support import StoreTarget, manager_for, store_targets

T = TypeVar("T")


def written(recorder: FaultyStore, pid: ProcedureId) -> list[str]:
    """The names of the keys written for `pid`, in order."""
    return [
        op.key.rsplit("/", 1)[1] for op in recorder.ops if op.kind.startswith("put") and f"procedure/{pid}" in op.key
    ]


every_target = store_targets("memory", "local", "s3", "gcs", "wrapped")


async def test_submit_runs_to_done_on_every_store(every_target: StoreTarget) -> None:
    world = World.new()
    async with manager_for(every_target) as manager:
        watcher = await manager.submit(steps(world, 3))
        assert await watcher.wait() == "steps done"
        assert world.effects == {"steps/0", "steps/1", "steps/2"}
        state = manager.procedure_state(watcher.procedure_id)
        assert state is not None and state.is_done() and state.output == "steps done"
        assert await manager.store.store.walk("procedure/") == []


async def test_step_numbering_durable_submit(tmp_path: Path) -> None:
    """0.step as submitted, one .step per persisting transition, then the commit at the next step."""
    recorder = FaultyStore(LocalDirStore(tmp_path))
    world = World.new()
    async with manager_for(recorder) as manager:
        persisting = await manager.submit(steps(world, 3, name="p"))
        await persisting.wait()
        quiet = await manager.submit(steps(world, 3, name="q", persist=False))
        await quiet.wait()
    assert written(recorder, persisting.procedure_id) == [
        "0000000000.step",
        "0000000001.step",
        "0000000002.step",
        "0000000003.commit",
    ]
    assert written(recorder, quiet.procedure_id) == ["0000000000.step", "0000000001.commit"]
    # Deletion came after the commit, steps first.
    kinds = [op.kind for op in recorder.ops if str(persisting.procedure_id) in op.key]
    assert kinds[-3:] == ["batch_delete", "batch_delete", "delete"]


async def test_submit_errors(tmp_path: Path) -> None:
    world = World.new()
    manager = manager_for(StoreTargetLike(tmp_path), max_running_procedures=2)
    with pytest.raises(ManagerNotStarted):
        await manager.submit(steps(world))
    name, gate = blocker()
    async with manager:
        first = steps(world, 2, name="a", block=name)
        await manager.submit(first)
        with pytest.raises(DuplicateProcedure, match=str(first.id)):
            await manager.submit(first)
        await manager.submit(steps(world, 2, name="b", block=name))
        with pytest.raises(TooManyRunningProcedures, match="2"):
            await manager.submit(steps(world, 2, name="c"))
        manager.pause_submissions()
        with pytest.raises(SubmissionsPaused):
            await manager.submit(steps(world, 2, name="d"))
        manager.resume_submissions()
        gate.set()
        await eventually(lambda: all(i.state.is_done() for i in manager.list_procedures()))
        assert (await (await manager.submit(steps(world, 1, name="e"))).wait()) == "e done"
    with pytest.raises(ManagerNotStarted):
        await manager.submit(steps(world))


def StoreTargetLike(path: Path) -> StoreTarget:
    return StoreTarget("local", str(path / "store"))


async def test_id_with_stored_steps_is_a_duplicate(tmp_path: Path) -> None:
    """An id this manager does not know but the store does (e.g. written by another manager)."""
    world = World.new()
    pid = ProcedureId.random()
    async with manager_for(StoreTargetLike(tmp_path)) as manager:
        await manager.store.store_procedure(pid, 0, "test::Steps", '{"other": 1}', None)
        with pytest.raises(DuplicateProcedure, match="stored steps"):
            await manager.submit(ProcedureWithId(pid, Steps({"world": world.name, "steps": 1})))


def test_loader_conflict() -> None:
    manager = ProcedureManager("memory://x/")
    manager.register(Steps)
    with pytest.raises(LoaderConflict, match="test::Steps"):
        manager.register_loader("test::Steps", Steps.load)


async def test_list_procedures_and_metadata_ttl(memory_target: StoreTarget) -> None:
    world = World.new()
    async with manager_for(memory_target, metadata_ttl=0.0) as manager:
        watcher = await manager.submit(steps(world, 2, exclusive=["table/1"], share=["catalog"]))
        await watcher.wait()
        [info] = manager.list_procedures()
        assert info.id == watcher.procedure_id and info.type_name == "test::Steps"
        assert info.state.is_done() and info.parent_id is None
        assert info.start_time is not None and info.end_time is not None and info.start_time <= info.end_time
        assert [str(k) for k in info.lock_keys] == ["share:catalog", "exclusive:table/1"]
        await asyncio.sleep(0.01)
        assert manager.remove_outdated_metadata() == 1
        assert manager.list_procedures() == []
        assert manager.procedure_state(watcher.procedure_id) is None


async def test_metadata_kept_within_ttl(memory_target: StoreTarget) -> None:
    world = World.new()
    async with manager_for(memory_target) as manager:
        await (await manager.submit(steps(world, 1))).wait()
        assert manager.remove_outdated_metadata() == 0
        assert len(manager.list_procedures()) == 1


async def test_stop_cancels_and_writes_nothing_after(tmp_path: Path) -> None:
    recorder = FaultyStore(LocalDirStore(tmp_path))
    world = World.new()
    name, gate = blocker()
    manager = manager_for(recorder)
    await manager.start()
    watcher = await manager.submit(steps(world, 5, block=name))
    await eventually(lambda: watcher.state.is_running())
    waiting = asyncio.ensure_future(watcher.wait())
    await manager.stop()
    ops_at_stop = len(recorder.ops)
    gate.set()
    await asyncio.sleep(0.05)
    assert len(recorder.ops) == ops_at_stop
    with pytest.raises(ManagerStopped, match="resumes"):
        await waiting
    assert watcher.state.kind is ProcedureStateKind.RUNNING


async def test_unreachable_store_fails_start(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("not a directory")
    manager = manager_for(StoreTarget("local", str(tmp_path / "file")))
    with pytest.raises(StoreUnavailable, match="file"):
        await manager.start()
    assert not manager.is_running


async def test_a_store_whose_filesystem_cannot_connect_fails_start_as_unavailable() -> None:
    """fsspec's FTPFileSystem connects as it is built: a refused connection is StoreUnavailable."""
    manager = ProcedureManager(f"ftp://127.0.0.1:{free_port()}/x")
    with pytest.raises(StoreUnavailable, match="ConnectionRefusedError.*reachable"):
        await manager.start()
    assert not manager.is_running


async def test_a_procedure_whose_submit_just_returned_counts_once_toward_the_limit() -> None:
    """Between a submit's registration and the end of its task, the procedure was counted
    twice (running, and still being submitted): a submit made then (one of many in flight)
    was refused with `TooManyRunningProcedures` below the limit."""
    world = World.new()
    name, gate = blocker()
    second = steps(world, 2, name="b", block=name)
    late: list[asyncio.Task[object]] = []

    class SubmitsAsTheFirstLands(WrappingStore):
        async def around(self, kind: str, key: str, call: Callable[[], Awaitable[T]], value: bytes | None = None) -> T:
            result = await call()
            if kind == "put_if_absent" and not late:
                # Its first step runs after the first submit registers its procedure and
                # before that submit's task has ended.
                late.append(asyncio.ensure_future(manager.submit(second)))
            return result

    manager = manager_for(
        SubmitsAsTheFirstLands(open_state_store(f"memory://{uuid.uuid4().hex}/")), max_running_procedures=2
    )
    async with manager:
        await manager.submit(steps(world, 2, name="a", block=name))
        await late[0]  # not TooManyRunningProcedures: one procedure runs, the limit is 2
        gate.set()
        await eventually(lambda: all(i.state.is_done() for i in manager.list_procedures()))
