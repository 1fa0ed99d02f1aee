"""What spreading the procedure folders over the disk buys (`procstore.store.placement`).

N concurrent 5-step procedures on a local store as procstore runs them (its `procedure/`
folder marked `TOPDIR`), against the same on a store whose `procedure/` folder is left as
any other folder (the mark turned off for its manager), the runs interleaved in one process
on one disk: an ablation, reported beside the throughput rows, not a goal.
"""

from __future__ import annotations

import asyncio
from unittest import mock

from benchmarks.harness import Report, Row, interleaved
from benchmarks.procedures import new_loop
from benchmarks.stores import Target
from benchmarks.suites import manager, trash_emptied
from procstore import ProcedureManager, ProcedureWithId
from procstore.store import local


async def ablation(report: Report, target: Target, n: int, repeats: int = 3) -> None:
    spread, unspread = manager(target.url(), target), manager(target.url(), target)

    async def run(m: ProcedureManager) -> None:
        watchers = await asyncio.gather(*(m.submit(ProcedureWithId.new(new_loop(5))) for _ in range(n)))
        await asyncio.gather(*(w.wait() for w in watchers))
        await trash_emptied(m.store.store)

    async def run_unspread() -> None:
        with mock.patch.object(local, "spread_subfolders", lambda path: False):
            await run(unspread)

    async with spread, unspread:
        times, unspread_times = await interleaved(repeats, lambda: run(spread), run_unspread)
    report.add(
        Row("throughput", f"local: N={n} concurrent 5-step procedures, procedure folders not spread (ablation)",
            [n / t for t in unspread_times], "procedures/s", [n / t for t in times],
            "the same, folders spread (procstore as it is)", higher_is_better=True)
    )  # fmt: skip
