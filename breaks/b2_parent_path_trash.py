"""B2: parent_path=".trash" (any legal parent path) puts every procedure key under the
trash: the next manager start() empties it and an UNFINISHED procedure is lost.
Run: PYTHONPATH=. .venv/bin/python breaks/b2_parent_path_trash.py   (exit 1 = broken)"""
import asyncio, sys, tempfile
from procstore import ProcedureManager
from procstore.store import open_state_store
from tests.procedures import World, register_all
from tests.runtime.helpers import blocker, steps


async def main() -> int:
    with tempfile.TemporaryDirectory() as root:
        world = World.new()
        name, event = blocker()
        proc = steps(world, 5, block=name, block_at=2)
        async with register_all(ProcedureManager(root, parent_path=".trash")) as m:
            await m.submit(proc)
            while world.counts["steps/1"] == 0:
                await asyncio.sleep(0.01)
        store = open_state_store(root)
        before = await store.walk(".trash/procedure/")
        print("keys before restart:", len(before))
        m2 = register_all(ProcedureManager(root, parent_path=".trash"))
        await m2.start()
        await asyncio.sleep(0.5)  # the trash cleanup ran after check_access answered
        await m2.stop()
        after = await store.walk(".trash/procedure/")
        print("keys after restart:", len(after), "ran step 2:", world.counts["steps/2"])
        if before and not after and world.counts["steps/2"] == 0:
            print("BROKEN: the unfinished procedure's keys were deleted by start(); it never finished")
            return 1
        return 0

sys.exit(asyncio.run(main()))
