"""The explorer on scenarios of more than one procedure: rollback from every step, where
only the failed procedure rolls back and the others finish."""

from __future__ import annotations

import json
import uuid
from typing import Any, ClassVar

from procstore import Context, Lease, Procedure, ProcedureManager, ProcedureWithId, Status
from procstore.store import StateStore
from procstore.testing import CrashExplorer, Scenario, run_simulated

BUILT: dict[str, int] = {}


def fresh(n: int) -> str:
    return f"memory://many-{uuid.uuid4().hex}/"


class Build(Procedure):
    """Three steps, each builds one thing named after the procedure; rollback takes them away."""

    type_name = "tests::ManyBuild"
    rollback_supported = True
    forgetful: ClassVar[bool] = False

    def __init__(self, data: dict[str, Any]) -> None:
        self.data = data

    async def execute(self, ctx: Context) -> Status:
        BUILT[f"{self.data['name']}{self.data['at']}"] = 1
        self.data["at"] += 1
        return Status.done() if self.data["at"] == 3 else Status.executing()

    async def rollback(self, ctx: Context) -> None:
        for i in range(1 if self.forgetful else 3):  # the planted bug: forgets all but the first
            BUILT.pop(f"{self.data['name']}{i}", None)

    def dump(self) -> str:
        return json.dumps(self.data)


class Forgetful(Build):
    forgetful = True


class TwoBuilds(Scenario):
    def __init__(self, cls: type[Build] = Build) -> None:
        self.cls = cls
        self.calls: list[tuple[Any, ...]] = []

    async def prepare(self, store: StateStore) -> None:
        BUILT.clear()

    def attach(self, manager: ProcedureManager, store: StateStore) -> None:
        manager.register_loader(Build.type_name, lambda data: self.cls(json.loads(data)))

    async def procedures(self, store: StateStore) -> list[ProcedureWithId]:
        return [ProcedureWithId.new(self.cls({"name": name, "at": 0})) for name in "xy"]

    async def snapshot(self, store: StateStore) -> object:
        return dict(BUILT)


async def test_rollback_mode_expects_only_the_failed_procedure_undone_by_default() -> None:
    report = await CrashExplorer(TwoBuilds(), fresh).explore(rollback_from_every_step=True)
    report.assert_ok()
    assert report.explored > 4 * 2


async def test_rollback_mode_still_finds_a_bad_rollback_among_many() -> None:
    report = await CrashExplorer(TwoBuilds(Forgetful), fresh).explore(rollback_from_every_step=True)
    assert not report.ok
    assert "the world after the rollback is not as expected" in str(report)


class Told(TwoBuilds):
    async def rolled_back(self, store: StateStore, before: object, failed: tuple[int, ...] = ()) -> object:
        self.calls.append(failed)
        assert isinstance(before, dict)
        return {**before, **{f"{n}{i}": 1 for k, n in enumerate("xy") if k not in failed for i in range(3)}}


async def test_the_rollback_hook_is_told_which_procedures_failed() -> None:
    scenario = Told()
    (await CrashExplorer(scenario, fresh).explore(rollback_from_every_step=True)).assert_ok()
    assert set(scenario.calls) == {(0,), (1,)}


class OldHook(TwoBuilds):
    async def rolled_back(self, store: StateStore, before: object) -> object:  # type: ignore[override]
        self.calls.append(())
        return {f"{n}{i}": 1 for n in "xy" for i in range(3)}  # wrong on purpose: must be compared


async def test_an_older_two_argument_hook_is_still_called_and_believed() -> None:
    scenario = OldHook()
    report = await CrashExplorer(scenario, fresh).explore(rollback_from_every_step=True)
    assert scenario.calls and not report.ok


class Once(Procedure):
    """One idempotent step that checks its lease before touching the world."""

    type_name = "tests::ManyOnce"

    async def execute(self, ctx: Context) -> Status:
        ctx.check_lease()
        BUILT["once"] = 1
        return Status.done()

    def dump(self) -> str:
        return "{}"


class Leased(Scenario):
    async def prepare(self, store: StateStore) -> None:
        BUILT.clear()

    def attach(self, manager: ProcedureManager, store: StateStore) -> None:
        manager.register_loader(Once.type_name, lambda data: Once())

    async def procedures(self, store: StateStore) -> list[ProcedureWithId]:
        return [ProcedureWithId.new(Once())]

    async def snapshot(self, store: StateStore) -> object:
        return dict(BUILT)


def test_the_explorer_waits_for_a_restarted_manager_to_lead_under_a_lease() -> None:
    # After a kill the restarted manager is a standby until the dead one's lease expires,
    # and deletes what it inherited only after `late_write_grace`: free in virtual time.
    explorer = CrashExplorer(Leased(), fresh, manager_options={"lease": Lease(ttl=2.0)})
    report = run_simulated(explorer.explore(double_execution=True), seed=3)
    report.assert_ok()
    assert report.explored > 4
