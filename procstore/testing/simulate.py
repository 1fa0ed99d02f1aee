"""`python -m procstore.testing.simulate`: seeded cluster simulations, from the command line.

    python -m procstore.testing.simulate --seeds 200            # seeds 0..199, the example machines
    python -m procstore.testing.simulate --seed 4711            # replay a seed (or several), with its schedule
    python -m procstore.testing.simulate --minutes 30           # soak: new seeds until the time is up
    python -m procstore.testing.simulate --world ledger --seeds 500

Prints the seeds per second and every failure (its seed, problems, schedule and replay
command); exits 1 if any seed failed.
"""

from __future__ import annotations

import argparse
import itertools
import os
import sys
import time
from collections.abc import Callable, Iterator
from typing import TextIO

from procstore.testing.cluster import ClusterSimulation, SimulationResult
from procstore.testing.cluster_world_api import LedgerWorld, World


def _machines() -> World:
    from procstore_machines.simulation import MachinesWorld

    return MachinesWorld()


WORLDS: dict[str, Callable[[], World]] = {"machines": _machines, "ledger": LedgerWorld}


def simulation_for(world: str) -> ClusterSimulation:
    """The simulation of a named world, with the command that replays one of its seeds."""
    return ClusterSimulation(
        WORLDS[world], replay=f"python -m procstore.testing.simulate --world {world} --seed {{seed}}"
    )


def run_seeds(simulation: ClusterSimulation, seeds: Iterator[int], out: TextIO, *, verbose: bool = False) -> int:
    """Run `seeds` (until exhausted), print failures and the rate; return how many failed."""
    started = time.perf_counter()
    ran = failed = 0
    for seed in seeds:
        result: SimulationResult = simulation.run(seed)
        ran += 1
        if not result.ok:
            failed += 1
            print(result.report(), file=out, flush=True)
        elif verbose:
            print(result.report(full=True), file=out, flush=True)
    elapsed = max(time.perf_counter() - started, 1e-9)
    print(f"{ran} seeds in {elapsed:.1f}s ({ran / elapsed:.1f} seeds/s), {failed} failed", file=out, flush=True)
    return failed


def _until(minutes: float, first: int) -> Iterator[int]:
    deadline = time.monotonic() + minutes * 60
    for seed in itertools.count(first):
        if time.monotonic() >= deadline:
            return
        yield seed


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m procstore.testing.simulate", description=__doc__.split("\n")[0])
    parser.add_argument("--seeds", type=int, default=100, help="how many seeds to run (from --first)")
    parser.add_argument("--first", type=int, default=0, help="the first seed of --seeds or --minutes")
    parser.add_argument("--seed", type=int, nargs="+", help="run these seeds and print each one's report")
    parser.add_argument("--minutes", type=float, help="soak: run new seeds for this long")
    parser.add_argument("--world", choices=sorted(WORLDS), default="machines")
    args = parser.parse_args(argv)
    simulation = simulation_for(args.world)
    if args.seed is not None:
        seeds: Iterator[int] = iter(args.seed)
    elif args.minutes is not None:
        seeds = _until(args.minutes, args.first)
    else:
        seeds = iter(range(args.first, args.first + args.seeds))
    return 1 if run_seeds(simulation, seeds, sys.stdout, verbose=args.seed is not None) else 0


def _with_fixed_hashing() -> None:
    """Run again under `PYTHONHASHSEED=0` unless already: the order in which a set of ids is
    walked follows string hashing, which Python draws per process, and a seed must replay
    the same schedule in every process."""
    if os.environ.get("PYTHONHASHSEED") != "0":
        os.execve(
            sys.executable,
            [sys.executable, "-m", "procstore.testing.simulate", *sys.argv[1:]],
            {**os.environ, "PYTHONHASHSEED": "0"},
        )


if __name__ == "__main__":
    _with_fixed_hashing()
    sys.exit(main())
