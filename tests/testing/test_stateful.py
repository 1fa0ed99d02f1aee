"""Property-based proof: random schedules of submits, crashes, transient faults and restarts."""

from __future__ import annotations

import uuid
import weakref

import pytest
from hypothesis import settings

from procstore import ProcedureId, ProcedureManager, ProcedureWithId
from procstore.store import StateStore, open_state_store
from procstore.testing.stateful import ProcedureStateMachine
from procstore_machines.create_table import new_create_table
from procstore_machines.create_table import register as register_create_table
from procstore_machines.region_migration import (
    RegionMigration,
    SimCluster,
    VolatileContext,
    check_cluster,
    new_migration,
)
from procstore_machines.region_migration.cluster import region_id
from tests.procedures import Steps, Undoable, World, register_all


class StepsAndRollbacks(ProcedureStateMachine):
    """Plain multi-step procedures and ones that fail and roll back, on one shared world."""

    def __init__(self) -> None:
        self.world = World.new()
        self.expected: dict[ProcedureId, tuple[str, int, bool]] = {}
        super().__init__()

    def attach(self, manager: ProcedureManager, store: StateStore) -> None:
        register_all(manager)

    def new_procedure(self, seed: int, store: StateStore) -> ProcedureWithId:
        name = f"p{seed}-{uuid.uuid4().hex[:6]}"
        steps = 1 + seed % 4
        fails = seed % 3 == 0 and steps > 1
        data = {"world": self.world.name, "name": name, "steps": steps}
        procedure = Undoable({**data, "fail_at": steps - 1}) if fails else Steps(data)
        pwid = ProcedureWithId.new(procedure)
        self.expected[pwid.id] = (name, steps, fails)
        return pwid

    def check_world(self, outcomes: dict[ProcedureId, str]) -> None:
        for pid, outcome in outcomes.items():
            name, steps, fails = self.expected[pid]
            mine = {e for e in self.world.effects if e.startswith(f"{name}/")}
            if fails:
                assert outcome == "failed" and mine == {f"{name}/rolled-back"}, (name, outcome, mine)
            else:
                assert outcome == "done" and mine == {f"{name}/{i}" for i in range(steps)}, (name, outcome, mine)


StepsAndRollbacks.TestCase.settings = settings(StepsAndRollbacks.TestCase.settings, max_examples=15)
TestStepsAndRollbacks = StepsAndRollbacks.TestCase


class CreateTables(ProcedureStateMachine):
    """`machines/create_table` under random crashes: the cluster lives in the same store."""

    def __init__(self) -> None:
        self.clusters: weakref.WeakKeyDictionary[StateStore, SimCluster] = weakref.WeakKeyDictionary()
        self.tables: dict[ProcedureId, int] = {}
        super().__init__()

    def cluster(self, store: StateStore) -> SimCluster:
        if store not in self.clusters:
            self.clusters[store] = SimCluster(store, [1, 2, 3])
        return self.clusters[store]

    def attach(self, manager: ProcedureManager, store: StateStore) -> None:
        register_create_table(manager, self.cluster(store))

    def new_procedure(self, seed: int, store: StateStore) -> ProcedureWithId:
        table_id = 100 + len(self.tables)
        leaders = [1 + (seed >> (2 * i)) % 3 for i in range(1 + seed % 3)]
        pwid = ProcedureWithId.new(new_create_table(self.cluster(store), f"t{table_id}", table_id, leaders))
        self.tables[pwid.id] = table_id
        return pwid

    def check_world(self, outcomes: dict[ProcedureId, str]) -> None:
        async def read() -> None:
            store = open_state_store(self.url)
            assert await check_cluster(store) == []
            metadata = SimCluster(store, [1]).metadata
            for pid, outcome in outcomes.items():
                info = await metadata.get_table_info(self.tables[pid])
                assert outcome == "done" and (info or {}).get("state") == "ready", (pid, outcome, info)

        self._run(read())


CreateTables.TestCase.settings = settings(CreateTables.TestCase.settings, max_examples=10)
TestCreateTables = CreateTables.TestCase


class MigrateRegions(ProcedureStateMachine):
    """`machines/region_migration` under random crashes; migrations may race and abort."""

    def __init__(self) -> None:
        self.clusters: weakref.WeakKeyDictionary[StateStore, SimCluster] = weakref.WeakKeyDictionary()
        super().__init__()
        self._run(SimCluster(open_state_store(self.url), [1, 2, 3]).create_table(7, {1: 1, 2: 2, 3: 3}, {}))

    def cluster(self, store: StateStore) -> SimCluster:
        if store not in self.clusters:
            self.clusters[store] = SimCluster(store, [1, 2, 3])
        return self.clusters[store]

    def attach(self, manager: ProcedureManager, store: StateStore) -> None:
        RegionMigration.register_with(manager, lambda _p: VolatileContext(self.cluster(store)))

    def new_procedure(self, seed: int, store: StateStore) -> ProcedureWithId:
        region = region_id(7, 1 + seed % 3)
        route = self._run(SimCluster(open_state_store(self.url), [1]).metadata.get_route(7))
        assert route is not None
        leader = next(r.leader for r in route.regions if r.region_id == region)
        target = 1 + (leader + seed // 3) % 3
        target = target if target != leader else 1 + leader % 3
        return ProcedureWithId.new(new_migration(self.cluster(store), [region], leader, target))

    def check_world(self, outcomes: dict[ProcedureId, str]) -> None:
        assert self._run(check_cluster(open_state_store(self.url))) == []


MigrateRegions.TestCase.settings = settings(MigrateRegions.TestCase.settings, max_examples=10)
TestMigrateRegions = MigrateRegions.TestCase


def test_schedules_leave_no_task_pending(caplog: pytest.LogCaptureFixture) -> None:
    """Every manager life is stopped, so asyncio never reports a task destroyed while
    pending (a `procstore:gc` task, say) when a schedule's loop closes."""
    import gc
    import logging

    from hypothesis.stateful import run_state_machine_as_test

    caplog.set_level(logging.ERROR, logger="asyncio")
    run_state_machine_as_test(
        StepsAndRollbacks, settings=settings(max_examples=8, stateful_step_count=15, deadline=None)
    )
    gc.collect()
    destroyed = [r for r in caplog.records if "Task was destroyed but it is pending" in r.getMessage()]
    assert destroyed == [], destroyed[:3]


class FailingCheck(StepsAndRollbacks):
    def check_world(self, outcomes: dict[ProcedureId, str]) -> None:
        raise AssertionError("the user's check found a planted bug")


def test_a_failing_check_still_stops_the_manager_before_the_loop_closes(caplog: pytest.LogCaptureFixture) -> None:
    import gc
    import logging

    caplog.set_level(logging.ERROR, logger="asyncio")
    machine = FailingCheck()
    machine.schedule(0)
    machine.submit(2)
    machine.wait_for_quiescence()
    with pytest.raises(AssertionError, match="planted bug"):
        machine.teardown()
    assert machine.loop.is_closed()
    del machine
    gc.collect()
    destroyed = [r for r in caplog.records if "Task was destroyed but it is pending" in r.getMessage()]
    assert destroyed == [], destroyed[:3]
