"""The benchmarks. Every judged figure is a ratio to a baseline measured in the same run.

- step overhead: one persisted step vs one raw put of the same bytes on the same store;
- throughput: N concurrent 5-step procedures vs N concurrent sequences of the same raw writes;
- recovery: loading N unfinished procedures vs listing and reading the same keys raw;
- memory: resident memory per in-flight procedure.
"""

from __future__ import annotations

import asyncio
import gc
import importlib.util
import json
import sys
import time
import uuid

from benchmarks.harness import Report, Row, rss_bytes, timed
from benchmarks.procedures import GATES, Loop, new_loop
from benchmarks.stores import Target
from procstore import ProcedureId, ProcedureManager, ProcedureWithId
from procstore.store import ProcedureMessage, ProcedureStore, open_state_store

MESSAGE = ProcedureMessage("bench::Loop", new_loop(5).dump(), None, 1).encode()


def manager(url: str, target: Target, **options: float) -> ProcedureManager:
    m = ProcedureManager(url, target.options, max_running_procedures=1_000_000, **options)  # type: ignore[arg-type]
    m.register(Loop)
    return m


async def step_overhead(report: Report, target: Target, quick: bool) -> None:
    steps = 100 if quick else 400
    if target.kind == "s3":
        steps //= 4
    url = target.url()
    async with manager(url, target) as m:
        elapsed = await timed(lambda: _run_one(m, new_loop(steps)))
        writes = steps + 1  # the submitted state, steps - 1 persisted steps, the commit
        store = m.store.store
        folder = f"raw/{uuid.uuid4()}/"

        async def raw() -> None:
            for i in range(writes):
                await store.put(f"{folder}{i:010d}.step", MESSAGE)

        raw_elapsed = await timed(raw)
    report.add(
        Row("step overhead", f"{target.kind}: one persisted step", 1e3 * elapsed / writes, "ms",
            1e3 * raw_elapsed / writes, "raw put, same bytes, same store", "<= 1.25 (local, s3)")
    )  # fmt: skip


async def _run_one(m: ProcedureManager, procedure: Loop) -> None:
    await (await m.submit(ProcedureWithId.new(procedure))).wait()


async def throughput(report: Report, target: Target, n: int) -> None:
    url = target.url()
    async with manager(url, target) as m:

        async def run_all() -> None:
            watchers = [await m.submit(ProcedureWithId.new(new_loop(5))) for _ in range(n)]
            await asyncio.gather(*(w.wait() for w in watchers))

        elapsed = await timed(run_all)
        store = m.store.store

        async def raw_one() -> None:
            folder = f"raw/{uuid.uuid4()}/"
            for i in range(6):  # submitted state, 4 steps, commit: what a 5-step procedure writes
                await store.put(f"{folder}{i:010d}.step", MESSAGE)

        raw_elapsed = await timed(lambda: asyncio.gather(*(raw_one() for _ in range(n))))
    report.add(
        Row("throughput", f"{target.kind}: N={n} concurrent 5-step procedures", n / elapsed, "procedures/s",
            n / raw_elapsed, "raw writes, same count, same concurrency", "")
    )  # fmt: skip
    if target.kind == "local":
        dbos_rate = await dbos_throughput(target, n)
        if dbos_rate is not None:
            report.add(
                Row("throughput", f"local: N={n}, procstore vs DBOS (SQLite)", n / elapsed, "procedures/s",
                    dbos_rate, "DBOS 5-step workflows/s, same disk", ">= 5 (N=1000)")
            )  # fmt: skip


async def dbos_throughput(target: Target, n: int) -> float | None:
    """DBOS's workflows per second for the same work, in a child process; None without dbos."""
    if importlib.util.find_spec("dbos") is None:
        return None
    db = f"{target.base}dbos-{uuid.uuid4().hex}.sqlite"
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "benchmarks.dbos_peer", str(n), db,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.DEVNULL,
    )  # fmt: skip
    out, _ = await proc.communicate()
    lines = [line for line in out.decode().splitlines() if line.startswith("{")]
    return float(json.loads(lines[-1])["per_second"]) if proc.returncode == 0 and lines else None


async def recovery(report: Report, target: Target, n: int) -> None:
    url = target.url()
    store = ProcedureStore(open_state_store(url, target.options))
    gate = f"gate-{uuid.uuid4().hex}"
    GATES[gate] = asyncio.Event()
    data = new_loop(5, gate).dump()
    ids = [ProcedureId.random() for _ in range(n)]
    sem = asyncio.Semaphore(64)

    async def write(pid: ProcedureId) -> None:
        async with sem:
            for step in range(3):
                await store.store_procedure(pid, step, Loop.type_name, data, None)

    await asyncio.gather(*(write(pid) for pid in ids))
    m = manager(url, target)
    load = await timed(m.start)
    started = time.perf_counter()
    GATES[gate].set()
    await asyncio.gather(*(w.wait() for pid in ids if (w := m.procedure_watcher(pid)) is not None))
    complete = time.perf_counter() - started
    await m.stop()

    raw_store = open_state_store(url, target.options)

    async def raw() -> None:
        keys = await raw_store.walk("procedure/")
        await raw_store.get_many(keys)

    # The raw reader lists and reads every key: the floor for any loader of this layout.
    await asyncio.gather(*(write(pid) for pid in ids[: n // 2]))  # something to read again
    raw_elapsed = await timed(raw)
    report.add(Row("recovery", f"{target.kind}: load {n} unfinished procedures", load, "s", raw_elapsed,
                   "raw list + read", "<= 2 (local, N=10000)"))  # fmt: skip
    report.add(Row("recovery", f"{target.kind}: run {n} recovered procedures to the end", complete, "s"))


async def memory(report: Report, n: int) -> None:
    gate = f"gate-{uuid.uuid4().hex}"
    GATES[gate] = asyncio.Event()
    url = f"memory://bench-{uuid.uuid4().hex}/"
    m = manager(url, Target("memory", url))
    async with m:
        gc.collect()
        before = rss_bytes()
        watchers = [await m.submit(ProcedureWithId.new(new_loop(2, gate))) for _ in range(n)]
        await asyncio.sleep(0.2)
        gc.collect()
        after = rss_bytes()
        GATES[gate].set()
        await asyncio.gather(*(w.wait() for w in watchers))
    report.add(Row("memory", f"resident memory per in-flight procedure, N={n}", (after - before) / n / 1024, "KiB",
                   goal="<= 20 KiB (N=10000)"))  # fmt: skip
