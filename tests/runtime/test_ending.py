"""How a procedure's end deletes its keys: without listing its folder when this term wrote
every key, by listing it whenever a write's outcome is unknown."""

from __future__ import annotations

import asyncio
import contextlib
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import TypeVar

import pytest

from procstore import Client, EndNotRecorded, HistoryRecord, ProcedureFailed, ProcedureManager, ProcedureWithId
from procstore.store import StateStore, open_state_store
from procstore.store.wrapping import WrappingStore
from procstore.testing import Fault, FaultyStore
from tests.procedures import Parent, Undoable, World
from tests.runtime.helpers import steps
from tests.support import StoreTarget, manager_for, store_targets

T = TypeVar("T")

target = store_targets("local", "s3", "memory")


class Counting(WrappingStore):
    def __init__(self, inner: StateStore) -> None:
        super().__init__(inner)
        self.calls: Counter[str] = Counter()
        self.listed: list[str] = []

    async def around(self, kind: str, key: str, call: Callable[[], Awaitable[T]], value: bytes | None = None) -> T:
        self.calls[kind] += 1
        if kind == "walk":
            self.listed.append(key)
        return await call()

    async def delete_in_order(self, first, then, folder):  # type: ignore[no-untyped-def]
        self.calls["delete_in_order"] += 1
        await self.inner.delete_in_order(first, then, folder)


async def test_a_procedure_this_term_wrote_ends_without_listing_its_folder(target: StoreTarget) -> None:
    world = World.new()
    store = Counting(open_state_store(target.url, target.storage_options))
    async with manager_for(store) as manager:
        store.listed.clear()
        done = steps(world, 3)
        await (await manager.submit(done)).wait()
        tree = ProcedureWithId.new(Parent.create(world, ["a", "b"]))
        await (await manager.submit(tree)).wait()
        assert [k for k in store.listed if "procedure/" in k] == []  # no LIST at the end
        assert await store.walk("procedure/") == []  # and nothing left behind
    await store.inner.close()


async def test_when_wait_returns_the_trees_records_are_stored_and_its_keys_gone(target: StoreTarget) -> None:
    # docs/guarantees.md, "Finishing": `wait()` of a root returns after the end records and
    # the deletion, so a read right after it answers (here from a client of its own).
    world = World.new()
    async with manager_for(target) as manager, Client(target.url, target.storage_options) as client:
        tree = ProcedureWithId.new(Parent.create(world, ["a", "b"]))
        await (await manager.submit(tree)).wait()
        store = open_state_store(target.url, target.storage_options)
        try:
            assert await store.walk("procedure/") == []
        finally:
            await store.close()
        records = await client.history()
        assert sorted(r.outcome for r in records) == ["done"] * 3
        assert (await client.get(tree.id)).status == "done"


async def test_a_write_with_an_unknown_outcome_makes_the_end_list_the_folder(local_target: StoreTarget) -> None:
    """A step write that landed but whose every answer was lost: the runner fails the
    procedure without knowing the key exists, so its end must list the folder to find it."""
    world = World.new()
    counting = Counting(open_state_store(local_target.url))
    store = FaultyStore(counting)
    store.plan.faults.append(Fault("transient", kinds=frozenset({"put_if_absent"}), key="*/0000000001.step",
                                   when="after"))  # fmt: skip
    async with manager_for(store, max_retry_times=1) as manager:
        procedure = steps(world, 3)
        watcher = await manager.submit(procedure)
        with contextlib.suppress(ProcedureFailed):
            await watcher.wait()
        assert any(str(procedure.id) in k for k in counting.listed)
        assert await counting.walk(f"procedure/{procedure.id}/") == []
    await counting.inner.close()


async def test_a_parent_stops_unrecorded_when_its_childs_end_could_not_be_stored(local_target: StoreTarget) -> None:
    """Child `a` runs its first step, then nothing of its can be written: neither its next
    step, nor its commit, nor its failure. The store says it has not ended, so its parent
    must not go on as if it had (roll back, commit, delete the tree with the child's keys):
    it stops unrecorded too, and the next start runs the tree to its end."""
    world = World.new()
    parent = Parent.create(world, ["a"])
    child = parent.data["children"]["a"]
    tree = ProcedureWithId.new(parent)
    store = FaultyStore(open_state_store(local_target.url))
    for step in range(1, 4):
        key = f"procedure/{child}/{step:010}.*"
        store.plan.faults.append(Fault("transient", kinds=frozenset({"put_if_absent"}), key=key))
    async with manager_for(store, max_retry_times=1) as manager:
        watcher = await manager.submit(tree)
        with pytest.raises(EndNotRecorded):
            await watcher.wait()
    assert "parent/joined" not in world.log
    assert await store.walk(f"procedure/{child}/") != []  # the child's keys wait for the next start
    store.plan.faults.clear()
    async with manager_for(store) as manager:
        resumed = manager.procedure_watcher(tree.id)
        assert resumed is not None
        await resumed.wait()
    assert "parent/joined" in world.log
    assert await store.walk("procedure/") == []
    await store.inner.close()


@contextlib.asynccontextmanager
async def _a_run_ended_unrecorded(
    target: StoreTarget,
) -> AsyncIterator[tuple[FaultyStore, ProcedureManager, ProcedureWithId]]:
    """Run 1 fails at step 1, but the store refuses its failure (it shows the run
    unfinished): the leader holds it ended, unrecorded. Yields the store (its faults
    cleared), the leader and the procedure."""
    procedure = steps(World.new(), 3, fail_at=1)
    store = FaultyStore(open_state_store(target.url))
    for step in range(1, 4):
        key = f"procedure/{procedure.id}/{step:010}.*"
        store.plan.faults.append(Fault("transient", kinds=frozenset({"put_if_absent"}), key=key, times=4))
    async with manager_for(store, max_retry_times=1, keep_failed=True) as manager:
        with pytest.raises(EndNotRecorded):
            await (await manager.submit(procedure)).wait()
        store.plan.faults.clear()
        yield store, manager, procedure
    await store.inner.close()


def _lose_the_copys_answers(store: FaultyStore, procedure: ProcedureWithId, times: int | None = None) -> None:
    """The next restart's copy lands, and its answer is lost (`times` times; every time if None)."""
    copy = f"procedure/{procedure.id}/*.step"
    store.plan.faults[:] = [Fault("transient", kinds=frozenset({"put_if_absent"}), key=copy, when="after", times=times)]


async def _end_records(store: FaultyStore, procedure: ProcedureWithId) -> dict[int, HistoryRecord]:
    from procstore.store.history import HistoryStore

    return {r.run: r for r in await HistoryStore(store).list() if r.id == str(procedure.id)}


async def test_a_rewind_of_a_run_that_ended_unrecorded_records_that_run(local_target: StoreTarget) -> None:
    """The operator rewinds the run that ended unrecorded on the leader that knows it. The
    new run supersedes the old one, so the old one gets its end record then: history holds
    one record per run."""
    async with _a_run_ended_unrecorded(local_target) as (store, manager, procedure):
        with pytest.raises(ProcedureFailed):  # step 1 fails again, and this time the store says so
            await (await manager.rewind(procedure.id, 0)).wait()
    assert sorted(await _end_records(store, procedure)) == [1, 2]


async def test_a_rewind_whose_copy_landed_with_its_answer_lost_records_the_superseded_run(
    local_target: StoreTarget,
) -> None:
    """As above, but the copy's create lands and its answer is lost: the copy is stored, so
    the rewind goes on (its retry finds its own bytes) and the run it superseded gets its
    end record, rather than the rewind raising with run 2 stored and run 1 never recorded."""
    async with _a_run_ended_unrecorded(local_target) as (store, manager, procedure):
        _lose_the_copys_answers(store, procedure, times=1)
        with pytest.raises(ProcedureFailed):
            await (await manager.rewind(procedure.id, 0)).wait()
        assert store.plan.faults[0].fired == 1  # the copy's answer was lost
    records = await _end_records(store, procedure)
    assert sorted(records) == [1, 2]
    assert "rewound to step 0 before this end was stored" in (records[1].error or "")


@pytest.mark.parametrize("then", ["rewind", "resume"])
@pytest.mark.parametrize("in_doubt", [1, 2])
async def test_a_restart_after_copies_in_doubt_records_every_run_it_superseded(
    local_target: StoreTarget, in_doubt: int, then: str
) -> None:
    """Rewinds raise with their copies stored (every answer lost, past the retries): runs 2
    up to 1 + `in_doubt` are stored, and nothing ran them. The operator's next restart
    supersedes them: a rewind writes a copy above them all, a resume runs the last one as
    stored. Run 1 (which ended here unrecorded) and every run in between get their end
    records: one per run, none skipped (a gap would stop `HistoryStore.find_newest_run`)."""
    from procstore import StoreError
    from procstore.store.history import HistoryStore

    async with _a_run_ended_unrecorded(local_target) as (store, manager, procedure):
        for _ in range(in_doubt):
            _lose_the_copys_answers(store, procedure)
            with pytest.raises(StoreError):
                await manager.rewind(procedure.id, 0)
        store.plan.faults.clear()
        with pytest.raises(ProcedureFailed):
            restarted = manager.rewind(procedure.id, 0) if then == "rewind" else manager.resume(procedure.id)
            await (await restarted).wait()
    how = "rewound to step 0" if then == "rewind" else "resumed"
    last = 1 + in_doubt + (then == "rewind")
    records = await _end_records(store, procedure)
    assert sorted(records) == list(range(1, last + 1))
    assert f"{how} before this end was stored" in (records[1].error or "")
    assert all(f"{how} before it ended" in (records[run].error or "") for run in range(2, last))
    assert (await HistoryStore(store).find_newest_run(procedure.id)).run == last  # type: ignore[union-attr]


async def test_a_restart_is_refused_while_the_procedure_is_being_submitted(local_target: StoreTarget) -> None:
    """The submit's first write backs off (its answers lost); an operator's rewind of the
    id meanwhile must not write a second run beside the one the submit then starts."""
    from procstore import ProcedureError

    world = World.new()
    procedure = steps(world, 2)
    store = FaultyStore(open_state_store(local_target.url))
    key = f"procedure/{procedure.id}/0000000000.step"
    store.plan.faults.append(Fault("transient", kinds=frozenset({"put_if_absent"}), key=key, when="after", times=2))
    async with manager_for(store, retry_delay=0.2, max_retry_delay=0.2, max_retry_times=5) as manager:
        submitting = asyncio.ensure_future(manager.submit(procedure))
        await asyncio.sleep(0.1)  # its first answer is lost: it backs off
        with pytest.raises(ProcedureError, match="being submitted"):
            await manager.rewind(procedure.id, 0)
        await (await submitting).wait()
    assert world.counts["steps/0"] == 1 and world.counts["steps/1"] == 1
    await store.inner.close()


async def test_a_resume_as_stored_of_a_run_that_ended_unrecorded_goes_on_with_that_run(
    local_target: StoreTarget,
) -> None:
    """Resumed without a copy (its latest key is a `.step`), the same run goes on: it has not
    ended, so it gets no end record, and its rollback still runs when it fails."""
    from procstore.store.history import HistoryStore

    world = World.new()
    procedure = ProcedureWithId.new(Undoable({"world": world.name, "steps": 3, "fail_at": 1}))
    store = FaultyStore(open_state_store(local_target.url))
    key = f"procedure/{procedure.id}/0000000002.*"
    store.plan.faults.append(Fault("transient", kinds=frozenset({"put_if_absent"}), key=key, times=8))
    async with manager_for(store, max_retry_times=1) as manager:
        with pytest.raises(EndNotRecorded):
            await (await manager.submit(procedure)).wait()
        # Cleared first: the resumed run writes at once, and a slow history read below
        # would otherwise let it spend its one retry on the faults left.
        store.plan.faults.clear()
        resumed = await manager.resume(procedure.id)
        assert [run for (pid, run) in (await HistoryStore(store).recorded()).runs if pid == str(procedure.id)] == []
        with pytest.raises((ProcedureFailed, EndNotRecorded)):
            await resumed.wait()
    assert "steps/0" not in world.effects
    await store.inner.close()


async def test_a_rewind_of_a_stuck_run_records_that_run_ended(local_target: StoreTarget) -> None:
    """A submit's create landed but every answer was lost: the submit raised and nothing runs
    the stored run 1. The operator rewinds it: run 2 runs, and run 1 gets its end record
    (failed, superseded) once the copy is written: history holds one record per run."""
    from procstore import StoreError
    from procstore.store.history import HistoryStore

    world = World.new()
    procedure = steps(world, 2)
    store = FaultyStore(open_state_store(local_target.url))
    key = f"procedure/{procedure.id}/0000000000.step"
    store.plan.faults.append(Fault("transient", kinds=frozenset({"put_if_absent"}), key=key, when="after"))
    async with manager_for(store, max_retry_times=0) as manager:
        with pytest.raises(StoreError):
            await manager.submit(procedure)
        await (await manager.rewind(procedure.id, 0)).wait()
    records = {r.run: r for r in await HistoryStore(store).list() if r.id == str(procedure.id)}
    assert sorted(records) == [1, 2]
    assert records[1].outcome == "failed" and "rewound to step 0" in (records[1].error or "")
    assert world.counts["steps/0"] == 1
    await store.inner.close()
