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
from tests.conftest import StoreTarget
from tests.procedures import Parent, Undoable, World, register_all


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


@pytest.mark.parametrize("name", sorted(SCENARIOS))
async def test_crash_before_and_after_every_store_operation(
    store_target: StoreTarget, tmp_path: Path, name: str
) -> None:
    if store_target.kind == "s3" and name == "two-at-once":
        pytest.skip("covered on memory:// and local; S3 runs the single-procedure scenarios to keep CI short")
    report = await explorer_for(store_target, tmp_path, WorldScenario(name, SCENARIOS[name])).explore()
    report.assert_ok()
    assert report.explored == 2 * report.operations and report.operations > 5


async def test_each_step_twice(memory_target: StoreTarget, tmp_path: Path) -> None:
    scenario = WorldScenario("parent-with-children", SCENARIOS["parent-with-children"])
    report = await explorer_for(memory_target, tmp_path, scenario).explore(double_execution=True)
    report.assert_ok()
