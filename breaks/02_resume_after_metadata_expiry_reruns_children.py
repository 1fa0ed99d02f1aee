"""A root whose end the store refused keeps its whole tree (4c8b136). Once its tree's
metadata expired (metadata_ttl), a resume on the same manager knows nothing of its
children: it deletes none and claims none, so the resumed root names its children again
and their stored steps (the same bytes) read as its own earlier writes: every child step
runs a second time (guarantees.md, Finishing: "a child it created is found there (ended
children as ended), never created and run again"; Runs: "metadata expiry forgets a run")."""

import asyncio
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import pytest

from procstore import EndNotRecorded, ProcedureWithId
from procstore.store import open_state_store
from procstore.testing import Fault, FaultyStore
from tests.procedures import Parent, World
from tests.support import manager_for


async def main() -> None:
    world = World.new()
    procedure = ProcedureWithId.new(Parent.create(world, ["a"]))
    refused = [Fault("transient", key=f"procedure/{procedure.id}/*.{k}") for k in ("commit", "rollback")]
    faulty = FaultyStore(open_state_store("memory://break02/"), faults=refused)
    async with manager_for(faulty, metadata_ttl=0.0) as manager:
        with pytest.raises(EndNotRecorded):
            await (await manager.submit(procedure)).wait()
        faulty.plan.faults.clear()
        manager.remove_outdated_metadata()  # what the housekeeping does once metadata_ttl passed
        assert await (await manager.resume(procedure.id)).wait() == "joined"
        left = await manager.store.store.walk("procedure/")
    counts = {s: world.counts[f"child/a/{s}"] for s in (0, 1)}
    assert counts == {0: 1, 1: 1}, f"the ended child ran again: {counts}"
    assert left == [], left


asyncio.run(asyncio.wait_for(main(), 30))
print("held")
