"""The floor of local throughput at N concurrent 5-step procedures, by ablation.

`python -m benchmarks.throughput_floor --n 1000 --runs 3` times, in one process and
interleaved run by run, N 5-step procedures submitted at once on a local directory (as
`benchmarks.suites.throughput` does) as shipped, then with parts of procstore's work removed
alone and together (monkeypatched for that timing only: MEASUREMENT ONLY, each removal gives
up what the table says), against the raw baseline: the same file operations from plain
threads (`benchmarks.rawdisk.same_operations`, the best of 8 and 16 threads, which won every
run of the full benchmark). Each row prints procedures per second and the event loop's CPU
per procedure (best / median), and its ratio to the raw baseline.

The raw baseline does a 5-step procedure's six durable creates and its deletion. procstore
also writes each procedure's end record (a seventh durable create, in `history/`), reads
whether the id has one at submit, and looks for an operator request before each attempt.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import statistics
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import click

from benchmarks import rawdisk
from benchmarks.floors import _ANSWERED, patched
from benchmarks.procedures import new_loop
from benchmarks.recovery_ablation import collector_off
from benchmarks.stores import Target
from benchmarks.suites import MESSAGE, manager, trash_emptied
from procstore import ProcedureWithId
from procstore._runtime.operator import RequestLooks
from procstore.store.history import HistoryStore

RAW_THREADS = (8, 16)


async def _nothing(*_args: Any, **_kwargs: Any) -> None:
    return None


async def _false(*_args: Any, **_kwargs: Any) -> bool:
    return False


@dataclass(frozen=True)
class Part:
    name: str
    gives_up: str
    removed: Callable[[], AbstractContextManager[None]]


PARTS = [
    Part("the end record (a durable create in history/)", "history; an ended id never runs again",
         lambda: patched([(HistoryStore, "put_many", _nothing)])),
    Part("the submit's read of the id's end record", "an ended id never runs again",
         lambda: patched([(HistoryStore, "has_ended", _false)])),
    Part("the look for an operator request per attempt", "a request is seen before the next attempt",
         lambda: patched([(RequestLooks, "get", lambda self, pid: _ANSWERED)])),
    Part("the garbage collector (disabled)", "none (memory is not collected while off)", collector_off),
]  # fmt: skip


@contextlib.contextmanager
def removed(parts: list[Part]) -> Iterator[None]:
    with contextlib.ExitStack() as stack:
        for part in parts:
            stack.enter_context(part.removed())
        yield


async def measure(n: int, runs: int) -> None:
    rows: list[tuple[str, list[Part]]] = [("as shipped", [])]
    rows += [(f"- {part.name}", [part]) for part in PARTS]
    rows.append(("- all of the above", PARTS))
    rates: dict[str, list[float]] = {name: [] for name, _ in rows}
    cpu: dict[str, list[float]] = {name: [] for name, _ in rows}
    raw: list[float] = []
    with tempfile.TemporaryDirectory(prefix="procstore-floor-") as tmp:
        target = Target("local", f"{tmp}/")
        async with manager(target.url(), target) as m:
            store = m.store.store
            for _ in range(runs):
                for name, parts in rows:
                    with removed(parts):
                        started, loop_cpu = time.perf_counter(), time.thread_time()
                        watchers = await asyncio.gather(*(m.submit(ProcedureWithId.new(new_loop(5))) for _ in range(n)))
                        await asyncio.gather(*(w.wait() for w in watchers))
                        await trash_emptied(store)
                        rates[name].append(n / (time.perf_counter() - started))
                        cpu[name].append(1e3 * (time.thread_time() - loop_cpu) / n)
                    gc.collect()
                by_threads = await asyncio.to_thread(
                    rawdisk.same_operations, Path(tmp) / "raw", n, MESSAGE, RAW_THREADS
                )
                raw.append(max(by_threads.values()))
    raw_best, raw_median = max(raw), statistics.median(raw)
    print(f"local, N={n} concurrent 5-step procedures, {runs} interleaved runs (best / median):")
    print(f"  {'raw: the same file operations from threads':58} {raw_best:7.1f} / {raw_median:7.1f} procedures/s")
    for name, _ in rows:
        best, median = max(rates[name]), statistics.median(rates[name])
        loop = f"{min(cpu[name]):.2f} / {statistics.median(cpu[name]):.2f} ms"
        print(f"  {name:58} {best:7.1f} / {median:7.1f} procedures/s  x raw {best / raw_best:.2f} / "
              f"{median / raw_median:.2f}  loop CPU {loop}")  # fmt: skip
    for part in PARTS:
        print(f"  removing {part.name} gives up: {part.gives_up}")


@click.command()
@click.option("--n", default=1000, show_default=True, help="Procedures submitted at once.")
@click.option("--runs", default=3, show_default=True, help="Interleaved runs of each row.")
def main(n: int, runs: int) -> None:
    asyncio.run(measure(n, runs))


if __name__ == "__main__":
    main()
