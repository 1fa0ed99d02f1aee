"""`python -m benchmarks.step_counts_ab OLD_CHECKOUT NEW_CHECKOUT --store memory`: an A/B of
`benchmarks.step_counts` between two checkouts, their processes alternating (old, new, old,
new...), so that the machine's other work hits both alike. Copy `step_counts.py` into the
old checkout's `benchmarks/` first if it lacks it. Prints, for each, the counts per write
and the loop CPU per write over every run (best and median), with its ratio to the raw
put loop measured in the same processes.
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys

import click


@click.command()
@click.argument("old")
@click.argument("new")
@click.option("--store", type=click.Choice(["memory", "local"]), default="memory")
@click.option("--steps", default=100, show_default=True)
@click.option("--at-once", default=1, show_default=True, help="Procedures at a time.")
@click.option("--processes", default=3, show_default=True, help="Processes of each, alternating.")
@click.option("--runs", default=5, show_default=True, help="Interleaved runs in each process.")
def main(old: str, new: str, store: str, steps: int, at_once: int, processes: int, runs: int) -> None:
    """Alternate the two checkouts' `benchmarks.step_counts` and summarise."""
    results: dict[str, list[dict[str, object]]] = {old: [], new: []}
    command = [sys.executable, "-m", "benchmarks.step_counts", "--store", store, "--steps", str(steps)]
    command += ["--at-once", str(at_once)]
    for _ in range(processes):
        for where in (old, new):
            out = subprocess.run([*command, "--runs", str(runs)], cwd=where, capture_output=True, text=True, check=True)
            results[where].append(json.loads(out.stdout.splitlines()[-1]))
    for where, runs_of in results.items():
        cpu = {name: [x for r in runs_of for x in r["loop CPU per write (us)"][name]["runs"]]  # type: ignore[index]
               for name in ("procedure", "raw put loop")}  # fmt: skip
        ratios = [r["ratio"]["median"] for r in runs_of]  # type: ignore[index]
        counts = runs_of[0]["counts per write"]["procedure"]  # type: ignore[index]
        print(f"{where} ({store}, {steps} steps, {at_once} at once): counts per write {json.dumps(counts)}")
        for name, xs in cpu.items():
            print(f"  {name}: loop CPU per write best {min(xs):.1f} us, median {statistics.median(xs):.1f} us")
        best = min(cpu["procedure"]) / min(cpu["raw put loop"])
        median = statistics.median(cpu["procedure"]) / statistics.median(cpu["raw put loop"])
        each = ", ".join(f"{x:.2f}" for x in ratios)
        print(f"  ratio (each process's median run): {each}; best to best {best:.2f}, median to median {median:.2f}")
        rate = [x for r in runs_of for x in r["procedures (or raw put loops) per second"]["procedure"]]  # type: ignore[index]
        print(f"  procedures per second: best {max(rate):.1f}, median {statistics.median(rate):.1f}")


if __name__ == "__main__":
    main()
