"""The known open window of b921721: a same-manager resume of a root whose end the store
refused deletes the ended run's children, then the manager dies before the resumed root
passes its wait. The next start resumes the root without its children, and it creates
them again: each child's steps run twice (guarantees.md, Finishing: "a child it created
is found there (ended children as ended), never created and run again")."""

import asyncio
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import pytest

from procstore import EndNotRecorded, ProcedureWithId
from procstore.store import open_state_store
from procstore.testing import Fault, FaultyStore, kill_manager
from tests.procedures import Parent, World
from tests.support import manager_for


async def main() -> None:
    url = "memory://break01/"
    world = World.new()
    procedure = ProcedureWithId.new(Parent.create(world, ["a"]))
    refused = [Fault("transient", key=f"procedure/{procedure.id}/*.{k}") for k in ("commit", "rollback")]
    faulty = FaultyStore(open_state_store(url), faults=refused)
    manager = manager_for(faulty)
    await manager.start()
    with pytest.raises(EndNotRecorded):
        await (await manager.submit(procedure)).wait()
    # The process dies at the resumed root's next write (before it passes its wait).
    faulty.plan.faults[:] = [Fault("crash", key=f"procedure/{procedure.id}/*")]
    await manager.resume(procedure.id)  # deletes the ended child's keys first
    await faulty.plan.crashed.wait()
    await kill_manager(manager)
    await manager.stop()
    async with manager_for(url) as again:
        watcher = again.procedure_watcher(procedure.id)
        assert watcher is not None
        assert await watcher.wait() == "joined"
    counts = {s: world.counts[f"child/a/{s}"] for s in (0, 1)}
    assert counts == {0: 1, 1: 1}, f"the ended child ran again: {counts}"


asyncio.run(asyncio.wait_for(main(), 30))
print("held")
