"""`python -m benchmarks.recovery_profile DIR`: the recovery benchmark's measured phase alone,
re-runnable on one store, with an optional profile.

The first run fills `DIR` (a local directory) as `benchmarks.recovery` does: a child manager
stops N procedures before their third step and is killed. Every run after reuses it: a load
writes nothing while the gate is closed, so the store stays as the kill left it. Then the
load (`start()` of a new manager, as the benchmark times it) and the raw list-and-read are
timed, interleaved, and the last line printed is JSON: every run's seconds of each, the
event loop thread's CPU seconds in each load (`time.thread_time()`: what other work on the
machine moves least), and the ratio best to best and median to median. With `--profile
FILE`, one more load runs under cProfile (untimed) and its statistics go to FILE (and its
top functions to stderr).
`python -m benchmarks.recovery_ab OLD NEW DIR` alternates two checkouts' runs of this.
"""

from __future__ import annotations

import asyncio
import cProfile
import json
import pstats
import statistics
import sys
from pathlib import Path

import click

from benchmarks.crashed_manager import GATE
from benchmarks.harness import interleaved, run_child_until_ready_then_kill
from benchmarks.procedures import GATES
from benchmarks.recovery import Loads, raw_load
from benchmarks.stores import Target
from procstore.store import open_state_store


async def filled(url: str, n: int) -> None:
    """Fill the store at `url` with `n` procedures left by a kill -9, unless it holds them."""
    store = open_state_store(url)
    try:
        held = len({key.rpartition("/")[0] for key in await store.walk("procedure/")})
    finally:
        await store.close()
    if held == n:
        return
    if held:
        raise click.ClickException(f"{url} holds {held} procedures, not {n}: give an empty or matching folder")
    if not await run_child_until_ready_then_kill("benchmarks.crashed_manager", url, str(n)):
        raise click.ClickException(f"the child manager did not get {n} procedures to their third step")


async def measure(url: str, n: int, runs: int, profile: str | None) -> dict[str, object]:
    target = Target("local", url)
    raw_store = open_state_store(url)

    GATES[GATE] = asyncio.Event()  # closed: loaded procedures wait, writing nothing
    loads = Loads(url, target, n)
    load, check_and_stop = loads.load, loads.check_and_stop
    load_times, raw_times = await interleaved(runs, load, raw_load(raw_store), cleanup=check_and_stop)
    if profile is not None:
        profiler = cProfile.Profile()
        profiler.enable()
        await load()
        profiler.disable()
        await check_and_stop()
        profiler.dump_stats(profile)
        pstats.Stats(profile, stream=sys.stderr).sort_stats("tottime").print_stats(25)
    await raw_store.close()
    return {
        "load": load_times,
        "raw": raw_times,
        "load loop CPU": loads.loop_cpu[:runs],
        "ratio": {
            "best": min(load_times) / min(raw_times),
            "median": statistics.median(load_times) / statistics.median(raw_times),
        },
    }


@click.command()
@click.argument("folder", type=click.Path(file_okay=False, path_type=Path))
@click.option("-n", "count", default=10_000, show_default=True, help="Procedures in the store.")
@click.option("--runs", default=5, show_default=True, help="Interleaved runs of each.")
@click.option("--profile", type=click.Path(dir_okay=False), help="Profile one more load into this file.")
def main(folder: Path, count: int, runs: int, profile: str | None) -> None:
    """Time recovery's load against the raw list-and-read on the store in FOLDER."""
    folder.mkdir(parents=True, exist_ok=True)
    url = f"{folder.resolve()}/"
    asyncio.run(filled(url, count))
    print(json.dumps(asyncio.run(measure(url, count, runs, profile))), flush=True)


if __name__ == "__main__":
    main()
