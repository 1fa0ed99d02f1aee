"""Recovery over the hostile store of `procstore.testing`: every hostile procedure is a load
problem, left as it is; the store's own procedures run; nothing fails."""

from __future__ import annotations

import logging
import uuid
from pathlib import Path

import pytest

from procstore.ids import ProcedureId
from procstore.store.local import LocalDirStore
from procstore.store.memory import MemoryStore
from procstore.store.message import ProcedureMessage
from procstore.testing import HOSTILE_TEXTS, write_hostile_store, write_parent_chain, write_parent_cycle
from tests.procedures import World
from tests.runtime.helpers import steps
from tests.support import manager_for


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


async def test_recovery_names_a_parent_cycle_once_not_per_member(caplog: pytest.LogCaptureFixture) -> None:
    """Every member of a cycle of N is a load problem; were each to name the whole cycle, one
    hostile write per procedure would make N lines of N ids (2,000: 160 MB of log). The
    cycle is logged once, whole, and each member's problem names it by its first id."""
    length = 300
    store = MemoryStore(f"hostile-{uuid.uuid4().hex}")
    cycle = await write_parent_cycle(store, length)
    with caplog.at_level(logging.INFO, logger="procstore"):
        async with manager_for(store) as manager:
            problems = {p.procedure_id: p.reason for p in manager.recovery_problems}
    assert set(cycle) <= set(problems)
    assert all("cycle" in problems[pid] for pid in cycle)
    logged = sum(len(r.getMessage()) for r in caplog.records)
    reasons = sum(len(problems[pid]) for pid in cycle)
    assert logged + reasons < 2_000 * length  # linear; naming the cycle per member: 40 * length**2
    assert sum(str(cycle[-1]) in r.getMessage() and "->" in r.getMessage() for r in caplog.records) == 1


async def test_recovery_walks_a_chain_of_subprocedures_in_linear_work(monkeypatch: pytest.MonkeyPatch) -> None:
    """Finding subprocedures that no root would claim walks up each chain: a chain N deep,
    one hostile write per procedure, must cost N id comparisons, not N squared (50,000 took
    a minute on the event loop)."""
    length = 1_000
    store = MemoryStore(f"hostile-{uuid.uuid4().hex}")
    chain = await write_parent_chain(store, length)
    compared = 0
    equal = ProcedureId.__eq__

    def counting(self: ProcedureId, other: object) -> bool:
        nonlocal compared
        compared += 1
        return equal(self, other)

    async with manager_for(store) as manager:
        monkeypatch.setattr(ProcedureId, "__eq__", counting)
        await manager.stop()
        compared = 0
        await manager.start()
        monkeypatch.undo()
        reported = {p.procedure_id for p in manager.recovery_problems}
    assert chain[-1] in reported  # the root: no loader for its type; its descendants wait for it
    assert compared < 50 * length  # the walk by a list: about length**2 / 2


async def test_the_hostile_writers_write_under_a_parent_path_as_a_manager_reads_it() -> None:
    """`parent_path="region-a"` is the folder `region-a/` for a manager (and a `Client`):
    what the writers write for it is found there, not under `region-aprocedure/`."""
    from procstore.store.procedure_store import ProcedureStore
    from procstore.testing import write_many_commits

    store = MemoryStore(f"hostile-{uuid.uuid4()}")
    written = await write_hostile_store(store, parent_path="region-a")
    chain = await write_parent_chain(store, 3, parent_path="region-a")
    many = await write_many_commits(store, 2, parent_path="region-a")
    assert sorted(k for k in await store.walk("") if not k.startswith("region-a/")) == []
    loaded = await ProcedureStore(store, "region-a").load_messages()
    found = {*loaded.messages, *loaded.rollback_messages, *loaded.unreadable_ids, *loaded.finished_ids}
    assert {*written.procedures, *chain, many} <= found
