"""Planted bugs the stateful machine missed (issue 33): a lock too narrow to keep two
procedures apart (they never overlapped), and a wrong state that only exists between two
steps (checked only at teardown)."""

from __future__ import annotations

import asyncio
import json
import uuid
from typing import Any, ClassVar

import pytest
from hypothesis import HealthCheck, Phase, settings
from hypothesis.stateful import run_state_machine_as_test

from procstore import Context, LockKey, Procedure, ProcedureId, ProcedureManager, ProcedureWithId, Status, StringKey
from procstore.store import StateStore
from procstore.testing.stateful import ProcedureStateMachine

WORLDS: dict[str, dict[str, Any]] = {}
"""Each machine's world, by name: procedures reach it through their data."""


class Increment(Procedure):
    """Reads the shared counter, yields, writes it plus one (once per procedure, however
    often the step replays). The planted bug: it locks its own name, not the counter."""

    type_name = "tests::Increment"
    narrow: ClassVar[bool] = True

    def __init__(self, data: dict[str, Any]) -> None:
        self.data = data

    def lock_key(self) -> LockKey:
        return LockKey([StringKey.exclusive(self.data["name"] if self.narrow else "counter")])

    async def execute(self, ctx: Context) -> Status:
        world = WORLDS[self.data["world"]]
        if self.data["name"] not in world["applied"]:
            seen = world["counter"]
            await asyncio.sleep(0)
            world["counter"] = seen + 1
            world["applied"].add(self.data["name"])
        return Status.done()

    def dump(self) -> str:
        return json.dumps(self.data)

    @classmethod
    def load(cls, data: str) -> Increment:
        return cls(json.loads(data))


class LockedIncrement(Increment):
    narrow = False


class Counting(ProcedureStateMachine):
    kind: ClassVar[type[Increment]] = Increment

    def __init__(self) -> None:
        self.world = uuid.uuid4().hex
        WORLDS[self.world] = {"counter": 0, "applied": set(), "parts": {}}
        super().__init__()

    def attach(self, manager: ProcedureManager, store: StateStore) -> None:
        manager.register_loader(self.kind.type_name, self.kind.load)

    def new_procedure(self, seed: int, store: StateStore) -> ProcedureWithId:
        return ProcedureWithId.new(self.kind({"world": self.world, "name": uuid.uuid4().hex}))

    def check_world(self, outcomes: dict[ProcedureId, str]) -> None:
        world = WORLDS[self.world]
        assert world["counter"] == len(world["applied"]), f"lost updates: {world}"


class CountingLocked(Counting):
    kind = LockedIncrement


def run(machine: type[ProcedureStateMachine], examples: int) -> None:
    run_state_machine_as_test(
        machine,
        settings=settings(
            max_examples=examples,
            deadline=None,
            database=None,
            derandomize=True,
            phases=[Phase.generate],  # found is enough: shrinking takes most of the time
            suppress_health_check=list(HealthCheck),
        ),
    )


def test_a_lock_too_narrow_is_found_by_procedures_that_overlap() -> None:
    with pytest.raises(AssertionError, match="lost updates"):
        run(Counting, 100)


def test_a_lock_wide_enough_is_not_flagged() -> None:
    run(CountingLocked, 30)


class Tally(Procedure):
    """Counts itself in two steps. The planted bug: its first step counts it twice; the
    second puts it right, so only a check between the steps sees it."""

    type_name = "tests::Tally"

    def __init__(self, data: dict[str, Any]) -> None:
        self.data = data

    async def execute(self, ctx: Context) -> Status:
        parts = WORLDS[self.data["world"]]["parts"]
        if not self.data.get("counted"):
            parts[self.data["name"]] = 2
            self.data["counted"] = True
            return Status.executing()
        parts[self.data["name"]] = 1
        return Status.done()

    def dump(self) -> str:
        return json.dumps(self.data)

    @classmethod
    def load(cls, data: str) -> Tally:
        return cls(json.loads(data))


class Tallying(Counting):
    kind = Tally  # type: ignore[assignment]

    def check_world(self, outcomes: dict[ProcedureId, str]) -> None:
        parts = WORLDS[self.world]["parts"]
        assert all(n == 1 for n in parts.values()), parts

    async def invariant(self, store: StateStore) -> None:
        parts = WORLDS[self.world]["parts"]
        assert all(n <= 1 for n in parts.values()), f"counted twice: {parts}"


def test_the_invariant_runs_after_every_rule_and_finds_a_state_between_steps() -> None:
    with pytest.raises(AssertionError, match="counted twice"):
        run(Tallying, 100)
