"""The explorer finds a step that is not idempotent, and passes the same step made idempotent."""

from __future__ import annotations

import contextlib
import json
import uuid
from typing import Any

from hypothesis import given, settings

from procstore import Context, Procedure, ProcedureManager, ProcedureWithId, Status, StoreError
from procstore.store import StateStore
from procstore.testing import CrashExplorer, Fault, Scenario
from procstore.testing.strategies import fault_plans

BALANCES: dict[str, int] = {}
APPLIED: set[str] = set()


class Deposit(Procedure):
    """Adds to a balance, then finishes. `idempotent` guards the add with a transaction id."""

    type_name = "bank::Deposit"

    def __init__(self, data: dict[str, Any]) -> None:
        self.data = data

    def dump(self) -> str:
        return json.dumps(self.data)

    async def execute(self, ctx: Context) -> Status:
        if not self.data.get("deposited"):
            txn = f"{ctx.procedure_id}/deposit"
            if not self.data["idempotent"] or txn not in APPLIED:
                BALANCES[self.data["account"]] = BALANCES.get(self.data["account"], 0) + self.data["amount"]
                APPLIED.add(txn)
            self.data["deposited"] = True
            return Status.executing()
        return Status.done(BALANCES[self.data["account"]])


class Deposits(Scenario):
    def __init__(self, idempotent: bool) -> None:
        self.name = f"deposit (idempotent={idempotent})"
        self.idempotent = idempotent

    async def prepare(self, store: StateStore) -> None:
        BALANCES.clear()
        APPLIED.clear()

    def attach(self, manager: ProcedureManager, store: StateStore) -> None:
        manager.register(Deposit)

    async def procedures(self, store: StateStore) -> list[ProcedureWithId]:
        return [ProcedureWithId.new(Deposit({"account": "a", "amount": 10, "idempotent": self.idempotent}))]

    async def snapshot(self, store: StateStore) -> object:
        return dict(BALANCES)


def memory_url(n: int) -> str:
    return f"memory://explorer-{uuid.uuid4().hex}/"


async def test_finds_the_step_that_is_not_idempotent() -> None:
    report = await CrashExplorer(Deposits(idempotent=False), memory_url).explore()
    assert not report.ok
    assert report.operations == 7 and report.explored == 14  # 3 writes, the end record, then 3 deletions
    [failure] = report.failures
    assert (failure.point.index, failure.point.when) == (1, "before")  # deposited, then killed before storing it
    assert "a: 20 instead of 10" in failure.problem
    said = str(report)
    assert "1 failed" in said and "before operation 1: put_if_absent procedure/" in said and ", step 1)" in said
    assert 'replay: await explorer.explore(only=[CrashPoint(1, "before")])' in said.replace("'", '"')


async def test_passes_the_idempotent_version_in_both_modes() -> None:
    report = await CrashExplorer(Deposits(idempotent=True), memory_url).explore(double_execution=True)
    report.assert_ok()
    assert report.explored == 15


async def test_double_execution_finds_it_too() -> None:
    explorer = CrashExplorer(Deposits(idempotent=False), memory_url)
    report = await explorer.explore(double_execution=True)
    assert any(failure.point.index < 0 for failure in report.failures)


async def test_a_reported_point_replays_alone() -> None:
    from procstore.testing import CrashPoint

    report = await CrashExplorer(Deposits(idempotent=False), memory_url).explore(only=[CrashPoint(1, "before")])
    assert report.explored == 1 and len(report.failures) == 1


@given(plan=fault_plans(crashes=False))
@settings(max_examples=10, deadline=None)
def test_transient_faults_and_delays_never_change_the_outcome(plan: list[Fault]) -> None:
    import asyncio

    from procstore.store import open_state_store
    from procstore.testing import FaultyStore

    async def run() -> object:
        BALANCES.clear()
        APPLIED.clear()
        store = FaultyStore(open_state_store(memory_url(0)), faults=plan)
        manager = ProcedureManager(store, retry_delay=0.001, max_retry_delay=0.002, max_retry_times=5)
        manager.register(Deposit)
        async with manager:
            watcher = await manager.submit(
                ProcedureWithId.new(Deposit({"account": "a", "amount": 5, "idempotent": True}))
            )
            return await watcher.wait()

    # More transient faults on the first write than submit's retries make it refuse: nothing ran.
    with contextlib.suppress(StoreError):
        assert asyncio.run(run()) == 5
    assert BALANCES in ({"a": 5}, {})
