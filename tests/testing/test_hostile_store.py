"""Recovery over the hostile store of `procstore.testing`: every hostile procedure is a load
problem, left as it is; the store's own procedures run; nothing fails."""

from __future__ import annotations

from pathlib import Path

from procstore.store import LocalDirStore
from procstore.store.message import ProcedureMessage
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


async def test_a_key_of_another_shape_does_not_end_a_procedure(tmp_path: Path) -> None:
    """`procedure/x/{id}/9999999999.commit` (or `procedure/{id}/9.commit`), written beside a
    procedure's real keys, is not a key of it: recovery resumes the procedure to its end
    instead of taking it for finished and deleting its keys."""
    world = World.new()
    victims = [steps(world, 2), steps(world, 2)]
    store = LocalDirStore(tmp_path)
    for victim in victims:
        message = ProcedureMessage(victim.procedure.type_name, victim.procedure.dump(), None, 0)
        await store.put(f"procedure/{victim.id}/0000000000.step", message.encode())
    fakes = [f"procedure/x/{victims[0].id}/9999999999.commit", f"procedure/{victims[1].id}/9.commit"]
    for fake in fakes:
        await store.put(fake, b"")
    async with manager_for(LocalDirStore(tmp_path)) as manager:
        for victim in victims:
            watcher = manager.procedure_watcher(victim.id)
            assert watcher is not None  # resumed, not taken for finished
            await watcher.wait()
            assert watcher.state.is_done()
    assert sorted(await store.walk("procedure/")) == sorted(fakes)  # left alone, as any stray key


async def test_a_key_above_the_largest_step_is_no_procedures(tmp_path: Path) -> None:
    """`procedure/{id}/4294967296.commit` (or a `.rollback` or `.step` there, or further up),
    beside an unfinished procedure's keys, is a step no procedure can write: recovery ignores
    it and resumes the procedure to its end, instead of taking it for finished and deleting it
    (or for rolling back, or for stuck at that step)."""
    world = World.new()
    fakes = {"4294967296.commit", "4294967296.rollback", "4294967296.step", "9999999999.commit", "10000000000.commit"}
    victims = [steps(world, 2) for _ in fakes]
    store = LocalDirStore(tmp_path)
    planted = []
    for victim, fake in zip(victims, sorted(fakes), strict=True):
        message = ProcedureMessage(victim.procedure.type_name, victim.procedure.dump(), None, 0)
        await store.put(f"procedure/{victim.id}/0000000000.step", message.encode())
        planted.append(f"procedure/{victim.id}/{fake}")
        await store.put(planted[-1], message.encode() if fake.endswith(".step") else b"")
    async with manager_for(LocalDirStore(tmp_path)) as manager:
        assert manager.recovery_problems == []
        for victim in victims:
            watcher = manager.procedure_watcher(victim.id)
            assert watcher is not None  # resumed, not taken for finished
            await watcher.wait()
            assert watcher.state.is_done()
    assert sorted(await store.walk("procedure/")) == sorted(planted)  # left alone, as any stray key
