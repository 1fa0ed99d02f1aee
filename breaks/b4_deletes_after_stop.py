"""B4: files under the store keep disappearing after `ProcedureManager.stop()` returned (the
worker's rmtree of the trash is not waited for), so a caller that copies or removes the
store directory after stop() races procstore's threads.
Run: PYTHONPATH=. .venv/bin/python breaks/b4_deletes_after_stop.py   (exit 1 = broken)"""
import asyncio, os, shutil, sys, tempfile
from procstore import ProcedureManager
from tests.procedures import World, register_all
from tests.runtime.helpers import steps


def count(root: str) -> int:
    return sum(len(files) for _d, _s, files in os.walk(root))


async def main() -> int:
    root = tempfile.mkdtemp()
    world = World.new()
    async with register_all(ProcedureManager(root)) as m:
        watchers = [await m.submit(steps(world, 400, name=f"p{i}")) for i in range(16)]
        for w in watchers:
            await w.wait()
    # stop() has returned: the store must be still. Remove it, as a test's teardown would.
    first = count(root)
    try:
        shutil.rmtree(root)
        error = None
    except OSError as e:
        error = e
    print(f"files right after stop(): {first}; shutil.rmtree(store) after stop(): {error!r}")
    shutil.rmtree(root, ignore_errors=True)
    await asyncio.sleep(0.3)
    return 1 if error is not None else 0

sys.exit(asyncio.run(main()))
