"""Resident memory per in-flight procedure: `python -m benchmarks.inflight N`.

Runs in its own interpreter: in the benchmark process, earlier runs leave freed memory
behind that new objects would reuse, hiding their cost. Prints one JSON line.
"""

from __future__ import annotations

import asyncio
import gc
import json
import sys

from benchmarks.harness import rss_bytes
from benchmarks.procedures import GATES, Loop, new_loop
from procstore import ProcedureManager, ProcedureWithId

GATE = "inflight"


async def main(n: int) -> None:
    GATES[GATE] = asyncio.Event()
    manager = ProcedureManager("memory://inflight/", max_running_procedures=n + 1)
    manager.register(Loop)
    async with manager:
        gc.collect()
        before = rss_bytes()
        watchers = await asyncio.gather(*(manager.submit(ProcedureWithId.new(new_loop(2, GATE))) for _ in range(n)))
        await asyncio.sleep(0.2)
        gc.collect()
        after = rss_bytes()
        GATES[GATE].set()
        await asyncio.gather(*(w.wait() for w in watchers))
    print(json.dumps({"n": n, "kib_per_procedure": (after - before) / n / 1024}), flush=True)


if __name__ == "__main__":
    asyncio.run(main(int(sys.argv[1])))
