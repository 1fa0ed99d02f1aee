"""Runs, not ids: a resume or rewind starts a new run of the same id, and nothing remembered
or postponed for one run reaches another; a run that ended never runs again, even when a
late write re-creates one of its keys (docs/guarantees.md, "Runs and end records")."""

from __future__ import annotations

import asyncio
import json
import shutil
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any, TypeVar

import pytest

from procstore import (
    Context,
    DuplicateProcedure,
    Lease,
    ProcedureError,
    ProcedureFailed,
    ProcedureId,
    ProcedureWithId,
    Status,
)
from procstore.errors import StoreError
from procstore.store import open_state_store
from procstore.store.history import HistoryRecord, HistoryStore
from procstore.store.keys import KeyType
from procstore.store.message import ProcedureMessage
from procstore.store.wrapping import WrappingStore
from tests.procedures import BLOCKERS, WORLDS, JsonProcedure, World
from tests.runtime.helpers import blocker, eventually, steps
from tests.support import StoreTarget, manager_for, store_targets

T = TypeVar("T")

TTL = 1.0

target = store_targets("memory", "local", "s3")


class Flaky(JsonProcedure):
    """`steps` steps (2); step 1 fails while the world has seen fewer than `fail_times` attempts of
    it (a failure the next run does not meet), and can block on `block` first."""

    type_name = "test::runs::Flaky"

    async def execute(self, ctx: Context) -> Status:
        at = self.data.get("at", 0)
        name = self.data["name"]
        if at == 1:
            self.world.counts[f"{name}/attempts"] += 1
            if self.world.counts[f"{name}/attempts"] <= self.data.get("fail_times", 0):
                raise ValueError(f"{name} failed at step 1")
            if (block := self.data.get("block")) is not None:
                await BLOCKERS[block].wait()
        self.world.apply(f"{name}/{at}")
        self.data["at"] = at + 1
        return Status.done(name) if at + 1 >= self.data.get("steps", 2) else Status.executing()


class Family(JsonProcedure):
    """Step 0 suspends on one `Flaky` child (its id kept in the state); step 1 fails unless it is done."""

    type_name = "test::runs::Family"

    async def execute(self, ctx: Context) -> Status:
        child_id = ProcedureId.parse(self.data["child_id"])
        if self.data.get("stage", "spawn") == "spawn":
            self.world.apply("family/spawned")
            self.data["stage"] = "join"
            child = Flaky({"world": self.data["world"], **self.data["child"]})
            return Status.suspended([ProcedureWithId(child_id, child)], persist=True)
        state = ctx.provider.procedure_state(child_id)
        if state is None or not state.is_done():
            raise RuntimeError(f"child failed: {state}")
        self.world.apply("family/joined")
        return Status.done("joined")


async def test_a_postponed_deletion_never_deletes_a_resumed_run(target: StoreTarget) -> None:
    """Item 1: an inherited root fails during `late_write_grace` (its deletion waits out the
    grace); an operator resumes it; the postponed deletion must leave the new run's keys."""
    world = World.new()
    name, gate = blocker()
    flaky = ProcedureWithId.new(Flaky({"world": world.name, "name": "f", "fail_times": 1, "block": name}))
    folder = f"procedure/{flaky.id}/"
    # Submitted through a former leader (which never ran it): the new leader inherits it.
    store = open_state_store(target.url, target.storage_options)
    submitted = ProcedureMessage(Flaky.type_name, flaky.procedure.dump(), None, 0).encode()
    await _write(store, f"{folder}0000000000.step", submitted)
    await store.close()
    lease = Lease(ttl=TTL, holder="cp-2", late_write_grace=1.0)
    async with manager_for(target, Flaky, Family, lease=lease, keep_failed=True, max_retry_times=0) as manager:
        await manager.wait_until_leading()
        watcher = manager.procedure_watcher(flaky.id)
        assert watcher is not None
        with pytest.raises(ProcedureFailed, match="failed at step 1"):
            await watcher.wait()
        resumed = await manager.resume(flaky.id)
        await asyncio.sleep(1.5)  # past the grace: the first run's postponed deletion has run
        keys = await manager.store.store.walk(folder)
        assert any(k.endswith(".step") and int(k.rsplit("/", 1)[1][:10]) > 3 for k in keys), keys
        assert f"{folder}0000000000.step" in keys  # the folder is the new run's: its audit trail stays
        gate.set()
        assert await resumed.wait() == "f"
    assert world.counts["f/1"] == 1


async def test_a_rewound_parent_runs_its_child_again_whatever_the_earlier_run_left_in_memory(
    memory_target: StoreTarget,
) -> None:
    """Items 2 and 4: the first run's child failed (cancelled by its parent's cancel, here);
    a rewind starts a new run whose child, of the same id, runs again: neither the cancel
    inherited by the earlier child nor its remembered outcome reaches it."""
    world = World.new()
    name, gate = blocker()
    child_id = ProcedureId.random()
    family = ProcedureWithId.new(
        Family({"world": world.name, "child_id": str(child_id), "child": {"name": "c", "block": name, "steps": 3}})
    )
    async with manager_for(memory_target, Flaky, Family, keep_failed=True) as manager:
        watcher = await manager.submit(family)
        await eventually(lambda: world.counts["c/attempts"] == 1)
        await manager.cancel(family.id, "operator says stop")
        gate.set()  # the child sees the cancel before its next step
        with pytest.raises(ProcedureFailed):
            await watcher.wait()
        assert world.counts["c/2"] == 0
        rewound = await manager.rewind(family.id, 0)
        assert await rewound.wait() == "joined"
    assert world.counts["c/2"] == 1 and world.counts["family/joined"] == 1


async def test_a_rewind_reruns_a_failed_child_on_a_manager_that_remembers_it(memory_target: StoreTarget) -> None:
    """Item 4: the same store and actions give the same result whether or not the manager
    still holds the earlier run's metadata."""
    world = World.new()
    family = ProcedureWithId.new(
        Family({"world": world.name, "child_id": str(ProcedureId.random()), "child": {"name": "c", "fail_times": 1}})
    )
    async with manager_for(memory_target, Flaky, Family, keep_failed=True, max_retry_times=0) as manager:
        with pytest.raises(ProcedureFailed, match="child failed"):
            await (await manager.submit(family)).wait()
        rewound = await manager.rewind(family.id, 0)
        assert await rewound.wait() == "joined"
    assert world.counts["c/attempts"] == 2 and world.counts["c/1"] == 1


async def _write(store: Any, key: str, value: bytes) -> None:
    assert await store.put_if_absent(key, value)


async def test_history_records_the_end_of_the_run_that_ended_last(target: StoreTarget) -> None:
    """Item 3: run 1 failed (recorded), run 2 committed and the process died before its
    record: the next start records run 2 as done, whatever run 1's record says."""
    world = World.new()
    pid = ProcedureId.random()
    data = json.dumps({"world": world.name, "name": "f", "at": 1})
    async with manager_for(target, Flaky, Family) as manager:
        store, history = manager.store, HistoryStore(manager.store.store)
        await _write(
            store.store, store.key(pid, 0, KeyType.STEP), ProcedureMessage("test::runs::Flaky", data, None, 0).encode()
        )
        rollback = ProcedureMessage("test::runs::Flaky", data, None, 1, "f failed at step 1")
        await _write(store.store, store.key(pid, 1, KeyType.ROLLBACK), rollback.encode())
        await _write(store.store, store.key(pid, 2, KeyType.COMMIT), b"")
        record = HistoryRecord(
            id=str(pid),
            type_name="test::runs::Flaky",
            parent_id=None,
            outcome="failed",
            error="f failed at step 1",
            ended_at="2026-01-01T00:00:00.000+00:00",
        )
        await history.put_many([record])
        copy = ProcedureMessage("test::runs::Flaky", data, None, 3, None, 2)
        await _write(store.store, store.key(pid, 3, KeyType.STEP), copy.encode())
        await _write(store.store, store.key(pid, 4, KeyType.COMMIT), b"")
    async with manager_for(target, Flaky, Family) as manager:
        assert manager.recovery_problems == []
        found = await HistoryStore(manager.store.store).find(pid)
    assert found is not None and (found.outcome, found.run) == ("done", 2)


async def test_a_finished_procedure_recreated_by_a_late_write_never_runs_again(target: StoreTarget) -> None:
    """Item 6: a paused leader's retried create of `0.step` lands after the procedure ran to
    its end elsewhere and was deleted. Its end record stops it: the next start (and a
    leader's look for strangers) deletes the key instead of running it, and a submit of the
    id is refused."""
    world = World.new()
    submitted = steps(world, 2)
    as_submitted = submitted.procedure.dump()
    async with manager_for(target, Flaky, Family) as manager:
        assert await (await manager.submit(submitted)).wait() == "steps done"
        store = manager.store
        late = ProcedureMessage("test::Steps", as_submitted, None, 0).encode()
        await _write(store.store, store.key(submitted.id, 0, KeyType.STEP), late)
    async with manager_for(target, Flaky, Family) as manager:
        assert manager.recovery_problems == []
        assert manager.procedure_state(submitted.id) is None
        assert await manager.store.store.walk(f"procedure/{submitted.id}/") == []
        with pytest.raises(DuplicateProcedure, match="has ended"):
            await manager.submit(ProcedureWithId(submitted.id, submitted.procedure))
    assert world.log == ["steps/0", "steps/1"]


async def test_a_resume_never_runs_again_a_finished_run_a_late_write_recreated(target: StoreTarget) -> None:
    """A paused leader's retried create of `0.step` lands after the run ended (and its keys
    were deleted) and after this manager's recovery; an operator's resume of the id must not
    run that ended run again (cluster simulator, ledger seed 52723)."""
    world = World.new()
    submitted = steps(world, 2)
    as_submitted = submitted.procedure.dump()
    async with manager_for(target, Flaky, Family) as manager:
        assert await (await manager.submit(submitted)).wait() == "steps done"
    async with manager_for(target, Flaky, Family) as manager:
        store = manager.store
        late = ProcedureMessage("test::Steps", as_submitted, None, 0).encode()
        await _write(store.store, store.key(submitted.id, 0, KeyType.STEP), late)
        with pytest.raises(ProcedureError, match="its run 1 ended"):
            await manager.resume(submitted.id)
    assert world.log == ["steps/0", "steps/1"]


async def test_a_leader_deletes_a_finished_procedure_a_late_write_recreated(local_target: StoreTarget) -> None:
    """Item 6, on a running leader: once it has forgotten the procedure (`metadata_ttl`), its
    look for procedures stored after recovery deletes the key instead of adopting it."""
    world = World.new()
    lease = Lease(ttl=TTL, holder="cp-1", adopt_interval=0.05, late_write_grace=0)
    async with manager_for(local_target, Flaky, Family, lease=lease, metadata_ttl=0.05, gc_interval=0.05) as manager:
        await manager.wait_until_leading()
        submitted = steps(world, 2)
        as_submitted = submitted.procedure.dump()
        assert await (await manager.submit(submitted)).wait() == "steps done"
        store = manager.store
        late = ProcedureMessage("test::Steps", as_submitted, None, 0).encode()
        await _write(store.store, store.key(submitted.id, 0, KeyType.STEP), late)

        async def gone() -> None:
            while await store.store.walk(f"procedure/{submitted.id}/"):
                await asyncio.sleep(0.02)

        await asyncio.wait_for(gone(), 10)
        await asyncio.sleep(0.2)  # more looks: none runs it
    assert world.log == ["steps/0", "steps/1"]


async def test_a_child_created_late_for_a_finished_tree_is_deleted_not_stranded(target: StoreTarget) -> None:
    """Item 7: a paused leader's create of a child's `0.step` lands after the tree ended."""
    world = World.new()
    child_id = ProcedureId.random()
    family = ProcedureWithId.new(Family({"world": world.name, "child_id": str(child_id), "child": {"name": "c"}}))
    async with manager_for(target, Flaky, Family) as manager:
        assert await (await manager.submit(family)).wait() == "joined"
        store = manager.store
        late = ProcedureMessage("test::runs::Flaky", json.dumps({"world": world.name, "name": "c"}), family.id, 0)
        await _write(store.store, store.key(child_id, 0, KeyType.STEP), late.encode())
    async with manager_for(target, Flaky, Family) as manager:
        assert manager.recovery_problems == []
        assert await manager.store.store.walk("procedure/") == []
    assert world.counts["c/0"] == 1


async def test_one_record_per_run_whoever_writes_it(memory_target: StoreTarget) -> None:
    """Item 8: a paused leader's record of an end lands after the new leader's: still one."""
    world = World.new()
    submitted = steps(world, 2)
    async with manager_for(memory_target, Flaky, Family) as manager:
        await (await manager.submit(submitted)).wait()
        history = HistoryStore(manager.store.store)
        (mine,) = await history.list()
        late = HistoryRecord(
            id=mine.id,
            type_name=mine.type_name,
            parent_id=None,
            outcome="failed",
            ended_at="2030-01-01T00:00:00.000+00:00",
        )
        await history.put_many([late])
        assert await history.list() == [mine]


class LateCommit(WrappingStore):
    """The first `.commit` write lands only once a `.rollback` is written (its answer, and
    every retry's, is an error; a read finds nothing until then)."""

    def __init__(self, inner: Any) -> None:
        super().__init__(inner)
        self.held: tuple[str, bytes] | None = None
        self.landed = False

    def around(
        self, kind: str, key: str, call: Callable[[], Coroutine[Any, Any, T]], value: bytes | None = None
    ) -> Coroutine[Any, Any, T]:
        return self._around(kind, key, call, value)

    async def _around(self, kind: str, key: str, call: Callable[[], Coroutine[Any, Any, T]], value: bytes | None) -> T:
        if kind == "put_if_absent" and key.endswith(".commit") and not self.landed:
            if self.held is None:
                self.held = (key, value or b"")
                raise StoreError("the answer was lost", key=key)
            if key == self.held[0]:
                raise StoreError("service unavailable", key=key)
        result = await call()
        if kind == "put_if_absent" and key.endswith(".rollback") and self.held is not None and not self.landed:
            self.landed = True
            await self.inner.put_if_absent(*self.held)
        return result


async def test_a_commit_that_lands_late_is_deleted_with_the_failure(target: StoreTarget) -> None:
    """Item 9: the commit's answer is lost and its retries fail, so the failure goes one step
    above it; then the delayed commit lands. The deletion lists the folder: no `.commit`
    is left to read as success."""
    world = World.new()
    store = LateCommit(open_state_store(target.url, target.storage_options))
    async with manager_for(store, Flaky, Family, max_retry_times=1) as manager:
        submitted = steps(world, 1)
        with pytest.raises(ProcedureFailed, match="commit could not be written"):
            await (await manager.submit(submitted)).wait()
        assert store.landed
        assert await manager.store.store.walk("procedure/") == []
        (record,) = await HistoryStore(manager.store.store).list()
        assert record.outcome == "failed"


FROZEN = Path(__file__).parent.parent / "data" / "store-before-runs"
"""Written by the release before runs (5c8ed66, with history on and keep_failed): a root
that finished, a failed root kept and resumed once (failed again), and an unfinished root
as a crash left it at its step 1. Its messages carry no `run`, its records the old names."""


async def test_a_store_written_before_runs_is_read_and_run_as_before(tmp_path: Path) -> None:
    shutil.copytree(FROZEN, tmp_path, dirs_exist_ok=True)
    world = WORLDS["frozen"] = World("frozen")
    kept = ProcedureId.parse("00000000-0000-4000-8000-000000000002")
    async with manager_for(StoreTarget("local", str(tmp_path)), Flaky, Family, keep_failed=True) as manager:
        assert manager.recovery_problems == []
        unfinished = manager.procedure_watcher(ProcedureId.parse("00000000-0000-4000-8000-000000000003"))
        assert unfinished is not None and await unfinished.wait() == "unfinished done"
        assert world.log == ["unfinished/1", "unfinished/2"]
        history = HistoryStore(manager.store.store)
        old = await history.find(ProcedureId.parse("00000000-0000-4000-8000-000000000001"))
        assert old is not None and (old.outcome, old.run) == ("done", 1)
        rewound = await manager.rewind(kept, 0)
        with pytest.raises(ProcedureFailed):  # fail_at=1, as in both earlier runs
            await rewound.wait()
        keys = await manager.store.procedure_keys(kept)
        copy = await manager.store.store.get(str(keys[-3]))
        assert copy is not None and ProcedureMessage.decode(copy).run == 2
        records = await history.list()
    # The earlier release's three records (read as run 1), then this one's: one per run that ended.
    assert sorted((r.id[-1], r.run, r.outcome) for r in records) == [
        ("1", 1, "done"),
        ("2", 1, "failed"),
        ("2", 1, "failed"),
        ("2", 2, "failed"),
        ("3", 1, "done"),
    ]


async def test_metadata_expiry_forgets_the_run_that_ended_never_the_one_resumed(memory_target: StoreTarget) -> None:
    """Item 5: forgetting a finished run (`metadata_ttl`) leaves a later run of the id known,
    so that no leader takes it for a stranger and runs it twice."""
    world = World.new()
    name, gate = blocker()
    flaky = ProcedureWithId.new(Flaky({"world": world.name, "name": "f", "fail_times": 1, "block": name}))
    async with manager_for(
        memory_target, Flaky, Family, keep_failed=True, max_retry_times=0, metadata_ttl=0.0
    ) as manager:
        with pytest.raises(ProcedureFailed):
            await (await manager.submit(flaky)).wait()
        resumed = await manager.resume(flaky.id)
        await asyncio.sleep(0.01)
        manager.remove_outdated_metadata()
        state = manager.procedure_state(flaky.id)
        assert state is not None and state.is_running()
        gate.set()
        assert await resumed.wait() == "f"
