"""Where runs meet restarts, retention and earlier releases: a hostile review's breaks of the
"Runs and end records" promises (docs/guarantees.md), each kept as the scenario that broke
them. An operator's restart through the CLI stays a subprocess: it is the operator's path."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from procstore import (
    Client,
    Context,
    DuplicateProcedure,
    History,
    Lease,
    ProcedureFailed,
    ProcedureId,
    ProcedureWithId,
    Status,
)
from procstore.store import open_state_store
from procstore.store.history import HistoryRecord, HistoryStore, iso
from procstore.store.message import ProcedureMessage
from procstore.testing import Fault, FaultyStore
from tests.procedures import JsonProcedure, Steps, World
from tests.runtime.helpers import HeldOnce, blocker, eventually
from tests.runtime.test_runs import Family, Flaky
from tests.support import StoreTarget, manager_for

TTL = 1.0


async def _inherited(target: StoreTarget, procedure: ProcedureWithId) -> None:
    """Store `procedure` as a former leader's submit left it: the next leader inherits it."""
    store = open_state_store(target.url, target.storage_options)
    message = ProcedureMessage(procedure.procedure.type_name, procedure.procedure.dump(), None, 0).encode()
    assert await store.put_if_absent(f"procedure/{procedure.id}/0000000000.step", message)
    await store.close()


async def _end_records(store: HistoryStore, pid: ProcedureId) -> list[int]:
    return sorted(run for (id_, run) in (await store.recorded()).runs if id_ == str(pid))


async def _procstore(*args: str) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "procstore", *args]
    return await asyncio.to_thread(subprocess.run, command, capture_output=True, text=True, timeout=60)


async def test_a_submit_is_refused_while_history_keeps_a_later_run_of_the_id(local_target: StoreTarget) -> None:
    """Run 1 of an id failed long ago (kept for an operator) and was resumed: run 2 committed
    just now. A sweep past run 1's retention keeps its record while run 2's is kept, so a
    submit of the id, to another manager of the store, raises DuplicateProcedure and runs
    nothing: an id runs once for as long as history keeps an end record of it."""
    world = World.new()
    data = {"world": world.name, "name": "f"}
    proc = ProcedureWithId.new(Flaky(dict(data)))
    retention = 7 * 24 * 3600.0
    history = HistoryStore(open_state_store(local_target.url, local_target.storage_options), "", History(retention))
    long_ago = datetime.now(UTC) - timedelta(seconds=2 * retention)
    run_1 = HistoryRecord(
        id=str(proc.id),
        type_name=Flaky.type_name,
        parent_id=None,
        outcome="failed",
        ended_at=iso(long_ago) or "",
        run=1,
    )
    run_2 = HistoryRecord(
        id=str(proc.id),
        type_name=Flaky.type_name,
        parent_id=None,
        outcome="done",
        ended_at=iso(datetime.now(UTC)) or "",
        run=2,
    )
    await history.put_many([run_1, run_2])
    assert await history.sweep() == 0
    assert {r.run for r in await history.list()} == {1, 2}
    async with manager_for(local_target, Flaky, Family, keep_failed=True) as manager:
        with pytest.raises(DuplicateProcedure):
            await (await manager.submit(ProcedureWithId(proc.id, Flaky(dict(data))))).wait()
    assert world.counts["f/0"] == 0
    past_retention = time.time() + 3 * retention
    assert await history.sweep(now=past_retention) == 2  # then the id's records go together
    await history.store.close()


async def test_an_end_the_previous_release_recorded_is_not_recorded_again(local_target: StoreTarget) -> None:
    """The previous release wrote a procedure's end record before deleting its keys; a crash
    between the two leaves a `.commit` with its record. The first start of this release
    deletes the keys without running anything and writes no second record: one end, one
    record, as that release's recovery did."""
    world = World.new()
    pid = ProcedureId.random()
    data = json.dumps({"world": world.name, "name": "f", "at": 2})
    store = open_state_store(local_target.url, local_target.storage_options)
    submitted = ProcedureMessage(Flaky.type_name, data, None, 0).encode()
    assert await store.put_if_absent(f"procedure/{pid}/0000000000.step", submitted)
    assert await store.put_if_absent(f"procedure/{pid}/0000000001.commit", b"")
    old = {
        "id": str(pid),
        "type_name": Flaky.type_name,
        "parent_id": None,
        "outcome": "done",
        "started_at": "2026-11-27T10:00:00.000+00:00",
        "ended_at": "2026-11-27T10:00:01.000+00:00",
        "steps": 1,
        "retries": 0,
    }
    assert await store.put_if_absent(f"history/1795773601000-{pid}.json", json.dumps(old).encode())
    await store.close()
    async with manager_for(local_target, Flaky, Family) as manager:
        assert manager.recovery_problems == []
        records = [r for r in await HistoryStore(manager.store.store).list() if r.id == str(pid)]
    assert len(records) == 1
    assert world.counts["f/2"] == 0


async def test_a_refused_resubmit_leaves_the_kept_procedure_to_rewind(local_target: StoreTarget) -> None:
    """A failed root kept for an operator (keep_failed) whose metadata the manager has
    forgotten (metadata_ttl) is submitted again with the same id and bytes: the submit raises
    DuplicateProcedure and changes nothing. Every kept key stays, `0.step` included, so the
    operator can still rewind it to step 0 and run it."""
    world = World.new()
    data = {"world": world.name, "name": "f", "fail_times": 1}
    proc = ProcedureWithId.new(Flaky(dict(data)))
    folder = f"procedure/{proc.id}/"
    options: dict[str, Any] = {"keep_failed": True, "max_retry_times": 0}
    async with manager_for(local_target, Flaky, Family, metadata_ttl=0.05, gc_interval=0.05, **options) as manager:
        with pytest.raises(ProcedureFailed):
            await (await manager.submit(proc)).wait()
        kept = sorted(await manager.store.store.walk(folder))
        await eventually(lambda: manager.procedure_state(proc.id) is None)  # its metadata expired
        with pytest.raises(DuplicateProcedure):
            await manager.submit(ProcedureWithId(proc.id, Flaky(dict(data))))
        assert sorted(await manager.store.store.walk(folder)) == kept
    async with manager_for(local_target, Flaky, Family, **options) as manager:
        assert await (await manager.rewind(proc.id, 0)).wait() == "f"


async def test_a_parent_rewound_during_the_grace_runs_its_failed_child_again(local_target: StoreTarget) -> None:
    """A leader inherits a parent from a former leader; its child fails, so the parent fails
    (kept with keep_failed) while the deletion of the ended tree waits out
    `late_write_grace`. A rewind of the parent at once, inside the grace, runs the child it
    names again and joins it, as it does without a lease or after the grace: the postponed
    deletion of run 1 never reaches run 2's child."""
    world = World.new()
    child_id = ProcedureId.random()
    family = ProcedureWithId.new(
        Family({"world": world.name, "child_id": str(child_id), "child": {"name": "c", "fail_times": 1}})
    )
    await _inherited(local_target, family)
    lease = Lease(ttl=TTL, holder="cp-2", late_write_grace=1.0)
    async with manager_for(local_target, Flaky, Family, lease=lease, keep_failed=True, max_retry_times=0) as manager:
        await manager.wait_until_leading()
        watcher = manager.procedure_watcher(family.id)
        assert watcher is not None
        with pytest.raises(ProcedureFailed, match="child failed"):
            await watcher.wait()
        rewound = await manager.rewind(family.id, 0)
        assert await asyncio.wait_for(rewound.wait(), 15) == "joined"
    assert world.counts["c/attempts"] == 2 and world.counts["c/1"] == 1


async def _restart_by_cli_during_the_grace(target: StoreTarget, *command: str) -> World:
    """An inherited root fails with no keep_failed, so its deletion waits out the grace;
    inside it the operator runs `procstore COMMAND URL ID ...`, and the grace ends before the
    leader's next look at requests. Returns once run 2 has its end record beside run 1's."""
    world = World.new()
    flaky = ProcedureWithId.new(Flaky({"world": world.name, "name": "f", "fail_times": 1}))
    await _inherited(target, flaky)
    # A grace long enough for the CLI's process to start and write under load (it took over
    # two seconds beside a simulator soak); the look at requests comes after it.
    lease = Lease(ttl=TTL, holder="cp-2", late_write_grace=5.0)
    async with manager_for(target, Flaky, Family, lease=lease, max_retry_times=0, request_poll_interval=5.5) as manager:
        await manager.wait_until_leading()
        watcher = manager.procedure_watcher(flaky.id)
        assert watcher is not None
        with pytest.raises(ProcedureFailed):
            await watcher.wait()
        out = await _procstore(command[0], target.url, str(flaky.id), *command[1:])
        assert out.returncode == 0, out.stderr
        history = HistoryStore(manager.store.store)

        async def run_2_ended() -> None:
            while await _end_records(history, flaky.id) != [1, 2]:
                await asyncio.sleep(0.05)

        await asyncio.wait_for(run_2_ended(), 10)
    return world


async def test_a_cli_resume_during_the_grace_runs_the_procedure(local_target: StoreTarget) -> None:
    """A leader inherits a root that fails (no keep_failed: its deletion waits out
    `late_write_grace`, the operator's window). `procstore resume` answers 0 having written
    only a nudge, and the grace ends before the leader's next look at requests: the
    postponed deletion must keep the root for the nudge, so that run 2 runs on the leader,
    commits and gets its end record beside run 1's."""
    world = await _restart_by_cli_during_the_grace(local_target, "resume")
    assert world.counts["f/1"] == 1


async def test_a_cli_rewind_during_the_grace_runs_the_procedure(local_target: StoreTarget) -> None:
    """A leader inherits a root that fails (no keep_failed: its deletion waits out
    `late_write_grace`). Inside the grace `procstore rewind --to-step 0 -y` stores run 2's
    copy and a nudge, and the grace ends before the leader reads the nudge. The postponed
    deletion must delete nothing of run 2 (its copy is above run 1's highest step), and the
    leader runs run 2 to its end record instead of refusing the nudge and leaving the copy
    to be deleted as a stray."""
    world = await _restart_by_cli_during_the_grace(local_target, "rewind", "--to-step", "0", "-y")
    assert world.counts["f/1"] == 1


async def test_a_resumed_run_survives_a_refused_resubmit_and_a_crash(local_target: StoreTarget) -> None:
    """Managers share the store by lease, with keep_failed. A job fails and is kept; its
    metadata expires; the same job submitted again raises DuplicateProcedure (and stores or
    deletes nothing). The operator resumes it and the process exits while run 2 is in its
    step 1: the next leader's recovery runs run 2 to its end instead of deleting its folder
    as a late write's leftover."""
    world = World.new()
    name, gate = blocker()
    data = {"world": world.name, "name": "f", "fail_times": 1, "block": name}
    proc = ProcedureWithId.new(Flaky(dict(data)))
    options: dict[str, Any] = {"keep_failed": True, "max_retry_times": 0, "metadata_ttl": 0.05, "gc_interval": 0.05}
    lease = Lease(ttl=TTL, holder="cp-1", adopt_interval=0.2)
    async with manager_for(local_target, Flaky, Family, lease=lease, **options) as manager:
        await manager.wait_until_leading()
        with pytest.raises(ProcedureFailed):
            await (await manager.submit(proc)).wait()
        await eventually(lambda: manager.procedure_state(proc.id) is None)  # its metadata expired
        with pytest.raises(DuplicateProcedure):
            await manager.submit(ProcedureWithId(proc.id, Flaky(dict(data))))
        await manager.resume(proc.id)
        await eventually(lambda: world.counts["f/attempts"] == 2)  # run 2 waits in its step 1
    # stop() leaves the running procedure as a process exit would; the next leader starts.
    gate.set()
    async with manager_for(local_target, Flaky, Family, lease=Lease(ttl=TTL, holder="cp-2"), **options) as manager:
        await manager.wait_until_leading()
        watcher = manager.procedure_watcher(proc.id)
        assert watcher is not None, "the resumed run was deleted at the next start"
        assert await asyncio.wait_for(watcher.wait(), 10) == "f"
    assert world.counts["f/1"] == 1


class BadText(JsonProcedure):
    """Fails with text holding a lone surrogate, as `os.fsdecode` gives for a file name that
    is not UTF-8."""

    type_name = "test::runs::BadText"

    async def execute(self, ctx: Context) -> Status:
        self.world.apply("bad/run")
        raise ValueError("cannot open /data/caf\udce9.csv")


async def test_a_failure_whose_text_is_not_unicode_is_stored_and_never_runs_again(
    local_target: StoreTarget,
) -> None:
    """An exception escaping execute() whose text holds a lone surrogate still fails the
    procedure for good: its failure is stored (with its end record), so the next start finds
    it ended and never runs it (or its effects) again."""
    world = World.new()
    proc = ProcedureWithId.new(BadText({"world": world.name}))
    manager = manager_for(local_target, Flaky, Family, max_retry_times=0)
    manager.register(BadText)
    async with manager:
        with pytest.raises(ProcedureFailed, match="cannot open"):
            await asyncio.wait_for((await manager.submit(proc)).wait(), 10)
        record = await HistoryStore(manager.store.store).find(proc.id)
        assert record is not None and record.outcome == "failed"
    manager = manager_for(local_target, Flaky, Family, max_retry_times=0)
    manager.register(BadText)
    async with manager:
        assert manager.procedure_watcher(proc.id) is None
        await asyncio.sleep(0.1)
    assert world.counts["bad/run"] == 1


async def test_a_kept_roots_swept_end_record_is_not_written_again_as_ending_now(local_target: StoreTarget) -> None:
    """A failed root kept for an operator (keep_failed) outlives its end record: retention
    sweeps the record while the keys stay. The next start must not write that end again
    with `ended_at` set to now (a failure long ago shown as today's, after every retention
    period): either no record, or the one with the end's own time."""
    world = World.new()
    proc = ProcedureWithId.new(Flaky({"world": world.name, "name": "f", "fail_times": 1}))
    options: dict[str, Any] = {"keep_failed": True, "history": History(retention=0.5)}
    async with manager_for(local_target, Flaky, Family, max_retry_times=0, gc_interval=0.05, **options) as manager:
        with pytest.raises(ProcedureFailed):
            await (await manager.submit(proc)).wait()
        history = HistoryStore(manager.store.store)
        first = await history.find(proc.id)
        assert first is not None

        async def swept() -> None:
            while await history.find(proc.id) is not None:
                await asyncio.sleep(0.05)

        await asyncio.wait_for(swept(), 10)
    async with manager_for(local_target, Flaky, Family, **options) as manager:
        again = await HistoryStore(manager.store.store).find(proc.id)
    assert again is None or again.ended_at == first.ended_at


class Joiner(JsonProcedure):
    """Spawns one `Flaky` child, then joins it: a child it cannot see it suspends on again
    (as a parent after a crash would); its first join fails, for a reason a resume cures."""

    type_name = "test::runs::Joiner"

    async def execute(self, ctx: Context) -> Status:
        child = ProcedureWithId(
            ProcedureId.parse(self.data["child_id"]), Flaky({"world": self.data["world"], "name": "c"})
        )
        if self.data.get("stage", "spawn") == "spawn":
            self.data["stage"] = "join"
            return Status.suspended([child])
        state = ctx.provider.procedure_state(child.id)
        if state is None:
            return Status.suspended([child])
        self.world.counts["joins"] += 1
        if self.world.counts["joins"] == 1:
            raise ValueError("the join failed once")
        return Status.done("joined")


async def test_a_resume_goes_on_with_the_children_its_run_finished(local_target: StoreTarget) -> None:
    """A resume continues the run from its last step: a child that run finished stays
    finished (its outcome known), and is not run again. (A rewind starts over, and creates
    the children it names anew.)"""
    world = World.new()
    joiner = ProcedureWithId.new(Joiner({"world": world.name, "child_id": str(ProcedureId.random())}))
    async with manager_for(local_target, Flaky, Family, keep_failed=True, max_retry_times=0) as manager:
        manager.register(Joiner)
        with pytest.raises(ProcedureFailed, match="failed once"):
            await (await manager.submit(joiner)).wait()
        assert await (await manager.resume(joiner.id)).wait() == "joined"
    assert world.counts["c/1"] == 1


async def test_a_restart_never_writes_back_an_end_record_retention_swept(local_target: StoreTarget) -> None:
    """A restart records the ended run's end if nobody did, with the `.commit`'s time; a
    record that retention swept (its `.commit` older than the retention) stays swept."""
    world = World.new()
    flaky = ProcedureWithId.new(Flaky({"world": world.name, "name": "f", "fail_times": 1}))
    async with manager_for(local_target, Flaky, Family, keep_failed=True, max_retry_times=0) as manager:
        with pytest.raises(ProcedureFailed):
            await (await manager.submit(flaky)).wait()
        history = HistoryStore(manager.store.store, manager.store.parent_path)
        (record,) = await history.list()
        await manager.store.store.batch_delete([history.key(record)])  # as the sweep does
        long_ago = time.time() - 30 * 24 * 3600
        for key in await manager.store.store.walk(f"procedure/{flaky.id}/"):
            os.utime(os.path.join(local_target.url, key), (long_ago, long_ago))
        assert await (await manager.rewind(flaky.id, 0)).wait() == "f"
        assert [r.run for r in await history.list()] == [2]


async def test_a_rewind_written_while_a_start_deletes_the_ended_run_survives_the_deletions_retry(
    local_target: StoreTarget,
) -> None:
    """A failed root's deletion failed (keep_failed off), so the next start deletes its keys.
    An operator rewinds it while that deletion runs: the copy lands in the folder after the
    deletion listed it. The deletion's folder delete then fails once, and its retry lists the
    folder again, where only the copy is left: the copy is the rewound run's, not the ended
    run's, so it stays, and the run the operator asked for runs and ends."""
    world = World.new()
    proc = ProcedureWithId.new(Steps({"world": world.name, "name": "r", "steps": 4, "fail_at": 2}))
    folder = f"procedure/{proc.id}/"
    undeletable = [Fault("transient", kinds=frozenset({"batch_delete"}), key=f"{folder}*")]
    async with manager_for(FaultyStore(open_state_store(local_target.url), faults=undeletable)) as first:
        with pytest.raises(ProcedureFailed):
            await (await first.submit(proc)).wait()
        history = HistoryStore(first.store.store)
        assert await _end_records(history, proc.id) == [1]
    folder_fails_once = Fault("transient", kinds=frozenset({"delete"}), key=folder, times=1)
    store = HeldOnce(open_state_store(local_target.url), "batch_delete", folder, [folder_fails_once])
    next_start = manager_for(store, request_poll_interval=0.02)
    async with Client(local_target.url, poll_interval=0.02) as client:
        starting = asyncio.create_task(next_start.start())
        try:
            await asyncio.wait_for(store.reached.wait(), 10)
            await client.rewind(proc.id, 1, "run it again from step 1")
            store.release.set()
            await asyncio.wait_for(starting, 10)
            history = HistoryStore(next_start.store.store)
            async with asyncio.timeout(10):
                while await _end_records(history, proc.id) != [1, 2]:
                    await asyncio.sleep(0.02)
        finally:
            await next_start.stop()
    assert world.counts["r/1"] == 2  # step 1 ran again, in the rewound run
