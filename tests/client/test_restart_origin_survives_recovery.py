"""Who resumed or rewound a procedure, when and why, reaches the new run's history record
even when the run is started by a manager's recovery (none ran when the operator asked,
or the leader died): the copy carries it, the nudge may be gone."""

from __future__ import annotations

import asyncio
import os
import time
import uuid
from pathlib import Path

import pytest

from procstore import Client, Context, Procedure, ProcedureFailed, ProcedureWithId, Status
from procstore.store import open_state_store
from procstore.store.settings import SettingsStore, StoreSettings
from procstore.testing import MemoryStore
from tests.runtime.test_operations import Flaky, failed_and_kept, manager_on
from tests.support import StoreTarget, killed_before_its_end_record, manager_for, store_targets

target = store_targets("local", "s3")


async def test_a_rewind_stored_while_no_manager_runs_keeps_its_reason(target: StoreTarget) -> None:
    async with manager_on(target.url, storage_options=target.storage_options, keep_failed=True) as manager:
        pid, name = await failed_and_kept(manager)
    Flaky.broken.discard(name)
    async with Client(target.url, target.storage_options, poll_interval=0.05) as client:
        await client.rewind(pid, 0, reason="bad input fixed")
        async with manager_on(target.url, storage_options=target.storage_options, keep_failed=True):
            assert await client.wait(pid, timeout=20) == name
        newest, older = await client.history(procedure_id=pid)
        assert (newest.run, newest.outcome) == (2, "done")
        assert newest.started is not None, "recovery ran the copy: its origin must come from the copy"
        assert (newest.started.kind, newest.started.reason, newest.started.to_step) == ("rewind", "bad input fixed", 0)
        assert newest.started.at is not None and newest.started.by
        assert older.started is not None and older.started.kind == "submit"


async def test_a_later_rewind_to_an_earlier_runs_step_does_not_inherit_that_runs_origin(target: StoreTarget) -> None:
    async with manager_on(target.url, storage_options=target.storage_options, keep_failed=True) as manager:
        pid, _ = await failed_and_kept(manager)
    async with Client(target.url, target.storage_options, poll_interval=0.05) as client:
        await client.rewind(pid, 2, reason="first")
        copy = (await client.get(pid)).step
        assert copy is not None
        async with manager_on(target.url, storage_options=target.storage_options, keep_failed=True):
            with pytest.raises(ProcedureFailed):
                await client.wait(pid, timeout=20)
        await client.rewind(pid, copy, reason="second")  # the first rewind's copy: run 2's
        async with manager_on(target.url, storage_options=target.storage_options, keep_failed=True):
            with pytest.raises(ProcedureFailed):
                await client.wait(pid, timeout=20)
        runs = await client.history(procedure_id=pid)
        assert [(r.run, r.started and r.started.reason) for r in runs] == [(3, "second"), (2, "first"), (1, "")]


async def test_an_end_record_written_from_the_keys_says_how_the_run_started(target: StoreTarget) -> None:
    """A manager killed between the run's `.commit` and its end record: the next start
    writes the record from the keys, with the origin the run's messages carry."""
    async with manager_on(target.url, storage_options=target.storage_options, keep_failed=True) as manager:
        pid, _ = await failed_and_kept(manager)
    async with Client(target.url, target.storage_options, poll_interval=0.05) as client:
        await client.rewind(pid, 0, reason="once more")
        async with manager_on(target.url, storage_options=target.storage_options, keep_failed=True) as manager:
            with pytest.raises(ProcedureFailed):
                await client.wait(pid, timeout=20)
            await manager.store.store.batch_delete([manager.store.history.run_key(pid, 2)])  # as if never written
        assert [r.run for r in await client.history(procedure_id=pid)] == [1]
        async with manager_on(target.url, storage_options=target.storage_options, keep_failed=True):
            newest, _ = await client.history(procedure_id=pid)
        assert newest.run == 2 and newest.started is not None
        assert (newest.started.kind, newest.started.reason) == ("rewind", "once more")


class Blocks(Procedure):
    """A step that waits until an operator interrupts it."""

    type_name = "tests::origin::Blocks"

    async def execute(self, ctx: Context) -> Status:
        await asyncio.sleep(3600)
        return Status.done()

    def dump(self) -> str:
        return ""

    @classmethod
    def load(cls, data: str) -> Blocks:
        return cls()


@pytest.mark.parametrize("kind", ["cancel", "fail"])
async def test_an_end_record_written_from_the_keys_says_which_request_ended_the_run(kind: str) -> None:
    """The leader died between the `.commit` of a run an operator cancelled and its end record:
    the record the next manager wrote from the keys said `failed`, with no `ended_by`, though
    the request (who, when, why) is deleted only after the keys."""
    store = MemoryStore(f"origin-ended-by-{uuid.uuid4().hex[:8]}")
    procedure = ProcedureWithId.new(Blocks())
    async with Client(store, poll_interval=0.05) as client:
        request = client.cancel if kind == "cancel" else client.fail
        await killed_before_its_end_record(store, procedure, Blocks, then=lambda: request(procedure.id, "INC-42"))
        async with manager_for(store, Blocks):
            with pytest.raises(ProcedureFailed, match="INC-42"):
                await client.wait(procedure.id, timeout=10)
        (record,) = await client.history(procedure_id=procedure.id)
    assert record.outcome == ("cancelled" if kind == "cancel" else "failed")
    assert record.ended_by is not None and (record.ended_by.kind, record.ended_by.reason) == (kind, "INC-42")


class Breaks(Procedure):
    """Fails at its first step."""

    type_name = "tests::origin::Breaks"

    async def execute(self, ctx: Context) -> Status:
        raise ValueError("broken for good")

    def dump(self) -> str:
        return ""

    @classmethod
    def load(cls, data: str) -> Breaks:
        return cls()


async def test_wait_answers_a_failure_whose_end_record_no_manager_writes() -> None:
    """A root that failed, its leader killed before its end record, no manager running:
    `get` said `failed` while `wait` waited (forever without a timeout) for that record."""
    store = MemoryStore(f"origin-no-record-{uuid.uuid4().hex[:8]}")
    procedure = ProcedureWithId.new(Breaks())
    await killed_before_its_end_record(store, procedure, Breaks)
    async with Client(store, poll_interval=0.05) as client:
        assert (await client.get(procedure.id)).status == "failed"
        with pytest.raises(ProcedureFailed, match="broken for good"):
            await client.wait(procedure.id, timeout=5)


async def test_a_rewind_of_a_cancelled_run_without_a_record_keeps_who_cancelled_it() -> None:
    """The rewind deleted the cancel request, then wrote the ended run's record from its
    keys (its leader died before writing it): `failed`, no `ended_by`."""
    store = MemoryStore(f"origin-rewind-ended-by-{uuid.uuid4().hex[:8]}")
    procedure = ProcedureWithId.new(Blocks())
    async with Client(store, poll_interval=0.05) as client:
        await killed_before_its_end_record(store, procedure, Blocks, then=lambda: client.cancel(procedure.id, "INC-43"))
        await client.rewind(procedure.id, 0, "run it again")
        (record,) = await client.history(procedure_id=procedure.id)
    assert (record.run, record.outcome) == (1, "cancelled")
    assert record.ended_by is not None and (record.ended_by.kind, record.ended_by.reason) == ("cancel", "INC-43")


async def test_a_rewind_writes_an_old_ended_runs_record_while_the_stores_settings_keep_it(tmp_path: Path) -> None:
    """The copy writes the ended run's missing record unless history would have swept it:
    by the store's retention (here 30 days), not the default 7."""
    store = open_state_store(str(tmp_path))
    procedure = ProcedureWithId.new(Breaks())
    await killed_before_its_end_record(store, procedure, Breaks)
    (commit,) = (tmp_path / "procedure" / str(procedure.id)).glob("*.commit")
    ten_days_ago = time.time() - 10 * 24 * 3600
    os.utime(commit, (ten_days_ago, ten_days_ago))
    async with Client(str(tmp_path), poll_interval=0.05) as client:
        await SettingsStore(store).write(StoreSettings(history_retention=30 * 24 * 3600.0))
        await client.rewind(procedure.id, 0, "run it again")
        (record,) = await client.history(procedure_id=procedure.id)
    await store.close()
    assert (record.run, record.outcome) == (1, "failed")
