"""A manager that is killed: `python -m benchmarks.crashed_manager URL N`.

Submits N 5-step `Loop`s that stop before their third step (three keys stored each), prints
`READY` once all of them are there, and waits to be killed with SIGKILL by the recovery
benchmark, which then measures a new manager picking them up.
"""

from __future__ import annotations

import asyncio
import sys

from benchmarks.procedures import Loop, new_loop, wait_for_arrivals
from procstore import ProcedureManager, ProcedureWithId

GATE = "recovery"


async def main(url: str, n: int) -> None:
    manager = ProcedureManager(url, max_running_procedures=n + 1)
    manager.register(Loop)
    await manager.start()
    limit = asyncio.Semaphore(256)  # many at once, without 10,000 writes queued in one go

    async def submit() -> None:
        async with limit:
            await manager.submit(ProcedureWithId.new(new_loop(5, GATE, block_at=2)))

    await asyncio.gather(*(submit() for _ in range(n)))
    await wait_for_arrivals(GATE, n)
    print("READY", flush=True)
    await asyncio.sleep(3600)  # killed long before this


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], int(sys.argv[2])))
