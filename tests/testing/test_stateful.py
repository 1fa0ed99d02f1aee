"""Property-based proof: random schedules of submits, crashes, transient faults and restarts."""

from __future__ import annotations

import uuid

from hypothesis import settings

from procstore import ProcedureId, ProcedureManager, ProcedureWithId
from procstore.store import StateStore
from procstore.testing.stateful import ProcedureStateMachine
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
