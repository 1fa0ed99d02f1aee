"""What every benchmark shares: the machine's description, timing, and the results table.

Every judged figure is measured in at least three runs, interleaved with its baseline's
(run 1 of each, then run 2 of each...) so that drift and the machine's other work hit both
alike; the table shows the best and the median of the runs, and the worst, so that the
spread is visible. A goal is a bound on a ratio (or on a value) and is judged on both.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import operator
import os
import platform
import signal
import statistics
import sys
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).parent / "results"


@dataclass(frozen=True)
class Goal:
    """`ratio <= 1.25`, `ratio >= 10`, `value <= 10` (of the value itself, in its unit)."""

    op: str
    bound: float
    of: str = "ratio"

    def __str__(self) -> str:
        return f"{self.of} {self.op} {self.bound:g}"

    def holds(self, x: float | None) -> bool:
        return x is not None and (operator.le if self.op == "<=" else operator.ge)(x, self.bound)


@dataclass
class Row:
    """One figure: the samples of its runs, and those of its baseline (same run, interleaved)."""

    benchmark: str
    case: str
    samples: list[float]
    unit: str
    baseline_samples: list[float] = field(default_factory=list)
    baseline_name: str = ""
    goal: Goal | None = None
    higher_is_better: bool = False
    """Rates (procedures/s): the best run is the highest; times: the lowest."""
    note: str = ""

    def _best(self, xs: Sequence[float]) -> float:
        return max(xs) if self.higher_is_better else min(xs)

    def _worst(self, xs: Sequence[float]) -> float:
        return min(xs) if self.higher_is_better else max(xs)

    @property
    def best(self) -> float:
        return self._best(self.samples)

    @property
    def median(self) -> float:
        return statistics.median(self.samples)

    @property
    def baseline_best(self) -> float | None:
        return self._best(self.baseline_samples) if self.baseline_samples else None

    @property
    def baseline_median(self) -> float | None:
        return statistics.median(self.baseline_samples) if self.baseline_samples else None

    @property
    def ratio_best(self) -> float | None:
        base = self.baseline_best
        return self.best / base if base else None

    @property
    def ratio_median(self) -> float | None:
        base = self.baseline_median
        return self.median / base if base else None

    def judged(self) -> tuple[float | None, float | None]:
        """What the goal bounds: (best, median) of the ratio, or of the value."""
        if self.goal is not None and self.goal.of == "value":
            return self.best, self.median
        return self.ratio_best, self.ratio_median

    def verdict(self) -> str:
        """`met` (best and median), `best only`, `NOT met`; empty without a goal."""
        if self.goal is None:
            return ""
        best, median = self.judged()
        if self.goal.holds(median) and self.goal.holds(best):
            return "met"
        return "best only" if self.goal.holds(best) else "NOT met"

    def as_dict(self) -> dict[str, Any]:
        return {
            "benchmark": self.benchmark,
            "case": self.case,
            "unit": self.unit,
            "runs": len(self.samples),
            "samples": self.samples,
            "best": self.best,
            "median": self.median,
            "baseline_name": self.baseline_name,
            "baseline_samples": self.baseline_samples,
            "baseline_best": self.baseline_best,
            "baseline_median": self.baseline_median,
            "ratio_best": self.ratio_best,
            "ratio_median": self.ratio_median,
            "goal": str(self.goal) if self.goal else "",
            "verdict": self.verdict(),
            "note": self.note,
        }


def _num(x: float) -> str:
    return f"{x:.3f}" if abs(x) < 100 else f"{x:.1f}"


def _spread(xs: Sequence[float], best: float, median: float, worst: float) -> str:
    if len(xs) == 1:
        return _num(best)
    return f"{_num(best)} / {_num(median)} / {_num(worst)}"


@dataclass
class Series:
    """How one cost grows with N: `costs[n]` in `unit` (per step, per procedure...), the median run."""

    name: str
    unit: str
    costs: dict[int, float] = field(default_factory=dict)

    def growth(self) -> str:
        """Linear if the per-unit cost stays within 1.5x from N=100 up; else where it bends.

        N=1 is shown but not judged: one procedure is all fixed cost and latency.
        """
        ns = sorted(n for n in self.costs if n >= 100)
        if len(ns) < 2 or not all(self.costs[n] > 0 for n in ns):
            return ""
        for before, after in itertools.pairwise(ns):
            if self.costs[after] > 1.5 * self.costs[before]:
                return f"bends at N={after} (x{self.costs[after] / self.costs[before]:.1f} per unit)"
        change = self.costs[ns[-1]] / self.costs[ns[0]]
        shape = "linear" if change >= 1 / 1.5 else "sublinear (fixed costs amortized)"
        return f"{shape}: x{change:.2f} per unit from N={ns[0]} to N={ns[-1]}"


@dataclass
class Report:
    quick: bool
    only: tuple[str, ...] = ()
    """The benchmarks run, if not all: such a partial run never overwrites the full table."""
    rows: list[Row] = field(default_factory=list)
    series: dict[str, Series] = field(default_factory=dict)

    def add(self, row: Row) -> None:
        self.rows.append(row)
        ratio = ""
        if row.ratio_best is not None and row.ratio_median is not None:
            ratio = f"  ratio {row.ratio_best:.2f} best, {row.ratio_median:.2f} median"
        verdict = f"  [{row.goal}: {row.verdict()}]" if row.goal else ""
        print(
            f"  {row.benchmark:<14} {row.case:<58} {row.best:>10.3f} {row.unit} (median {row.median:.3f}, "
            f"{len(row.samples)} runs){ratio}{verdict}",
            flush=True,
        )

    def scale(self, name: str, unit: str, n: int, cost: float) -> None:
        """Record one point of a scaling series (cost per unit of work at size n)."""
        self.series.setdefault(name, Series(name, unit)).costs[n] = cost

    def markdown(self) -> str:
        lines = [
            f"Machine: {machine()}",
            "",
            "Each figure: best / median / worst of its runs, each run interleaved with its baseline's; "
            "the ratio is best to best and median to median. A goal is met if it holds for both.",
            "",
            "| benchmark | case | runs | value (best / median / worst) | baseline (best / median / worst) "
            "| ratio (best, median) | goal | |",
            "|---|---|---|---|---|---|---|---|",
        ]
        notes: list[str] = []
        for r in self.rows:
            value = f"{_spread(r.samples, r.best, r.median, r._worst(r.samples))} {r.unit}"
            base = ""
            if r.baseline_samples:
                b = r.baseline_samples
                base = f"{_spread(b, r._best(b), statistics.median(b), r._worst(b))} {r.unit} ({r.baseline_name})"
            ratio = ""
            if r.ratio_best is not None and r.ratio_median is not None:
                ratio = f"{r.ratio_best:.2f}, {r.ratio_median:.2f}"
            case = r.case
            if r.note:
                notes.append(r.note)
                case += f" [{len(notes)}]"
            goal = str(r.goal) if r.goal else ""
            lines.append(
                f"| {r.benchmark} | {case} | {len(r.samples)} | {value} | {base} | {ratio} | {goal} | {r.verdict()} |"
            )
        if notes:
            lines += ["", *(f"{i}. {note}" for i, note in enumerate(notes, 1))]
        sizes = sorted({n for s in self.series.values() for n in s.costs})
        if sizes:
            lines += [
                "",
                "Scaling: cost per unit of work at each N, median run (flat = linear growth of the total).",
                "",
                "| series | unit | " + " | ".join(f"N={n}" for n in sizes) + " | growth |",
                "|---|---|" + "---|" * len(sizes) + "---|",
            ]
            for s in self.series.values():
                cells = " | ".join(f"{s.costs[n]:.3f}" if n in s.costs else "" for n in sizes)
                lines.append(f"| {s.name} | {s.unit} | {cells} | {s.growth()} |")
        return "\n".join(lines) + "\n"

    def write(self) -> Path:
        RESULTS.mkdir(exist_ok=True)
        name = "latest-quick" if self.quick else "latest"
        if self.only:
            name += "-only-" + "-".join(sorted(self.only))
        (RESULTS / f"{name}.md").write_text(self.markdown())
        payload = {
            "machine": machine_info(),
            "quick": self.quick,
            "method": "each figure: every run's sample, best and median; runs interleaved with the baseline's",
            "rows": [r.as_dict() for r in self.rows],
            "scaling": {s.name: {"unit": s.unit, "costs": s.costs, "growth": s.growth()} for s in self.series.values()},
        }
        (RESULTS / f"{name}.json").write_text(json.dumps(payload, indent=2))
        return RESULTS / f"{name}.md"


def machine_info() -> dict[str, Any]:
    versions = {}
    for package in ("procstore", "fsspec", "s3fs", "moto", "orjson", "dbos"):
        try:
            versions[package] = metadata.version(package)
        except metadata.PackageNotFoundError:
            continue
    return {
        "python": platform.python_version(),
        "platform": platform.platform(),
        "cpus": os.cpu_count(),
        "load_average": os.getloadavg()[0],
        "versions": versions,
    }


def machine() -> str:
    info = machine_info()
    versions = ", ".join(f"{k} {v}" for k, v in info["versions"].items())
    return (
        f"{info['platform']}, {info['cpus']} CPUs (load average {info['load_average']:.1f} when written: "
        f"other work ran alongside, which interleaving cancels out of the ratios), Python {info['python']}; {versions}"
    )


async def timed(fn: Callable[[], Awaitable[Any]]) -> float:
    """Seconds `fn()` takes."""
    started = time.perf_counter()
    await fn()
    return time.perf_counter() - started


async def interleaved(
    repeats: int, *timings: Callable[[], Awaitable[Any]], cleanup: Callable[[], Awaitable[None]] | None = None
) -> list[list[float]]:
    """The seconds of each of `repeats` runs of each timing, interleaved (run 1 of each, then
    run 2 of each...) so that drift hits all alike.

    `cleanup` runs, untimed, after each timing: leftovers would slow later measurements down.
    """
    samples: list[list[float]] = [[] for _ in timings]
    for _ in range(repeats):
        for i, fn in enumerate(timings):
            samples[i].append(await timed(fn))
            if cleanup is not None:
                await cleanup()
    return samples


def rss_bytes() -> int:
    """The resident memory of this process, from /proc (Linux)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return 0


async def run_child(*args: str) -> dict[str, Any] | None:
    """Run `python -m ARGS...` and return the JSON object on its last `{` line; None if it failed."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", *args, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.DEVNULL
    )
    out, _ = await proc.communicate()
    lines = [line for line in out.decode().splitlines() if line.startswith("{")]
    result: dict[str, Any] | None = json.loads(lines[-1]) if proc.returncode == 0 and lines else None
    return result


CHILD_SETUP_SECONDS = 900.0


async def run_child_until_ready_then_kill(*args: str) -> bool:
    """Run `python -m ARGS...` until it prints `READY`, then SIGKILL it; False if it never did."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", *args, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.DEVNULL
    )
    assert proc.stdout is not None
    try:
        async with asyncio.timeout(CHILD_SETUP_SECONDS):
            while line := await proc.stdout.readline():
                if line.strip() == b"READY":
                    return True
        return False
    except TimeoutError:
        return False
    finally:
        proc.send_signal(signal.SIGKILL)
        await proc.wait()
