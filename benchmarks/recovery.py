"""Recovery after a kill -9: a child manager stops N procedures half-way and is killed; then a
new manager loads them (vs listing and reading the same keys raw) and runs them to the end
(vs DBOS recovering the same number of pending workflows after its own kill -9)."""

from __future__ import annotations

import asyncio
import statistics
import time
import uuid
from collections.abc import Awaitable, Callable

from benchmarks.crashed_manager import GATE
from benchmarks.harness import Goal, Report, Row, interleaved, run_child, run_child_until_ready_then_kill, timed
from benchmarks.procedures import GATES
from benchmarks.stores import Target
from benchmarks.suites import dbos_installed, manager
from procstore import ProcedureManager
from procstore.store import StateStore, open_state_store


def raw_load(raw_store: StateStore) -> Callable[[], Awaitable[None]]:
    """The floor for any loader of this layout: list everything, read each procedure's
    latest key (the last in listing order; procstore also checks it parses)."""

    async def raw() -> None:
        latest = {key.rpartition("/")[0]: key for key in await raw_store.walk("procedure/")}
        await raw_store.get_many(list(latest.values()))

    return raw


class Loads:
    """Recovery's load of the store at `url` by a new manager each time (`load`, timed; the
    event loop's CPU of each in `loop_cpu`), checked and stopped between timings."""

    def __init__(self, url: str, target: Target, n: int) -> None:
        self.url, self.target, self.n = url, target, n
        self.started: list[ProcedureManager] = []
        self.loop_cpu: list[float] = []

    async def load(self) -> None:
        m = manager(self.url, self.target)
        cpu = time.thread_time()
        await m.start()
        self.loop_cpu.append(time.thread_time() - cpu)
        self.started.append(m)

    async def check_and_stop(self) -> None:
        """Untimed, between timings: the closed gate has kept the store as it was."""
        while self.started:
            m = self.started.pop()
            if len(m.list_procedures()) != self.n:
                raise AssertionError(f"loaded {len(m.list_procedures())} procedures, not {self.n}")
            await m.stop()


async def recovery(report: Report, target: Target, n: int, *, with_dbos: bool) -> None:
    url = target.url()
    if not await run_child_until_ready_then_kill("benchmarks.crashed_manager", url, str(n)):
        print(f"  recovery: the child manager did not get {n} procedures to their third step; skipped")
        return
    raw_store = open_state_store(url, target.options)

    GATES[GATE] = asyncio.Event()  # closed: loaded procedures wait, writing nothing
    loads = Loads(url, target, n)
    # Five: a load is mostly the event loop's CPU, and the raw reading mostly system calls, so
    # other work on the machine moves the ratio more than elsewhere.
    load_times, raw_times = await interleaved(5, loads.load, raw_load(raw_store), cleanup=loads.check_and_stop)
    await raw_store.close()

    GATES[GATE].set()
    m = manager(url, target)

    async def to_the_end() -> None:
        await m.start()
        watchers = [m.procedure_watcher(info.id) for info in m.list_procedures()]
        await asyncio.gather(*(w.wait() for w in watchers if w is not None))

    complete = await timed(to_the_end)
    await m.stop()

    row = Row("recovery", f"{target.name}: load {n} procedures left by a kill -9", load_times, "s", raw_times,
              "raw list + read of each latest key", Goal("<=", 1.5) if n >= 10_000 else None)  # fmt: skip
    report.add(row)
    report.scale(f"{target.name}: recovery load (start() returns)", "ms/procedure", n, 1e3 * row.median / n)
    report.scale(
        f"{target.name}: raw list + read latest keys", "ms/procedure", n, 1e3 * statistics.median(raw_times) / n
    )
    report.scale(f"{target.name}: recovery, load and run to the end", "ms/procedure", n, 1e3 * complete / n)
    dbos = await dbos_recovery(target, n) if with_dbos else None
    report.add(Row("recovery", f"{target.name}: {n} recovered procedures run to the end (from start()), one run",
                   [complete], "s", [dbos] if dbos else [], f"DBOS (SQLite) recovering {n} workflows after kill -9"
                   if dbos else ""))  # fmt: skip
    if dbos is not None:
        report.scale("DBOS (SQLite): recovery after kill -9, to the end", "ms/workflow", n, 1e3 * dbos / n)


async def dbos_recovery(target: Target, n: int) -> float | None:
    """Seconds for DBOS to finish n workflows that a killed process left pending; None if unavailable."""
    if not dbos_installed():
        return None
    db = f"{target.base}dbos-recovery-{uuid.uuid4().hex}.sqlite"
    if not await run_child_until_ready_then_kill("benchmarks.dbos_peer", "setup", str(n), db):
        return None
    result = await run_child("benchmarks.dbos_peer", "recover", str(n), db)
    if result is None or result["succeeded"] != n:
        return None
    return float(result["seconds"])
