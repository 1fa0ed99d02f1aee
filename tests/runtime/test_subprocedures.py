"""Subprocedures: suspension, children persisted with their parent, no double start, lock conflicts."""

from __future__ import annotations

import asyncio
import contextlib
import json
from pathlib import Path

import pytest

from procstore import (
    Context,
    EndNotRecorded,
    Lease,
    LockConflict,
    ProcedureFailed,
    ProcedureId,
    ProcedureWithId,
    Status,
    StringKey,
)
from procstore.store import ProcedureMessage, open_state_store
from procstore.store.local import LocalDirStore
from procstore.testing import Fault, FaultyStore, kill_manager
from tests.procedures import Child, JsonProcedure, Parent, World
from tests.runtime.helpers import eventually
from tests.support import StoreTarget, manager_for


async def test_parent_waits_for_children_and_sees_their_states(store_target: StoreTarget) -> None:
    world = World.new()
    async with manager_for(store_target) as manager:
        parent = Parent.create(world, ["a", "b", "c"])
        watcher = await manager.submit(ProcedureWithId.new(parent))
        assert await watcher.wait() == "joined"
        assert world.effects == {
            "parent/prepared",
            *(f"child/{n}/{s}" for n in "abc" for s in (0, 1)),
            "parent/joined",
        }
        assert world.log.index("parent/joined") > max(world.log.index(f"child/{n}/1") for n in "abc")
        infos = {str(i.id): i for i in manager.list_procedures()}
        for cid in parent.data["children"].values():
            assert infos[cid].parent_id == watcher.procedure_id and infos[cid].state.is_done()
        assert await manager.store.store.walk("procedure/") == []


async def test_children_are_persisted_with_parent_id(tmp_path: Path) -> None:
    recorder = FaultyStore(LocalDirStore(tmp_path))
    world = World.new()
    parent = Parent.create(world, ["a"])
    child_id = parent.data["children"]["a"]
    seen: list[ProcedureMessage] = []
    inner_put_if_absent = recorder.inner.put_if_absent

    async def spy(key: str, value: bytes) -> bool:
        if child_id in key and key.endswith("0000000000.step"):
            seen.append(ProcedureMessage.decode(value))
        return await inner_put_if_absent(key, value)

    recorder.inner.put_if_absent = spy  # type: ignore[method-assign]
    async with manager_for(recorder) as manager:
        watcher = await manager.submit(ProcedureWithId.new(parent))
        await watcher.wait()
    assert [(m.type_name, m.parent_id, m.step) for m in seen] == [("test::Child", watcher.procedure_id, 0)]
    # The parent's suspended state is stored before its children's first steps.
    puts = [op.key for op in recorder.ops if op.kind.startswith("put")]
    parent_suspend = next(i for i, k in enumerate(puts) if str(watcher.procedure_id) in k and "0000000002" in k)
    assert parent_suspend < next(i for i, k in enumerate(puts) if child_id in k)


async def test_failed_child_is_seen_by_its_parent(memory_target: StoreTarget) -> None:
    world = World.new()
    async with manager_for(memory_target) as manager:
        parent = Parent.create(world, ["a", "b"], child_extra={"fail": True})
        watcher = await manager.submit(ProcedureWithId.new(parent))
        with pytest.raises(ProcedureFailed, match="children failed"):
            await watcher.wait()
        for cid in parent.data["children"].values():
            state = manager.procedure_state(ProcedureId.parse(cid))
            assert state is not None and state.is_failed()
        assert await manager.store.store.walk("procedure/") == []


class Resubmits(JsonProcedure):
    """Suspends on the same child id three times, and once on a duplicate within one list."""

    type_name = "test::Resubmits"

    async def execute(self, ctx: Context) -> Status:
        rounds = self.data.get("rounds", 0)
        child = ProcedureWithId(
            ProcedureId.parse(self.data["child"]), Child({"world": self.data["world"], "name": "only"})
        )
        if rounds < 3:
            self.data["rounds"] = rounds + 1
            return Status.suspended([child, child])
        return Status.done(rounds)


async def test_known_child_id_is_not_started_twice(memory_target: StoreTarget) -> None:
    world = World.new()
    manager = manager_for(memory_target)
    manager.register(Resubmits)
    async with manager:
        data = {"world": world.name, "child": str(ProcedureId.random())}
        watcher = await manager.submit(ProcedureWithId.new(Resubmits(data)))
        assert await watcher.wait() == 3
    assert world.counts["child/only/0"] == 1 and world.counts["child/only/1"] == 1


@pytest.mark.parametrize(
    ("parent_keys", "child_keys", "conflicts"),
    [
        (["table/1"], ["table/1"], True),
        ([], [], False),
        (["table/1"], ["table/1/region/0"], False),
    ],
)
async def test_child_lock_conflicting_with_parent_fails_the_parent(
    memory_target: StoreTarget, parent_keys: list[str], child_keys: list[str], conflicts: bool
) -> None:
    world = World.new()
    async with manager_for(memory_target) as manager:
        parent = Parent.create(world, ["a"], exclusive=parent_keys, child_extra={"exclusive": child_keys})
        watcher = await manager.submit(ProcedureWithId.new(parent))
        if conflicts:
            with pytest.raises(ProcedureFailed, match="table/1.*conflict") as info:
                await asyncio.wait_for(watcher.wait(), 5)
            assert isinstance(info.value.cause, LockConflict)
        else:
            assert await asyncio.wait_for(watcher.wait(), 5) == "joined"


class SharedParent(JsonProcedure):
    """Holds `catalog` shared and `table` exclusive; its child shares `catalog` and wants `table` shared."""

    type_name = "test::SharedParent"

    async def execute(self, ctx: Context) -> Status:
        if not self.data.get("spawned"):
            self.data["spawned"] = True
            child = ProcedureWithId.new(Child({"world": self.data["world"], "name": "x", "exclusive": []}))
            child_keys = self.data["child_keys"]
            child.procedure.lock_key = lambda: _lock(child_keys)  # type: ignore[method-assign]
            return Status.suspended([child])
        return Status.done("ok")

    def lock_key(self):  # type: ignore[no-untyped-def]
        return _lock([["share", "catalog"], ["exclusive", "table"]])


def _lock(keys: list[list[str]]):  # type: ignore[no-untyped-def]
    from procstore import LockKey

    return LockKey([StringKey.share(k) if mode == "share" else StringKey.exclusive(k) for mode, k in keys])


@pytest.mark.parametrize(
    ("child_keys", "ok"),
    [([["share", "catalog"]], True), ([["share", "table"]], False), ([["exclusive", "catalog"]], False)],
)
async def test_shared_keys_between_parent_and_child(memory_target: StoreTarget, child_keys: list, ok: bool) -> None:  # type: ignore[type-arg]
    world = World.new()
    manager = manager_for(memory_target)
    manager.register(SharedParent)
    async with manager:
        watcher = await manager.submit(
            ProcedureWithId.new(SharedParent({"world": world.name, "child_keys": child_keys}))
        )
        if ok:
            assert await asyncio.wait_for(watcher.wait(), 5) == "ok"
        else:
            with pytest.raises(ProcedureFailed, match="conflict"):
                await asyncio.wait_for(watcher.wait(), 5)


async def test_children_resume_from_their_stored_state_after_restart(tmp_path: Path) -> None:
    """Parent stored as suspended, child half-way: the child resumes at its stored step."""
    target = StoreTarget("local", str(tmp_path))
    world = World.new()
    parent = Parent.create(world, ["a"])
    pid = ProcedureId.random()
    child_id = ProcedureId.parse(parent.data["children"]["a"])
    async with manager_for(target) as manager:
        store = manager.store
        parent.data["stage"] = "join"
        await store.store_procedure(pid, 0, "test::Parent", parent.dump(), None)
        await store.store_procedure(child_id, 0, "test::Child", Child({"world": world.name, "name": "a"}).dump(), pid)
        half = Child({"world": world.name, "name": "a", "stage": 1})
        await store.store_procedure(child_id, 1, "test::Child", half.dump(), pid)
    async with manager_for(target) as manager:
        watcher = manager.procedure_watcher(pid)
        assert watcher is not None
        assert await watcher.wait() == "joined"
    assert world.log == ["child/a/1", "parent/joined"]


def _refusing_the_end_of(procedure: ProcedureWithId, target: StoreTarget) -> FaultyStore:
    """A store that refuses every `.commit` and `.rollback` of `procedure`."""
    refused = [Fault("transient", key=f"procedure/{procedure.id}/*.{kind}") for kind in ("commit", "rollback")]
    return FaultyStore(open_state_store(target.url), faults=refused)


async def test_a_root_whose_failure_cannot_be_stored_keeps_its_ended_children(memory_target: StoreTarget) -> None:
    """The parent's `.commit` and then its `.rollback` are refused after its children
    committed: its end is not stored, so the next start resumes it from its last stored step
    (waiting on the children). Its children's keys must still be there for it to find them
    ended: were they deleted, the resumed parent would create them again and each child would
    run twice."""
    world = World.new()
    parent = Parent.create(world, ["a", "b"])
    procedure = ProcedureWithId.new(parent)
    async with manager_for(_refusing_the_end_of(procedure, memory_target)) as manager:
        watcher = await manager.submit(procedure)
        with pytest.raises(EndNotRecorded):
            await watcher.wait()
    async with manager_for(memory_target) as manager:
        resumed = manager.procedure_watcher(procedure.id)
        assert resumed is not None and await resumed.wait() == "joined"
        assert await manager.store.store.walk("procedure/") == []
        records = await manager.store.store.walk("history/")
    assert {world.counts[f"child/{n}/{s}"] for n in "ab" for s in (0, 1)} == {1}
    assert world.counts["parent/joined"] == 2  # its last step ran again, its children did not
    for child_id in parent.data["children"].values():
        assert sum(child_id in key for key in records) == 1, records  # one run, one record


@pytest.mark.parametrize(("to_step", "child_runs"), [(None, 1), (2, 2)], ids=["resume", "rewind"])
async def test_an_operator_restarts_a_root_whose_end_was_refused(
    memory_target: StoreTarget, to_step: int | None, child_runs: int
) -> None:
    """The same manager restarts the root whose end the store refused (its children's keys
    still stored): a resume goes on knowing its children ended, a rewind's new run creates
    them anew; either way the tree's keys all go at its end."""
    world = World.new()
    procedure = ProcedureWithId.new(Parent.create(world, ["a", "b"]))
    faulty = _refusing_the_end_of(procedure, memory_target)
    async with manager_for(faulty) as manager:
        with pytest.raises(EndNotRecorded):
            await (await manager.submit(procedure)).wait()
        faulty.plan.faults.clear()
        restarted = await (manager.resume(procedure.id) if to_step is None else manager.rewind(procedure.id, to_step))
        assert await restarted.wait() == "joined"
        assert await manager.store.store.walk("procedure/") == []
        # Each child run's record, written from what the manager knew of it (its start too).
        values = await manager.store.store.get_many(await manager.store.store.walk("history/"))
        records = [json.loads(v) for v in values if isinstance(v, bytes)]
    assert {world.counts[f"child/{n}/{s}"] for n in "ab" for s in (0, 1)} == {child_runs}
    children = [r for r in records if r["parent_id"] == str(procedure.id)]
    assert len(children) == 2 * child_runs and all(r["started_at"] for r in children), children


@pytest.mark.parametrize(
    ("to_step", "crash_at"), [(None, "*"), (1, "0000000003.step")], ids=["resume-then-crash", "crash-at-rewinds-copy"]
)
async def test_a_crash_during_an_operators_restart_of_such_a_root_runs_no_child_twice(
    memory_target: StoreTarget, to_step: int | None, crash_at: str
) -> None:
    """The manager dies during the restart: a resume's root before its next write, a
    rewind at its copy. Its children's keys are still stored at the next start, which
    finds them ended (the resume's run, or the old run the rewind never replaced): no child
    runs twice, and every key goes at the tree's end."""
    world = World.new()
    procedure = ProcedureWithId.new(Parent.create(world, ["a", "b"]))
    faulty = _refusing_the_end_of(procedure, memory_target)
    manager = manager_for(faulty)
    async with manager:
        with pytest.raises(EndNotRecorded):
            await (await manager.submit(procedure)).wait()
        faulty.plan.faults[:] = [Fault("crash", key=f"procedure/{procedure.id}/{crash_at}")]
        with contextlib.suppress(BaseException):
            await (manager.resume(procedure.id) if to_step is None else manager.rewind(procedure.id, to_step))
        await faulty.plan.crashed.wait()
        await kill_manager(manager)
    async with manager_for(memory_target) as again:
        resumed = again.procedure_watcher(procedure.id)
        assert resumed is not None and await resumed.wait() == "joined"
        assert await again.store.store.walk("procedure/") == []
    assert {world.counts[f"child/{n}/{s}"] for n in "ab" for s in (0, 1)} == {1}


async def test_a_resume_after_the_trees_metadata_expired_claims_its_stored_children(
    memory_target: StoreTarget,
) -> None:
    """Resumed once `metadata_ttl` has passed, the root is unknown here, its children too:
    they are read from the store as ended, never run again, and go with the tree."""
    world = World.new()
    procedure = ProcedureWithId.new(Parent.create(world, ["a", "b"]))
    faulty = _refusing_the_end_of(procedure, memory_target)
    async with manager_for(faulty, metadata_ttl=0.0) as manager:
        with pytest.raises(EndNotRecorded):
            await (await manager.submit(procedure)).wait()
        faulty.plan.faults.clear()
        assert manager.remove_outdated_metadata() == 3
        assert await (await manager.resume(procedure.id)).wait() == "joined"
        assert await manager.store.store.walk("procedure/") == []
        records = await manager.store.store.walk("history/")
    assert {world.counts[f"child/{n}/{s}"] for n in "ab" for s in (0, 1)} == {1}
    parent = procedure.procedure
    assert isinstance(parent, Parent)
    for child_id in parent.data["children"].values():
        assert sum(child_id in key for key in records) == 1, records


async def test_a_leader_adopting_such_a_root_once_forgotten_finds_its_ended_children(
    memory_target: StoreTarget,
) -> None:
    """Under a lease, once the tree's metadata expired, the leader's look for procedures
    stored after its recovery adopts the root (unknown, unfinished): its ended children are
    kept for it as ended, never named again and run a second time."""
    world = World.new()
    procedure = ProcedureWithId.new(Parent.create(world, ["a", "b"]))
    faulty = _refusing_the_end_of(procedure, memory_target)
    lease = Lease(ttl=1.0, holder="cp-1", adopt_interval=0.05, late_write_grace=0)  # deleted at its end
    async with manager_for(faulty, lease=lease, metadata_ttl=0.0) as manager:
        with pytest.raises(EndNotRecorded):
            await (await manager.submit(procedure)).wait()
        faulty.plan.faults.clear()
        manager.remove_outdated_metadata()
        await eventually(lambda: manager.procedure_watcher(procedure.id) is not None)
        adopted = manager.procedure_watcher(procedure.id)
        assert adopted is not None and await adopted.wait() == "joined"
        assert await manager.store.store.walk("procedure/") == []
    assert {world.counts[f"child/{n}/{s}"] for n in "ab" for s in (0, 1)} == {1}


async def test_a_parent_failed_by_its_children_s_locks_or_a_cycle_has_no_frames_in_its_traceback(
    tmp_path: Path,
) -> None:
    # The parent misused procstore (children that would deadlock or wait for it), and no line
    # of its code or of procstore's failed: its traceback is the error's one line.
    world = World.new()
    conflicting = Parent.create(world, ["d"], exclusive=["t/1"], child_extra={"exclusive": ["t/1"]})
    looping_id = ProcedureId.random()
    looping = Parent({"world": world.name, "stage": "spawn", "children": {"self": str(looping_id)}})
    async with manager_for(tmp_path) as manager:
        for procedure, error in [
            (ProcedureWithId.new(conflicting), "procstore.LockConflict: subprocedure "),
            (ProcedureWithId(looping_id, looping), "procstore.ProcedureError: subprocedure "),
        ]:
            watcher = await manager.submit(procedure)
            with pytest.raises(ProcedureFailed):
                await asyncio.wait_for(watcher.wait(), 5)
            state = manager.procedure_state(procedure.id)
            assert state is not None and state.traceback is not None
            assert state.traceback.startswith(error) and state.traceback.count("\n") == 1, state.traceback
