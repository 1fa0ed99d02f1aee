"""A hand-written (hostile) folder whose latest step is just below the largest a key can
carry (2^32 - 1): recovery resumes it, and under a lease its first write skips a step
(df8157d) to 2^32, a key every reader ignores as no procedure's. The step's effect is
applied, its state is stored where nothing reads it, and the next start runs the same step
again (the folder still ends at 4294967294.step). Without a lease the same happens one step
later. The load check only refuses a latest key AT the largest step (guarantees.md,
Recovery: "a latest step at the largest a procedure can write" is a load problem, kept;
stores.md: a key above it "no procedure can write"; hostile writer: clear error, nothing
lost, nothing run twice)."""

import asyncio
import contextlib
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from procstore import Lease, ProcedureId
from procstore.store import ProcedureMessage, open_state_store
from procstore.testing import Fault, FaultyStore, kill_manager
from tests.procedures import World
from tests.support import manager_for

URL = "memory://break06/"
LATEST = 2**32 - 2


async def main() -> None:
    world = World.new()
    pid = ProcedureId.random()
    store = open_state_store(URL)
    data = f'{{"world": "{world.name}", "steps": 3, "at": 1}}'
    for step in (0, LATEST):
        await store.put(f"procedure/{pid}/{step:010}.step", ProcedureMessage("test::Steps", data, None, step).encode())
    # The first manager dies as it commits: its step 1 and 2 are stored above 2^32 - 1.
    crash = [Fault("crash", key=f"procedure/{pid}/*.commit")]
    for start, target in enumerate([FaultyStore(open_state_store(URL), faults=crash), URL]):
        manager = manager_for(target, lease=Lease(ttl=0.5, holder=f"cp-{start}"))
        await manager.start()
        for _ in range(100):  # until it leads
            if (watcher := manager.procedure_watcher(pid)) is not None:
                break
            await asyncio.sleep(0.05)
        try:
            print(f"start {start}:", await asyncio.wait_for(watcher.wait(), 5) if watcher else None)
        except BaseException as e:
            print(f"start {start}:", type(e).__name__, e)
        print("  problems:", [p.reason for p in manager.recovery_problems])
        await kill_manager(manager)
        with contextlib.suppress(BaseException):
            await manager.stop()
        await asyncio.sleep(0.6)  # the lease passes
        print("  keys:", sorted(k.rsplit("/", 1)[1] for k in await store.walk("procedure/")))
    print("effects:", dict(world.counts))
    assert world.counts["steps/1"] <= 1, f"step 1 ran {world.counts['steps/1']} times"
    assert not any(k.rsplit("/", 1)[1] > "4294967295" for k in await store.walk("procedure/")), "keys above 2^32-1"


asyncio.run(asyncio.wait_for(main(), 60))
print("held")
