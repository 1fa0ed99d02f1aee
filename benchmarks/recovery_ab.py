"""`python -m benchmarks.recovery_ab DIR OLD_CHECKOUT NEW_CHECKOUT...`: an A/B of recovery's
load against the raw list-and-read (`benchmarks.recovery_profile`) between checkouts (two,
or a series of commits), their processes alternating (old, new, old, new...) on one store in
DIR, so that the machine's other work hits all alike. Copy `recovery_profile.py` into a
checkout's `benchmarks/` first if it lacks it. Prints, for each, the ratio best to best and
median to median over every run, each process's own, and the load's event loop CPU.
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys

import click


@click.command()
@click.argument("folder")
@click.argument("checkouts", nargs=-1, required=True)
@click.option("-n", "count", default=10_000, show_default=True, help="Procedures in the store.")
@click.option("--processes", default=3, show_default=True, help="Processes of each, alternating.")
@click.option("--runs", default=5, show_default=True, help="Interleaved runs in each process.")
def main(folder: str, checkouts: tuple[str, ...], count: int, processes: int, runs: int) -> None:
    """Alternate the checkouts' `benchmarks.recovery_profile` and summarise."""
    results: dict[str, list[dict[str, list[float]]]] = {where: [] for where in checkouts}
    command = [sys.executable, "-m", "benchmarks.recovery_profile", folder, "-n", str(count), "--runs", str(runs)]
    for _ in range(processes):
        for where in checkouts:
            out = subprocess.run(command, cwd=where, capture_output=True, text=True, check=True)
            results[where].append(json.loads(out.stdout.splitlines()[-1]))
    for where, runs_of in results.items():
        load = [x for r in runs_of for x in r["load"]]
        raw = [x for r in runs_of for x in r["raw"]]
        each = ", ".join(f"{min(r['load']) / min(r['raw']):.2f}" for r in runs_of)
        print(f"{where}: load best {min(load):.3f} s, median {statistics.median(load):.3f} s; "
              f"raw best {min(raw):.3f} s, median {statistics.median(raw):.3f} s")  # fmt: skip
        best, median = min(load) / min(raw), statistics.median(load) / statistics.median(raw)
        print(f"  ratio best to best {best:.2f}, median to median {median:.2f} (each process's best: {each})")
        cpu = [x for r in runs_of for x in r["load loop CPU"]]
        print(f"  the load's event loop CPU: best {min(cpu):.3f} s, median {statistics.median(cpu):.3f} s")


if __name__ == "__main__":
    main()
