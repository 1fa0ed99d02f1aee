"""Recovery over the hostile store of `procstore.testing`: every hostile procedure is a load
problem, left as it is; the store's own procedures run; nothing fails."""

from __future__ import annotations

from pathlib import Path

from procstore.store import LocalDirStore
from procstore.testing import HOSTILE_TEXTS, write_hostile_store
from tests.procedures import World
from tests.runtime.helpers import manager_for, steps


async def test_recovery_skips_every_hostile_procedure_and_runs_the_others(tmp_path: Path) -> None:
    written = await write_hostile_store(LocalDirStore(tmp_path))
    assert written.keys_refused == []  # a local store takes a name that is not UTF-8
    world = World.new()
    async with manager_for(LocalDirStore(tmp_path)) as manager:
        problems = {str(p.procedure_id) for p in manager.recovery_problems if p.procedure_id is not None}
        # No loader for any hostile type (and two are a parent cycle): each reported, none run.
        assert {str(pid) for pid in written.procedures} <= problems
        assert all(not manager.procedure_state(pid) for pid in written.procedures[: len(HOSTILE_TEXTS)])
        watcher = await manager.submit(steps(world, 2))
        await watcher.wait()
    keys = await LocalDirStore(tmp_path).walk("procedure/")
    for pid in written.procedures:  # left as they were, for an operator
        assert any(str(pid) in key for key in keys)
