"""Crash before and after every store operation (with `procstore.testing.CrashExplorer`).

Each crash point is a fresh run killed there; a new manager restarts on the same store and
runs everything to its end. The explorer checks the outcomes and the world against the
crash-free run, one commit or rollback key per procedure, no key written twice, and an
empty store at the end.
"""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest

from procstore import ProcedureManager, ProcedureWithId
from procstore.store import StateStore
from procstore.testing import CrashExplorer, Scenario
from tests.procedures import Parent, Undoable, World, register_all
from tests.support import StoreTarget, store_targets


class WorldScenario(Scenario):
    """Procedures from `tests/procedures.py`, acting on a fresh `World` each run."""

    def __init__(self, name: str, build: object) -> None:
        self.name = name
        self.build = build
        self.world = World.new()

    async def prepare(self, store: StateStore) -> None:
        self.world = World.new()

    def attach(self, manager: ProcedureManager, store: StateStore) -> None:
        register_all(manager)

    async def procedures(self, store: StateStore) -> list[ProcedureWithId]:
        return [ProcedureWithId.new(p) for p in self.build(self.world)]  # type: ignore[operator]

    async def snapshot(self, store: StateStore) -> object:
        return sorted(self.world.effects)


SCENARIOS = {
    "parent-with-children": lambda w: [Parent.create(w, ["a", "b"])],
    "rollback": lambda w: [Undoable({"world": w.name, "steps": 4, "fail_at": 2})],
    "two-at-once": lambda w: [Parent.create(w, ["x"]), Undoable({"world": w.name, "steps": 2, "name": "u"})],
}


def explorer_for(target: StoreTarget, tmp_path: Path, scenario: Scenario) -> CrashExplorer:
    def url(n: int) -> str:
        if target.kind == "local":
            return str(tmp_path / f"run-{n}")
        return f"{target.url}run-{n}/" if target.kind == "s3" else f"memory://crash-{uuid.uuid4().hex}/"

    return CrashExplorer(scenario, url, target.storage_options)


single_procedure = sorted(name for name in SCENARIOS if name != "two-at-once")
# Two procedures at once on S3 would double CI's longest test; memory:// and local run it.
without_s3 = store_targets("memory", "local")


@pytest.mark.parametrize("name", single_procedure)
async def test_crash_before_and_after_every_store_operation(
    store_target: StoreTarget, tmp_path: Path, name: str
) -> None:
    await explore_every_crash_point(store_target, tmp_path, name)


async def test_crash_before_and_after_every_store_operation_of_two_procedures_at_once(
    without_s3: StoreTarget, tmp_path: Path
) -> None:
    await explore_every_crash_point(without_s3, tmp_path, "two-at-once")


async def explore_every_crash_point(target: StoreTarget, tmp_path: Path, name: str) -> None:
    report = await explorer_for(target, tmp_path, WorldScenario(name, SCENARIOS[name])).explore()
    report.assert_ok()
    assert report.explored == 2 * report.operations and report.operations > 5


async def test_each_step_twice(memory_target: StoreTarget, tmp_path: Path) -> None:
    scenario = WorldScenario("parent-with-children", SCENARIOS["parent-with-children"])
    report = await explorer_for(memory_target, tmp_path, scenario).explore(double_execution=True)
    report.assert_ok()
