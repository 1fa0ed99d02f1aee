"""Step overhead, throughput and memory. Every judged figure is a ratio to a baseline
measured in the same run, on the same store:

- step overhead: one persisted step vs one raw put of the same bytes;
- throughput: N concurrent 5-step procedures vs N concurrent sequences of the same raw
  writes, and vs DBOS (SQLite) running the same 5-step workflow on the same disk;
- memory: resident memory per in-flight procedure;
- lease: one persisted step of a manager with a lease vs of a manager without one.

Recovery lives in `benchmarks.recovery`.
"""

from __future__ import annotations

import asyncio
import importlib.util
import uuid
from collections.abc import Awaitable, Callable

from benchmarks.harness import Report, Row, run_child, timed
from benchmarks.procedures import Loop, new_loop
from benchmarks.stores import Target
from procstore import Lease, ProcedureManager, ProcedureWithId
from procstore.store import ProcedureMessage, StateStore

RAW = "raw/"
"""Where the raw baselines write, beside `procedure/`."""
MESSAGE = ProcedureMessage("bench::Loop", new_loop(5).dump(), None, 1).encode()
"""What one persisted step of a `Loop` writes (~150 bytes); the raw baselines write it too."""


def manager(url: str, target: Target, lease: Lease | None = None, telemetry: bool = True) -> ProcedureManager:
    m = ProcedureManager(url, target.options, max_running_procedures=1_000_000, lease=lease, telemetry=telemetry)
    m.register(Loop)
    return m


def one_procedure(m: ProcedureManager, steps: int) -> Callable[[], Awaitable[None]]:
    """A timing: submit one `steps`-step procedure to `m` and wait for its end."""

    async def procedure() -> None:
        await (await m.submit(ProcedureWithId.new(new_loop(steps)))).wait()

    return procedure


async def best_of(
    repeats: int, *timings: Callable[[], Awaitable[None]], cleanup: Callable[[], Awaitable[None]] | None = None
) -> list[float]:
    """The fastest of `repeats` runs of each timing, interleaved so that drift hits all alike.

    `cleanup` runs, untimed, after each timing: memory://'s operations scan every key it
    holds, so leftovers would slow each later measurement down.
    """
    best = [float("inf")] * len(timings)
    for _ in range(repeats):
        for i, fn in enumerate(timings):
            best[i] = min(best[i], await timed(fn))
            if cleanup is not None:
                await cleanup()
    return best


def raw_cleanup(store: StateStore) -> Callable[[], Awaitable[None]]:
    """Delete what `raw_writes` left in `store`."""

    async def cleanup() -> None:
        await store.batch_delete(await store.walk(RAW))

    return cleanup


async def raw_writes(store: StateStore, count: int) -> None:
    """`count` puts of a step message into a new folder, one after the other."""
    folder = f"{RAW}{uuid.uuid4()}/"
    for i in range(count):
        await store.put(f"{folder}{i:010d}.step", MESSAGE)


async def step_overhead(report: Report, target: Target, steps: int) -> None:
    """One procedure of `steps` steps, start to deleted, vs the same number of raw puts."""
    writes = steps + 1  # the submitted state, steps - 1 persisted steps, the commit
    async with manager(target.url(), target) as m:

        async def procedure() -> None:
            await (await m.submit(ProcedureWithId.new(new_loop(steps)))).wait()

        elapsed, raw_elapsed = await best_of(
            3, procedure, lambda: raw_writes(m.store.store, writes), cleanup=raw_cleanup(m.store.store)
        )
    per_step, raw_per_step = 1e3 * elapsed / writes, 1e3 * raw_elapsed / writes
    report.add(
        Row("step overhead", f"{target.kind}: one persisted step, {steps}-step procedure", per_step, "ms",
            raw_per_step, "raw put, same bytes, same store", "<= 1.25 (local, s3)")
    )  # fmt: skip
    report.scale(f"{target.kind}: persisted step (N = steps)", "ms/step", steps, per_step)
    report.scale(f"{target.kind}: raw put (N = puts)", "ms/put", steps, raw_per_step)


async def lease_overhead(report: Report, target: Target, steps: int) -> None:
    """One procedure of `steps` steps run by a leader (each write checked against the lease,
    again right before it is sent, and each step's attempt too) vs by a manager without a
    lease; each manager on its own empty store of the same kind, the runs interleaved."""
    async with manager(target.url(), target) as plain, manager(target.url(), target, Lease(ttl=10)) as leader:
        await leader.wait_until_leading()

        leased_elapsed, plain_elapsed = await best_of(3, one_procedure(leader, steps), one_procedure(plain, steps))
    writes = steps + 1
    report.add(
        Row("lease", f"{target.kind}: one persisted step of a leader, {steps}-step procedure",
            1e3 * leased_elapsed / writes, "ms", 1e3 * plain_elapsed / writes, "the same, no lease", "")
    )  # fmt: skip


async def throughput(report: Report, target: Target, n: int, *, with_dbos: bool) -> None:
    """N 5-step procedures submitted at once, vs N concurrent sequences of six raw puts."""
    repeats = 5 if n == 1 else 1  # a single procedure is all latency: take its best

    async with manager(target.url(), target) as m:

        async def procedures() -> None:
            watchers = await asyncio.gather(*(m.submit(ProcedureWithId.new(new_loop(5))) for _ in range(n)))
            await asyncio.gather(*(w.wait() for w in watchers))

        # Six puts: what a 5-step procedure writes (submitted state, four steps, commit).
        async def raw() -> None:
            await asyncio.gather(*(raw_writes(m.store.store, 6) for _ in range(n)))

        elapsed, raw_elapsed = await best_of(repeats, procedures, raw, cleanup=raw_cleanup(m.store.store))
    rate = n / elapsed
    report.add(
        Row("throughput", f"{target.kind}: N={n} concurrent 5-step procedures", rate, "procedures/s",
            n / raw_elapsed, "raw writes, same count, same concurrency", "")
    )  # fmt: skip
    report.scale(f"{target.kind}: 5-step procedure, N at once", "ms/procedure", n, 1e3 * elapsed / n)
    report.scale(f"{target.kind}: six raw puts, N at once", "ms/sequence", n, 1e3 * raw_elapsed / n)
    if with_dbos:
        dbos = await dbos_run(target, n)
        if dbos is not None:
            report.add(
                Row("throughput", f"local: N={n}, procstore vs DBOS (SQLite)", rate, "procedures/s",
                    dbos, "DBOS 5-step workflows/s, same disk", ">= 5 (N=1000)")
            )  # fmt: skip
            report.scale("DBOS (SQLite): 5-step workflow, N at once", "ms/workflow", n, 1e3 / dbos)


def dbos_installed() -> bool:
    return importlib.util.find_spec("dbos") is not None


async def dbos_run(target: Target, n: int) -> float | None:
    """DBOS's workflows per second for the same work, in a child process; None without dbos."""
    if not dbos_installed():
        return None
    result = await run_child("benchmarks.dbos_peer", "run", str(n), f"{target.base}dbos-{uuid.uuid4().hex}.sqlite")
    return None if result is None else float(result["per_second"])


async def memory(report: Report, n: int) -> None:
    """Resident memory growth while n procedures wait at their first step (memory://, own process)."""
    result = await run_child("benchmarks.inflight", str(n))
    if result is None:
        print(f"  memory: the child process failed at N={n}; skipped")
        return
    per_procedure = float(result["kib_per_procedure"])
    report.add(Row("memory", f"resident memory per in-flight procedure, N={n}", per_procedure, "KiB",
                   goal="<= 20 KiB (N=10000)"))  # fmt: skip
    report.scale("resident memory, N in flight", "KiB/procedure", n, per_procedure)
