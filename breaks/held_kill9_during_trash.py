"""Held: kill -9 at random points while a manager ends and trashes 100-step procedures.
Every procedure whose wait() returned is gone or still reads committed; trash is never listed,
and the next start() empties it. Run: PYTHONPATH=. .venv/bin/python breaks/held_kill9_during_trash.py"""
import asyncio, os, random, signal, subprocess, sys, tempfile, time
from procstore.store import open_state_store
from procstore.store.keys import KeysByProcedure

CHILD = r'''
import asyncio, sys
from procstore import ProcedureManager
from tests.procedures import World, register_all
from tests.runtime.helpers import steps
async def main():
    w = World.new()
    async with register_all(ProcedureManager(sys.argv[1])) as m:
        async def one(i):
            p = steps(w, 100, name=f"p{i}")
            await (await m.submit(p)).wait()
            print(p.id, flush=True)
        await asyncio.gather(*(one(i) for i in range(40)))
asyncio.run(main())
'''


async def check(root: str, done: set[str]) -> list[str]:
    store = open_state_store(root)
    keys = await store.walk("procedure/")
    bad = [k for k in keys if ".trash" in k]
    grouped = KeysByProcedure.group("procedure/", keys)
    for pid, ks in grouped.steps.items():
        top = max(ks)
        if str(pid) in done and top[1].value != "commit":
            bad.append(f"{pid}: finished but highest key is {top}")
    return bad


problems = []
for run in range(20):
    root = tempfile.mkdtemp()
    child = subprocess.Popen([sys.executable, "-c", CHILD, root], stdout=subprocess.PIPE, text=True, env={**os.environ, "PYTHONPATH": "."})
    time.sleep(random.uniform(0.8, 4.0))
    child.send_signal(signal.SIGKILL)
    out, _ = child.communicate()
    done = set(out.split())
    problems += asyncio.run(check(root, done))
    trash = os.path.join(root, ".trash")
    left = sum(len(f) for _d, _s, f in os.walk(trash)) if os.path.isdir(trash) else 0
    print(f"run {run}: {len(done)} finished before kill, {left} files in trash")
print(problems or "held")
