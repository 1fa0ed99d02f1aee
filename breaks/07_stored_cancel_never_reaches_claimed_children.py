"""A root cancelled while no manager runs it (`Client.cancel`, `procstore cancel`): the next
start lists that request at recovery, yet resumes the root and its stored child, and the
child runs all its remaining steps before the root's first attempt reads the request. Live,
the same cancel reaches the child's next attempt. Weak: the docs allow a request from
another process to be seen within `request_poll_interval` (guarantees.md, Operators), and
a fast child finishes inside that window."""

import asyncio
import contextlib
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from procstore import Client, Context, ProcedureId, ProcedureWithId, Status
from procstore.testing import kill_manager
from tests.procedures import JsonProcedure, Steps, World
from tests.runtime.helpers import blocker
from tests.support import manager_for


class Spawner(JsonProcedure):
    type_name = "v33::Spawner"

    async def execute(self, ctx: Context) -> Status:
        if self.data["stage"] == 0:
            self.data["stage"] = 1
            return Status.suspended(
                [ProcedureWithId(ProcedureId.parse(self.data["child"]), Steps(self.data["child_data"]))]
            )
        return Status.done("spawned")


async def main():
    url = "memory://v33cancel/"
    world = World.new()
    name, event = blocker()
    child = ProcedureId.random()
    p = ProcedureWithId.new(
        Spawner(
            {
                "world": world.name,
                "stage": 0,
                "child": str(child),
                "child_data": {"world": world.name, "steps": 3, "block": name, "block_at": 1},
            }
        )
    )
    m1 = manager_for(url, Spawner)
    await m1.start()
    w = await m1.submit(p)
    for _ in range(100):
        if world.counts["steps/0"]:
            break
        await asyncio.sleep(0.02)
    await asyncio.sleep(0.05)
    await kill_manager(m1)
    with contextlib.suppress(BaseException):
        await m1.stop()
    await Client(url).cancel(p.id, "stop it")
    event.set()
    print("before restart", dict(world.counts))
    async with manager_for(url, Spawner) as m2:
        w = m2.procedure_watcher(p.id)
        try:
            print(await asyncio.wait_for(w.wait(), 5))
        except Exception as e:
            print(type(e).__name__, e)
    print("after", dict(world.counts))
    assert world.counts["steps/1"] == 0, f"the cancelled root's child ran on: {dict(world.counts)}"


asyncio.run(asyncio.wait_for(main(), 30))
print("held")
