"""Every store-write backoff wakes on the procedure's cancel or fail request (issue 32, item
11): a request stored while a write backs off is honoured within about a poll interval, not
after the backoff. In virtual time (`SimulatedLoop`), so that a 1,000 s backoff costs none:
each test gives the procedure `HONOURED_WITHIN` virtual seconds from the request to end,
and fails with `TimeoutError` if it waits out the backoff instead."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from procstore import ProcedureFailed, ProcedureManager, ProcedureStateKind, ProcedureWithId, RetryBudget
from procstore.store import open_state_store
from procstore.store.requests import OperatorRequest
from procstore.testing import Fault, FaultyStore, run_simulated
from tests.procedures import Steps, Undoable, World
from tests.support import StoreTarget, manager_for, store_targets

BACKOFF = 1000.0
POLL = 1.0
HONOURED_WITHIN = 3 * POLL

real_store = store_targets("local", "s3")


def manager_on(store: FaultyStore, **options: Any) -> ProcedureManager:
    settings: dict[str, Any] = {
        "retry_delay": BACKOFF,
        "max_retry_delay": BACKOFF,
        "max_retry_times": 5,
        "request_poll_interval": POLL,
        **options,
    }
    return manager_for(store, **settings)


async def cancel_during_backoff(
    failing_key: str,
    procedure: ProcedureWithId,
    *,
    from_another_process: bool,
    until: ProcedureStateKind,
    failures: int | None = None,
    **options: Any,
) -> None:
    """Fail the writes of `failing_key` (`failures` times; None: every one), cancel once the
    procedure waits out a backoff; it must end within `HONOURED_WITHIN` of the cancel."""
    store = FaultyStore(open_state_store(f"memory://{procedure.id}/"))
    store.plan.faults.append(Fault("transient", key=f"procedure/*/{failing_key}", times=failures))
    async with manager_on(store, **options) as manager:
        watcher = await manager.submit(procedure)
        pid = procedure.id

        async def backing_off() -> None:
            failed_once = failing_key == "none" or store.plan.faults[0].fired  # "none": rollback() fails
            while (s := manager.procedure_state(pid)) is None or s.kind is not until or not failed_once:
                await asyncio.sleep(0.01)
                failed_once = failing_key == "none" or store.plan.faults[0].fired

        await asyncio.wait_for(backing_off(), BACKOFF / 2)
        await asyncio.sleep(1.0)  # well into the backoff
        async with asyncio.timeout(HONOURED_WITHIN):
            if from_another_process:  # `procstore cancel`, say: found by the watch of requests/
                await manager.store.requests.put(pid, OperatorRequest.new("cancel", "operator"))
            else:
                await manager.cancel(pid, "operator")
            with pytest.raises(ProcedureFailed, match="cancelled by an operator|failed at step"):
                await watcher.wait()


@pytest.mark.parametrize("from_another_process", [False, True], ids=["api", "store"])
@pytest.mark.parametrize(
    ("failing_key", "data"),
    [
        ("0000000001.step", {"steps": 3}),  # a step's write
        ("0000000003.commit", {"steps": 3}),  # a success's commit
    ],
    ids=["step-write", "commit"],
)
def test_a_cancel_stored_while_a_write_backs_off_ends_the_procedure_within_a_poll_interval(
    failing_key: str, data: dict[str, Any], from_another_process: bool
) -> None:
    world = World.new()
    procedure = ProcedureWithId.new(Steps({"world": world.name, **data}))
    run_simulated(
        cancel_during_backoff(
            failing_key, procedure, from_another_process=from_another_process, until=ProcedureStateKind.RETRYING
        )
    )


@pytest.mark.parametrize(
    ("failing_key", "data", "until"),
    [
        ("0000000002.rollback", {"steps": 3, "fail_at": 1}, ProcedureStateKind.PREPARE_ROLLBACK),  # its rollback key
        ("0000000003.commit", {"steps": 3, "fail_at": 1}, ProcedureStateKind.RETRYING),  # the commit above it
        ("none", {"steps": 3, "fail_at": 1, "rollback_failures": 1}, ProcedureStateKind.ROLLING_BACK),  # rollback()
    ],
    ids=["rollback-key", "failure-commit", "rollback"],
)
def test_a_request_stored_while_a_failure_backs_off_ends_that_backoff(
    failing_key: str, data: dict[str, Any], until: ProcedureStateKind
) -> None:
    """A failing procedure's writes go on (the request asks for what they do); the backoff
    under way ends, once, so the failure is recorded as soon as the store takes it (here
    the write, or `rollback()`, fails once)."""
    world = World.new()
    procedure = ProcedureWithId.new(Undoable({"world": world.name, **data}))
    run_simulated(cancel_during_backoff(failing_key, procedure, from_another_process=True, until=until, failures=1))


@pytest.mark.parametrize("from_another_process", [False, True], ids=["api", "store"])
def test_a_cancel_stored_while_a_submits_write_backs_off_ends_the_backoff(from_another_process: bool) -> None:
    """The submit's first write landed with its answer lost, so an operator can cancel the
    procedure; the submit's retry then finds its own bytes at once, and the procedure fails
    before its first step."""

    async def main() -> None:
        world = World.new()
        procedure = ProcedureWithId.new(Steps({"world": world.name, "steps": 3}))
        store = FaultyStore(open_state_store(f"memory://{procedure.id}/"))
        store.plan.faults.append(Fault("transient", key="procedure/*/0000000000.step", when="after", times=1))
        async with manager_on(store) as manager:
            submitting = asyncio.ensure_future(manager.submit(procedure))
            await asyncio.sleep(1.0)  # the first attempt landed, its answer lost: a backoff
            assert not submitting.done()
            async with asyncio.timeout(HONOURED_WITHIN):
                if from_another_process:
                    await manager.store.requests.put(procedure.id, OperatorRequest.new("cancel", "operator"))
                else:
                    await manager.cancel(procedure.id, "operator")
                watcher = await submitting
                with pytest.raises(ProcedureFailed, match="cancelled by an operator"):
                    await watcher.wait()
            assert world.counts["steps/0"] == 0

    run_simulated(main())


def test_a_cancel_ends_a_wait_for_the_retry_budget_too() -> None:
    """In an outage the retry budget's queue is the longest part of a backoff: here the
    second retry waits about 1,000 s for its token."""
    world = World.new()
    procedure = ProcedureWithId.new(Steps({"world": world.name, "steps": 3}))
    budget = RetryBudget(rate=0.001, burst=1)
    run_simulated(
        cancel_during_backoff(
            "0000000001.step",
            procedure,
            from_another_process=True,
            until=ProcedureStateKind.RETRYING,
            retry_delay=0.01,
            max_retry_delay=0.01,
            retry_budget=budget,
        )
    )
    assert budget.waited > BACKOFF / 2  # the cancel came while a retry waited for a token


def test_stop_ends_a_writes_backoff_at_once() -> None:
    async def main() -> None:
        world = World.new()
        procedure = ProcedureWithId.new(Steps({"world": world.name, "steps": 3}))
        store = FaultyStore(open_state_store(f"memory://{procedure.id}/"))
        store.plan.faults.append(Fault("transient", key="procedure/*/0000000001.step"))
        manager = manager_on(store)
        await manager.start()
        await manager.submit(procedure)
        await asyncio.sleep(1.0)  # backing off the write of step 1
        async with asyncio.timeout(HONOURED_WITHIN):
            await manager.stop()

    run_simulated(main())


async def test_a_cancel_while_a_step_write_backs_off_on_a_real_store_ends_the_procedure(
    real_store: StoreTarget,
) -> None:
    """The same on the stores' own clocks and threads: the procedure ends long before the
    first of its 1,000 s backoffs would."""
    world = World.new()
    procedure = ProcedureWithId.new(Steps({"world": world.name, "steps": 3}))
    store = FaultyStore(open_state_store(real_store.url, real_store.storage_options))
    store.plan.faults.append(Fault("transient", key="*procedure/*/0000000001.step"))
    try:
        async with manager_on(store, request_poll_interval=0.05) as manager:
            watcher = await manager.submit(procedure)
            while store.plan.faults[0].fired == 0:
                await asyncio.sleep(0.01)
            await manager.cancel(procedure.id, "operator")
            with pytest.raises(ProcedureFailed, match="cancelled by an operator"):
                await asyncio.wait_for(watcher.wait(), 30)
    finally:
        await store.inner.close()
