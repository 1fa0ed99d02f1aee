"""Planted bugs in the explorer's own blind spots (issue 33): a replay that never ends, a
leak already in the crash-free run, and a lock race between two correct procedures that the
explorer must not call a failure."""

from __future__ import annotations

import asyncio
import json
import uuid
from typing import Any

from procstore import Context, Procedure, ProcedureManager, ProcedureWithId, Status, StringKey
from procstore.store import StateStore
from procstore.testing import CrashExplorer, Scenario, run_simulated
from tests.testing.test_explorer_modes import FILES, Publish, Publishing

WORLD: dict[str, str] = {}


def fresh(n: int) -> str:
    return f"memory://gaps-{uuid.uuid4().hex}/"


class Child(Procedure):
    type_name = "tests::Child"

    async def execute(self, ctx: Context) -> Status:
        return Status.done()

    def dump(self) -> str:
        return "{}"

    @classmethod
    def load(cls, data: str) -> Child:
        return cls()


class Spawner(Procedure):
    """The planted bug: its child gets a new id each time the step runs, so a run killed
    before the child's first write replays into yet another child, forever."""

    type_name = "tests::Spawner"

    def __init__(self, data: dict[str, Any]) -> None:
        self.data = data

    async def execute(self, ctx: Context) -> Status:
        if self.data.get("spawned"):
            return Status.done()
        self.data["spawned"] = True
        return Status.suspended([ProcedureWithId.new(Child())], persist=False)

    def dump(self) -> str:
        return json.dumps(self.data)

    @classmethod
    def load(cls, data: str) -> Spawner:
        return cls(json.loads(data))


class Spawning(Scenario):
    name = "spawning"

    def attach(self, manager: ProcedureManager, store: StateStore) -> None:
        manager.register_loader(Spawner.type_name, Spawner.load)
        manager.register_loader(Child.type_name, Child.load)

    async def procedures(self, store: StateStore) -> list[ProcedureWithId]:
        return [ProcedureWithId.new(Spawner({}))]


def test_a_replay_that_names_new_children_every_time_is_reported_not_run_forever() -> None:
    explorer = CrashExplorer(Spawning(), fresh, max_lives=30)
    report = run_simulated(explorer.explore(double_execution=True), seed=3)
    never = [f for f in report.failures if "never ends" in f.problem]
    assert never, str(report)
    assert "tests::Spawner" in never[0].problem
    assert "child of tests::Spawner" in "\n".join(never[0].details)


class Leaky(Procedure):
    """The planted bug: a temp file it never removes, crash or no crash."""

    type_name = "tests::Leaky"

    async def execute(self, ctx: Context) -> Status:
        WORLD["tmp/scratch"] = "x"
        WORLD["out"] = "done"
        return Status.done()

    def dump(self) -> str:
        return "{}"

    @classmethod
    def load(cls, data: str) -> Leaky:
        return cls()


class Leaking(Scenario):
    name = "leaking"

    async def prepare(self, store: StateStore) -> None:
        WORLD.clear()

    def attach(self, manager: ProcedureManager, store: StateStore) -> None:
        manager.register_loader(Leaky.type_name, Leaky.load)

    async def procedures(self, store: StateStore) -> list[ProcedureWithId]:
        return [ProcedureWithId.new(Leaky())]

    async def snapshot(self, store: StateStore) -> object:
        return dict(WORLD)

    async def invariant(self, store: StateStore) -> None:
        leaked = [k for k in WORLD if k.startswith("tmp/")]
        assert not leaked, f"temp files left: {leaked}"


def test_an_invariant_finds_a_leak_already_in_the_crash_free_run() -> None:
    report = run_simulated(CrashExplorer(Leaking(), fresh).explore(), seed=1)
    assert not report.ok
    first = report.failures[0]
    assert first.operation == "the crash-free run"
    assert first.problem.startswith("Leaking.invariant failed: temp files left: ['tmp/scratch']")
    assert first.replay == "run_simulated(explorer.explore(only=[]), seed=1)"


class Claim(Procedure):
    """Correct: a first step, then the lock; the first to hold it wins. Which one that is
    depends on the schedule, and a crash changes the schedule."""

    type_name = "tests::Claim"

    def __init__(self, data: dict[str, Any]) -> None:
        self.data = data

    async def execute(self, ctx: Context) -> Status:
        if not self.data.get("ready"):
            self.data["ready"] = True
            return Status.executing()
        async with ctx.provider.acquire_lock(StringKey.exclusive("prize")):
            await asyncio.sleep(0)
            WORLD.setdefault("winner", self.data["who"])
        return Status.done()

    def dump(self) -> str:
        return json.dumps(self.data)

    @classmethod
    def load(cls, data: str) -> Claim:
        return cls(json.loads(data))


class Race(Scenario):
    name = "race"

    async def prepare(self, store: StateStore) -> None:
        WORLD.clear()

    def attach(self, manager: ProcedureManager, store: StateStore) -> None:
        manager.register_loader(Claim.type_name, Claim.load)

    async def procedures(self, store: StateStore) -> list[ProcedureWithId]:
        return [ProcedureWithId.new(Claim({"who": who})) for who in ("a", "b")]

    async def snapshot(self, store: StateStore) -> object:
        return dict(WORLD)


def test_which_of_two_locked_procedures_wins_is_not_a_failure() -> None:
    for seed in range(4):
        report = run_simulated(CrashExplorer(Race(), fresh).explore(), seed=seed)
        assert report.ok, str(report)


class TidyPublishing(Publishing):
    """A temp folder must never outlive a run: a crash inside `Publish` leaves one behind."""

    async def invariant(self, store: StateStore) -> None:
        left = [path for path in FILES if path.startswith("tmp/")]
        assert not left, f"temp folders left: {left}"


def test_the_invariant_speaks_first_and_failures_of_one_cause_are_grouped() -> None:
    report = asyncio.run(CrashExplorer(TidyPublishing(Publish), fresh).explore())
    first = report.failures[0]
    assert first.problem.startswith("TidyPublishing.invariant failed: temp folders left: ['tmp/docs']")
    assert "ended failed, not done as without a crash" in first.details[0]
    # Killed after the mkdir, or after the write: two causes, each at two crash points.
    assert [len(group) for group in report.causes] == [2, 2]
    said = str(report)
    assert said.count("TidyPublishing.invariant failed") == 2
    assert said.count("the same at 1 more crash point:") == 2


def test_the_crash_free_runs_failure_replays_alone() -> None:
    explorer = CrashExplorer(Leaking(), fresh)
    first = run_simulated(explorer.explore(), seed=1).failures[0]
    for only in ([], [first.point]):
        again = run_simulated(explorer.explore(only=only), seed=1)
        assert [f.operation for f in again.failures] == ["the crash-free run"]


class Bump(Procedure):
    """A child whose first step is not idempotent (the planted bug)."""

    type_name = "tests::Bump"

    def __init__(self, data: dict[str, Any]) -> None:
        self.data = data

    async def execute(self, ctx: Context) -> Status:
        if not self.data.get("bumped"):
            WORLD["n"] = str(int(WORLD.get("n", "0")) + 1)
            self.data["bumped"] = True
            return Status.executing()
        return Status.done()

    def dump(self) -> str:
        return json.dumps(self.data)

    @classmethod
    def load(cls, data: str) -> Bump:
        return cls(json.loads(data))


class Parent(Procedure):
    type_name = "tests::Parent"

    def __init__(self, data: dict[str, Any]) -> None:
        self.data = data

    async def execute(self, ctx: Context) -> Status:
        if self.data.get("spawned"):
            return Status.done()
        self.data["spawned"] = True
        return Status.suspended([ProcedureWithId.new(Bump({}))])

    def dump(self) -> str:
        return json.dumps(self.data)

    @classmethod
    def load(cls, data: str) -> Parent:
        return cls(json.loads(data))


class Bumping(Scenario):
    name = "bumping"

    async def prepare(self, store: StateStore) -> None:
        WORLD.clear()

    def attach(self, manager: ProcedureManager, store: StateStore) -> None:
        manager.register_loader(Parent.type_name, Parent.load)
        manager.register_loader(Bump.type_name, Bump.load)

    async def procedures(self, store: StateStore) -> list[ProcedureWithId]:
        return [ProcedureWithId.new(Parent({}))]

    async def snapshot(self, store: StateStore) -> object:
        return dict(WORLD)


def test_a_childs_crash_point_names_the_child_by_type_and_parent() -> None:
    report = run_simulated(CrashExplorer(Bumping(), fresh).explore(), seed=2)
    at_child = [f.operation for f in report.failures if "tests::Bump" in f.operation]
    assert at_child, str(report)
    assert all("(tests::Bump, child of tests::Parent " in operation for operation in at_child)
