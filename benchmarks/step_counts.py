"""The cost of one persisted step on the event loop, measured without the machine's noise.

`python -m benchmarks.step_counts --store memory --steps 100 --runs 5` runs a lone
`steps`-step procedure against the raw put loop of the same writes (`steps + 1` puts of the
same bytes, one after the other), on one store, interleaved, and prints per write:

- counts (deterministic, the same on a busy machine as on a quiet one), from
  `sys.setprofile` over one procedure: coroutines started and resumed, plain Python calls,
  tasks and futures created, and the collector's passes;
- the event loop thread's CPU time (`time.thread_time()`), best and median of `runs`
  (`--at-once N`: N procedures at a time against N raw put loops at a time):
  a local store's file work runs in its own threads and is left out, as it is of the raw
  loop's figure.

For an A/B of two commits, copy this file into the other checkout and run both
alternately (old, new, old, new...): the counts need one run each, the CPU several.
"""

from __future__ import annotations

import asyncio
import dis
import gc
import json
import statistics
import sys
import tempfile
import time
import types
from collections import Counter
from collections.abc import Awaitable, Callable
from typing import Any

import click

from benchmarks.stores import Target
from benchmarks.suites import manager, one_procedure, raw_cleanup, raw_writes, trash_emptied

_COROUTINE = 0x80 | 0x200  # CO_COROUTINE | CO_ITERABLE_COROUTINE (a `types.coroutine` generator)
_FIRST_RESUME: dict[types.CodeType, int] = {}


def _first_resume(code: types.CodeType) -> int:
    """The offset of the code's first RESUME: a coroutine's frame is there when it starts, and
    at a later RESUME each time it is resumed (3.11 emits no event when one is created)."""
    offset = _FIRST_RESUME.get(code)
    if offset is None:
        offset = next((i.offset for i in dis.get_instructions(code) if i.opname == "RESUME"), 0)
        _FIRST_RESUME[code] = offset
    return offset


class Counts:
    """Counts Python-level events while installed with `sys.setprofile`."""

    def __init__(self) -> None:
        self.counts: Counter[str] = Counter()
        self.started: Counter[str] = Counter()
        """Coroutines started, by qualified name (`--detail`)."""
        self.calls: Counter[str] = Counter()
        """Plain calls, by qualified name (`--detail`)."""

    def __call__(self, frame: types.FrameType, event: str, arg: Any) -> None:
        if event != "call":
            return
        code = frame.f_code
        if code.co_flags & _COROUTINE:
            started = frame.f_lasti <= _first_resume(code)
            self.counts["coroutines started" if started else "coroutines resumed"] += 1
            if started:
                self.started[code.co_qualname] += 1
            return
        self.counts["plain calls"] += 1
        self.calls[code.co_qualname] += 1
        name = code.co_name
        if name == "create_task":
            self.counts["tasks"] += 1
        elif name == "create_future" or (name == "__init__" and "Future" in code.co_qualname):
            self.counts["futures"] += 1

    def gc_pass(self, phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            self.counts[f"gc passes (gen {info['generation']})"] += 1


async def counted(timing: Callable[[], Awaitable[Any]], per: int, detail: bool = False) -> dict[str, Any]:
    """Events per unit (`per` of them) of one run of `timing`; with `detail`, by name too."""
    counts = Counts()
    gc.callbacks.append(counts.gc_pass)
    sys.setprofile(counts)
    try:
        await timing()
    finally:
        sys.setprofile(None)
        gc.callbacks.remove(counts.gc_pass)
    result: dict[str, Any] = {name: round(n / per, 2) for name, n in sorted(counts.counts.items())}
    if detail:
        for what, by_name in (("coroutines started by name", counts.started), ("plain calls by name", counts.calls)):
            result[what] = {name: round(n / per, 2) for name, n in by_name.most_common() if n >= per / 2}
    return result


async def loop_cpu(timing: Callable[[], Awaitable[Any]]) -> tuple[float, float]:
    """The calling thread's CPU seconds over one run of `timing`, and the run's wall seconds."""
    started, wall = time.thread_time(), time.perf_counter()
    await timing()
    return time.thread_time() - started, time.perf_counter() - wall


async def measure(
    target: Target, steps: int, runs: int, telemetry: bool, detail: bool, at_once: int = 1
) -> dict[str, Any]:
    """Per write, over `at_once` procedures at a time (and as many raw put loops)."""
    writes = (steps + 1) * at_once  # each: the submitted state, steps - 1 persisted steps, the commit
    async with manager(target.url(), target, telemetry=telemetry) as m:
        store = m.store.store
        one = one_procedure(m, steps)

        async def settled() -> None:
            await raw_cleanup(store)()
            await trash_emptied(store)

        def procedure() -> Awaitable[Any]:
            return one() if at_once == 1 else asyncio.gather(*(one() for _ in range(at_once)))

        def raw() -> Awaitable[Any]:
            loops = [raw_writes(store, steps + 1) for _ in range(at_once)]
            return loops[0] if at_once == 1 else asyncio.gather(*loops)

        for warm_up in (procedure, raw):  # imports, caches, the store's threads and folders
            await warm_up()
            await settled()
        counts = {"procedure": await counted(procedure, writes, detail)}
        await settled()
        counts["raw put loop"] = await counted(raw, writes)
        await settled()
        cpu: dict[str, list[float]] = {"procedure": [], "raw put loop": []}
        rates: dict[str, list[float]] = {"procedure": [], "raw put loop": []}
        for _ in range(runs):  # interleaved
            for name, timing in (("procedure", procedure), ("raw put loop", raw)):
                thread, wall = await loop_cpu(timing)
                cpu[name].append(1e6 * thread / writes)
                rates[name].append(at_once / wall)
                await settled()
    figures = {name: {"best": min(xs), "median": statistics.median(xs)} for name, xs in cpu.items()}
    summary = {name: {**{k: round(v, 2) for k, v in figures[name].items()}, "runs": [round(x, 2) for x in xs]}
               for name, xs in cpu.items()}  # fmt: skip
    ratio = {how: round(figures["procedure"][how] / figures["raw put loop"][how], 3) for how in ("best", "median")}
    return {
        "store": target.kind,
        "steps": steps,
        "at once": at_once,
        "counts per write": counts,
        "loop CPU per write (us)": summary,
        "ratio": ratio,
        "procedures (or raw put loops) per second": {name: [round(x, 1) for x in xs] for name, xs in rates.items()},
    }


@click.command()
@click.option("--store", "kind", type=click.Choice(["memory", "local"]), default="memory")
@click.option("--steps", default=100, show_default=True)
@click.option("--runs", default=5, show_default=True, help="CPU runs of each, interleaved.")
@click.option("--telemetry/--no-telemetry", default=True, show_default=True, help="As the benchmarks' managers.")
@click.option("--at-once", default=1, show_default=True, help="Procedures (and raw put loops) run concurrently.")
@click.option("--detail", is_flag=True, help="Also by name (those at least once per two writes).")
def main(kind: str, steps: int, runs: int, telemetry: bool, at_once: int, detail: bool) -> None:
    """Counts and loop CPU per write of a lone procedure against the raw put loop (one JSON line)."""
    with tempfile.TemporaryDirectory(prefix="procstore-step-counts-") as tmp:
        target = Target(kind, "memory://" if kind == "memory" else f"{tmp}/")
        result = asyncio.run(measure(target, steps, runs, telemetry, detail, at_once))
    print(json.dumps(result))


if __name__ == "__main__":
    main()
