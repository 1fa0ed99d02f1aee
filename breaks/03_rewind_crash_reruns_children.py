"""A rewind on the same manager of a root whose end the store refused deletes the ended
run's children before it writes its copy; a crash between the two leaves the old run
unfinished and its children gone: the next start resumes the old run, which creates its
children again and each child's steps run twice (guarantees.md, Resume and rewind: "A
crash before that key leaves the procedure as it was")."""

import asyncio
import contextlib
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
    url = "memory://break03/"
    world = World.new()
    procedure = ProcedureWithId.new(Parent.create(world, ["a"]))
    refused = [Fault("transient", key=f"procedure/{procedure.id}/*.{k}") for k in ("commit", "rollback")]
    faulty = FaultyStore(open_state_store(url), faults=refused)
    manager = manager_for(faulty)
    await manager.start()
    with pytest.raises(EndNotRecorded):
        await (await manager.submit(procedure)).wait()
    # The process dies at the rewind's copy (after the children were deleted).
    faulty.plan.faults[:] = [Fault("crash", key=f"procedure/{procedure.id}/0000000003.step")]
    with contextlib.suppress(BaseException):
        await manager.rewind(procedure.id, 1)  # deletes the ended child's keys, then writes its copy
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
