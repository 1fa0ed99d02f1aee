"""A store as an operator finds it: GreptimeDB-written and procstore-written procedures, some
committed but not deleted, one rolling back, a parent with children, and corrupt values."""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass, field

from procstore import ProcedureId, ProcedureWithId
from procstore.store import StateStore
from procstore.store.procedure_store import ProcedureStore
from tests.greptime import greptime_step
from tests.procedures import BLOCKERS, Undoable, World
from tests.support import manager_for


@dataclass
class MixedStore:
    """What was written, and what each procedure's status must read as."""

    world: World
    expected: dict[str, str] = field(default_factory=dict)
    """Procedure id -> the status `procstore ls` must show."""
    migration: str = "9f805a1f-05f7-490c-9f91-bd56e3cc54c1"
    parent: str = "a0000000-0000-4000-8000-000000000001"
    committed_child: str = "a0000000-0000-4000-8000-000000000002"
    running_child: str = "a0000000-0000-4000-8000-000000000003"
    truncated: str = "b0000000-0000-4000-8000-000000000001"
    empty: str = "b0000000-0000-4000-8000-000000000002"
    gt_committed: str = "c0000000-0000-4000-8000-000000000001"
    rolling_back: str = "c0000000-0000-4000-8000-000000000002"
    ps_committed: str = ""
    ps_unfinished: str = ""


async def build_mixed_store(state_store: StateStore, prefix: str) -> MixedStore:
    """Fill `state_store` under `prefix` (e.g. `cp/`): the procedure keys live in `{prefix}procedure/`."""
    mixed = MixedStore(World.new())
    p = f"{prefix}procedure"

    async def put(pid: str, name: str, value: bytes) -> None:
        await state_store.put(f"{p}/{pid}/{name}", value)

    # GreptimeDB-written: a region migration two steps in, its state changing.
    for step, (to_peer, state) in enumerate([(2, "RegionMigrationStart"), (3, "OpenCandidateRegion")]):
        data = {"persistent_ctx": {"from_peer": {"id": 1}, "to_peer": {"id": to_peer}, "region_id": 4398046511104},
                "state": {"region_migration_state": state}}  # fmt: skip
        await put(
            mixed.migration,
            f"{step:010d}.step",
            greptime_step("metasrv-procedure::RegionMigration", json.dumps(data), step),
        )
    # A parent still running, with one committed child (kept by gc) and one running child.
    await put(mixed.parent, "0000000000.step", greptime_step("metasrv-procedure::CreateTable", '{"regions":2}', 0))
    await put(mixed.committed_child, "0000000000.step", greptime_step("CreateRegion", '{"n":0}', 0, mixed.parent))
    await put(mixed.committed_child, "0000000001.commit", b"")
    await put(mixed.running_child, "0000000000.step", greptime_step("CreateRegion", '{"n":1}', 0, mixed.parent))
    # One rolling back.
    await put(mixed.rolling_back, "0000000000.step", greptime_step("metasrv-procedure::AlterTable", '{"a":1}', 0))
    await put(
        mixed.rolling_back,
        "0000000001.rollback",
        greptime_step("metasrv-procedure::AlterTable", '{"a":1}', 1, error="region 7 is gone"),
    )
    # Corrupt: a torn last write, and an empty one.
    await put(mixed.truncated, "0000000000.step", greptime_step("x::Torn", '{"ok":true}', 0))
    await put(mixed.truncated, "0000000001.step", greptime_step("x::Torn", '{"ok":false}', 1)[:25])
    await put(mixed.empty, "0000000000.step", b"")
    await state_store.put(f"{p}/not-a-procedure/README", b"left by someone")

    # procstore-written: one left mid-way by a real manager, one committed but not deleted.
    store = ProcedureStore(state_store, prefix)
    committed = ProcedureId.random()
    mixed.ps_committed = str(committed)
    BLOCKERS["cli-hold"] = asyncio.Event()
    manager = manager_for(state_store, parent_path=prefix)
    async with manager:
        data = {"world": mixed.world.name, "name": "undo", "steps": 4, "block": "cli-hold", "block_at": 2}
        submitted = ProcedureWithId.new(Undoable(data))
        await manager.submit(submitted)
        while mixed.world.counts["undo/1"] == 0:
            await asyncio.sleep(0.005)
        await asyncio.sleep(0.05)  # step 2 is persisted once the runner reaches the blocker
    mixed.ps_unfinished = str(submitted.id)
    # Committed but never deleted (written after the manager, which would have deleted them).
    await put(mixed.gt_committed, "0000000000.step", greptime_step("metasrv-procedure::DropTable", "{}", 0))
    await put(mixed.gt_committed, "0000000001.commit", b"")
    await store.store_procedure(committed, 0, "test::Steps", json.dumps({"world": mixed.world.name, "steps": 1}), None)
    await store.commit_procedure(committed, 1)

    mixed.expected = {
        mixed.migration: "unfinished",
        mixed.parent: "unfinished",
        mixed.committed_child: "done",
        mixed.running_child: "unfinished",
        mixed.gt_committed: "done",
        mixed.rolling_back: "rolling back",
        mixed.truncated: "unreadable",
        mixed.empty: "unreadable",
        mixed.ps_committed: "done",
        mixed.ps_unfinished: "unfinished",
    }
    return mixed
