"""Under a lease, a root whose end the store refused keeps its whole tree for "the next
start" (4c8b136). Once its tree's metadata expired (metadata_ttl), the running leader's
look for procedures stored after its recovery finds the root unknown and adopts it, with its
unfinished descendants only: its ended children are not kept for it, so the adopted root
names them again and their stored steps (the same bytes) read as its own earlier writes:
each ended child runs a second time (guarantees.md, Finishing: "a child it created is found
there (ended children as ended), never created and run again")."""

import asyncio
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import pytest

from procstore import EndNotRecorded, Lease, ProcedureWithId
from procstore.store import open_state_store
from procstore.testing import Fault, FaultyStore
from tests.procedures import Parent, World
from tests.support import manager_for


async def main() -> None:
    world = World.new()
    procedure = ProcedureWithId.new(Parent.create(world, ["a"]))
    refused = [Fault("transient", key=f"procedure/{procedure.id}/*.{k}") for k in ("commit", "rollback")]
    faulty = FaultyStore(open_state_store("memory://break05/"), faults=refused)
    lease = Lease(ttl=1.0, holder="cp-1", adopt_interval=0.05)
    async with manager_for(faulty, lease=lease, metadata_ttl=0.0) as manager:
        with pytest.raises(EndNotRecorded):
            await (await manager.submit(procedure)).wait()
        faulty.plan.faults.clear()
        manager.remove_outdated_metadata()  # what the housekeeping does once metadata_ttl passed
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and world.counts["parent/joined"] < 2:  # noqa: ASYNC110
            await asyncio.sleep(0.05)
    counts = {s: world.counts[f"child/a/{s}"] for s in (0, 1)}
    print("parent joined", world.counts["parent/joined"], "times; child steps", counts)
    assert counts == {0: 1, 1: 1}, f"the ended child ran again: {counts}"


asyncio.run(asyncio.wait_for(main(), 30))
print("held")
