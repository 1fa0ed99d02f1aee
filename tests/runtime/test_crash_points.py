"""Crash before and after every store operation, restart on the same store, check the end state.

For each scenario a clean run counts the store operations that change the store. Then,
for every operation k and for "before" and "after", a run is crashed at k (the manager is
thrown away, nothing more reaches the store), a new manager starts on the same store and
runs everything to its end. Checked each time: the world ends as in the clean run, the
procedure is committed (or rolled back) exactly once, no key is written twice, and the
store is empty afterwards.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

import pytest

from procstore import ManagerStopped, ProcedureFailed, ProcedureWithId, Watcher
from procstore.store import open_state_store
from procstore.testing import FaultyStore, SimulatedCrash
from tests.conftest import StoreTarget
from tests.procedures import Parent, Undoable, World
from tests.runtime.helpers import manager_for


@dataclass(frozen=True)
class Scenario:
    name: str
    make: Callable[[World], ProcedureWithId]
    expected_effects: Callable[[World], set[str]]
    succeeds: bool


SCENARIOS = [
    Scenario(
        "parent-with-children",
        lambda w: ProcedureWithId.new(Parent.create(w, ["a", "b"])),
        lambda w: {"parent/prepared", "parent/joined", *(f"child/{n}/{s}" for n in "ab" for s in (0, 1))},
        succeeds=True,
    ),
    Scenario(
        "rollback",
        lambda w: ProcedureWithId.new(Undoable({"world": w.name, "steps": 4, "fail_at": 2})),
        lambda w: {"steps/rolled-back"},
        succeeds=False,
    ),
]


async def finish(watcher: Watcher) -> bool:
    """Wait for the end; True if it succeeded."""
    try:
        await asyncio.wait_for(watcher.wait(), 30)
    except ProcedureFailed:
        return False
    return True


async def crashed_run(
    target: StoreTarget, scenario: Scenario, crash_at: int | None, when: Literal["before", "after"]
) -> int:
    """One crashed run and its recovery; returns how many counted operations the first run made."""
    world = World.new()
    procedure = scenario.make(world)
    faulty = FaultyStore(open_state_store(target.url, target.storage_options), crash_at=crash_at, crash_when=when)
    first = manager_for(faulty)
    submitted = False
    with contextlib.suppress(SimulatedCrash):
        await first.start()
        watcher = await first.submit(procedure)
        submitted = True
        ended = asyncio.ensure_future(finish(watcher))
        crashed = asyncio.ensure_future(faulty.crashed.wait())
        await asyncio.wait([ended, crashed], return_when=asyncio.FIRST_COMPLETED, timeout=30)
        crashed.cancel()
    await first.stop()
    await faulty.close()
    if crash_at is None:
        assert ended.done() and ended.result() is scenario.succeeds
    else:
        assert faulty.crashed.is_set(), f"no operation {crash_at} to crash at"
    with contextlib.suppress(ManagerStopped, SimulatedCrash, asyncio.CancelledError):
        if submitted:
            ended.cancel()
            await ended

    recorder = FaultyStore(open_state_store(target.url, target.storage_options))
    async with manager_for(recorder) as second:
        resumed = second.procedure_watcher(procedure.id)
        if resumed is None and not submitted:
            resumed = await second.submit(scenario.make(world).__class__(procedure.id, procedure.procedure))
        if resumed is not None:
            assert await finish(resumed) is scenario.succeeds
        assert await recorder.inner.walk("procedure/") == [], "keys left behind"
        problems = second.recovery_problems
    await recorder.close()
    assert problems == []
    assert world.effects == scenario.expected_effects(world)

    writes = [op for op in faulty.landed() + recorder.landed() if op.kind.startswith("put")]
    repeated = [key for key, n in Counter(op.key for op in writes).items() if n > 1]
    assert repeated == [], f"keys written twice: {repeated}"
    ends = [op for op in writes if str(procedure.id) in op.key and op.key.endswith((".commit", ".rollback"))]
    assert len(ends) == 1, f"expected exactly one commit/rollback key, got {[op.key for op in ends]}"
    return len(faulty.ops)


@pytest.mark.parametrize("scenario", SCENARIOS, ids=lambda s: s.name)
async def test_crash_before_and_after_every_store_operation(store_target: StoreTarget, scenario: Scenario) -> None:
    total = await crashed_run(store_target, scenario, None, "before")
    assert total > 5
    for crash_at in range(total):
        for when in ("before", "after"):
            try:
                await crashed_run(store_target, scenario, crash_at, when)
            except AssertionError as e:
                raise AssertionError(f"crash {when} operation {crash_at} of {total}: {e}") from e
