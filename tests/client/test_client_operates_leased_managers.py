"""`procstore.Client` from a process that holds no lease: two managers share a store under a
lease, and a client (not a manager) cancels, resumes, waits, reads results and history."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from procstore import (
    Client,
    Lease,
    OperationRefused,
    ProcedureFailed,
    ProcedureManager,
    ProcedureNotEnded,
    ProcedureNotFound,
    ProcedureWithId,
)
from procstore._runtime.leadership import lease_key
from procstore.store.history import HistoryStore
from procstore.store.open import open_state_store
from tests.procedures import Undoable, World
from tests.runtime.helpers import blocker, eventually, steps
from tests.support import StoreTarget, manager_for, store_targets

target = store_targets("memory", "local", "s3")


def leased(target: StoreTarget, holder: str, **options: Any) -> ProcedureManager:
    # Requests are seen within a second (the cancel interrupts the running step then): long
    # enough for the client to see its cancel pending first.
    return manager_for(
        target, lease=Lease(ttl=3.0, holder=holder), keep_failed=True, request_poll_interval=1.0, **options
    )


def client_of(target: StoreTarget) -> Client:
    return Client(target.url, target.storage_options, poll_interval=0.05)


async def lease_value(target: StoreTarget) -> bytes | None:
    store = open_state_store(target.url, target.storage_options)
    try:
        return await store.get(lease_key(""))
    finally:
        await store.close()


async def test_a_client_cancels_resumes_waits_and_reads_history_beside_two_leased_managers(
    target: StoreTarget,
) -> None:
    world = World.new()
    gate, opened = blocker()
    async with leased(target, "cp-1:7000") as first, leased(target, "cp-2:7000") as second, client_of(target) as client:
        await first.wait_until_leading()
        assert not second.is_leader
        # Held uninterruptible: the cancel stays pending (and readable) until the gate opens,
        # however soon the leader's watch sees it.
        procedure = steps(world, 3, block=gate, block_at=1, hold=True)
        pid = procedure.id
        await first.submit(procedure)
        await eventually(lambda: world.counts["steps/0"] == 1)

        live = await client.get(pid)
        assert (live.status, live.type_name, live.run, live.is_ended) == ("unfinished", "test::Steps", 1, False)
        assert live.doing == "running" and live.step is not None and live.updated_at is not None
        assert live.started is not None and live.started.kind == "submit"
        assert live.started_at is not None and live.duration is not None and live.pending is None
        with pytest.raises(ProcedureNotEnded):
            await client.result(pid)
        with pytest.raises(TimeoutError):
            await client.wait(pid, timeout=0.1)

        await client.cancel(pid, reason="the tenant asked")
        await client.cancel(pid, reason="asked twice")  # the first request stands
        pending = (await client.get(pid)).pending
        assert pending is not None and (pending.kind, pending.reason) == ("cancel", "the tenant asked")
        assert pending.by and pending.at
        with pytest.raises(OperationRefused, match="already has a request|has ended"):
            await client.fail(pid, reason="another kind")

        opened.set()
        with pytest.raises(ProcedureFailed, match="the tenant asked"):
            await client.wait(pid, timeout=20)
        cancelled = await client.get(pid)
        assert (cancelled.status, cancelled.outcome, cancelled.pending) == ("cancelled", "cancelled", None)
        assert cancelled.ended_at is not None

        await client.resume(pid, reason="the tenant changed their mind")
        assert await client.wait(pid, timeout=20) == "steps done"
        assert await client.result(pid) == "steps done"
        assert world.counts["steps/2"] == 1

        records = await client.history(procedure_id=pid)
        assert [(r.run, r.outcome) for r in records] == [(2, "done"), (1, "cancelled")]
        done, ended = records
        assert done.output == '"steps done"'
        assert done.started is not None
        assert (done.started.kind, done.started.reason) == ("resume", "the tenant changed their mind")
        assert done.started.by and done.started.at
        assert ended.ended_by is not None
        assert (ended.ended_by.kind, ended.ended_by.reason) == ("cancel", "the tenant asked")
        assert ended.started is not None and ended.started.kind == "submit"

        with pytest.raises(OperationRefused, match="finished successfully|not in the store"):
            await client.rewind(pid, 0, reason="once more")
        with pytest.raises(OperationRefused, match="has ended"):
            await client.cancel(pid)
        holder = await lease_value(target) or b""
        assert b"cp-1:7000" in holder or b"cp-2:7000" in holder, "the client took no part in the election"


async def test_a_client_rewinds_a_cancelled_procedure_with_a_reason(target: StoreTarget) -> None:
    world = World.new()
    gate, opened = blocker()
    async with leased(target, "cp-1:7000") as leader, client_of(target) as client:
        await leader.wait_until_leading()
        procedure = steps(world, 3, block=gate, block_at=1)
        await leader.submit(procedure)
        await eventually(lambda: world.counts["steps/0"] == 1)
        await client.cancel(str(procedure.id))
        opened.set()
        with pytest.raises(ProcedureFailed):
            await client.wait(procedure.id, timeout=20)
        await client.rewind(procedure.id, 0, reason="redo from the start")
        assert await client.wait(procedure.id, timeout=20) == "steps done"
        newest = (await client.history(procedure_id=procedure.id, limit=1))[0]
        assert newest.started is not None
        assert (newest.started.kind, newest.started.to_step, newest.started.reason) == (
            "rewind",
            0,
            "redo from the start",
        )
        assert world.counts["steps/0"] == 2


async def test_an_unknown_id_is_not_found_and_a_run_of_history_is_enough_to_answer(
    target: StoreTarget, tmp_path: Path
) -> None:
    world = World.new()
    async with manager_for(target) as manager, client_of(target) as client:
        with pytest.raises(ProcedureNotFound):
            await client.get("00000000-0000-4000-8000-000000000000")
        procedure = steps(world, 2)
        assert await (await manager.submit(procedure)).wait() == "steps done"
        await eventually(lambda: True)

        # Done and deleted: history alone answers.
        async def gone() -> bool:
            return not await manager.store.procedure_keys(procedure.id)

        for _ in range(200):
            if await gone():
                break
            await asyncio.sleep(0.01)
        status = await client.get(procedure.id)
        assert (status.status, status.step, status.type_name) == ("done", None, "test::Steps")
        assert await client.result(procedure.id) == "steps done"
        assert await client.wait(procedure.id, timeout=5) == "steps done"
        assert [r.id for r in await HistoryStore(manager.store.store).list()] == [str(procedure.id)]


async def test_a_cancelled_procedure_that_rolled_back_is_not_resumed_but_rewound(target: StoreTarget) -> None:
    world = World.new()
    gate, opened = blocker()
    async with (
        manager_for(target, keep_failed=True, request_poll_interval=0.05) as manager,
        client_of(target) as client,
    ):
        procedure = ProcedureWithId.new(Undoable({"world": world.name, "steps": 3, "block": gate, "block_at": 1}))
        await manager.submit(procedure)
        await eventually(lambda: world.counts["steps/0"] == 1)
        await client.cancel(procedure.id, reason="undo it")
        with pytest.raises(ProcedureFailed, match="undo it"):
            await client.wait(procedure.id, timeout=20)
        # `wait()` reports a failed root from its keys; its end record may land a moment later.
        async with asyncio.timeout(10):
            while not (records := await client.history(procedure_id=procedure.id)):
                await asyncio.sleep(0.02)
        (record,) = records
        assert (record.outcome, record.rolled_back) == ("cancelled", True)
        with pytest.raises(OperationRefused, match="cancelled and rolled back"):
            await client.resume(procedure.id)
        opened.set()
        await client.rewind(procedure.id, 0, reason="again, from the start")
        assert await client.wait(procedure.id, timeout=20) == "steps done"
