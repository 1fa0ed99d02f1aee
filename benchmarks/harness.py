"""What every benchmark shares: the machine's description, timing, and the results table."""

from __future__ import annotations

import asyncio
import itertools
import json
import os
import platform
import signal
import sys
import time
from collections.abc import Awaitable, Callable
from dataclasses import asdict, dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).parent / "results"


@dataclass
class Row:
    benchmark: str
    case: str
    value: float
    unit: str
    baseline: float | None = None
    baseline_name: str = ""
    goal: str = ""

    @property
    def ratio(self) -> float | None:
        return None if not self.baseline else self.value / self.baseline


@dataclass
class Series:
    """How one cost grows with N: `costs[n]` in `unit` (per step, per procedure...)."""

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
        ratio = f"  ratio {row.ratio:.2f}" if row.ratio is not None else ""
        print(f"  {row.benchmark:<14} {row.case:<52} {row.value:>10.3f} {row.unit}{ratio}", flush=True)

    def scale(self, name: str, unit: str, n: int, cost: float) -> None:
        """Record one point of a scaling series (cost per unit of work at size n)."""
        self.series.setdefault(name, Series(name, unit)).costs[n] = cost

    def markdown(self) -> str:
        lines = [
            f"Machine: {machine()}",
            "",
            "| benchmark | case | value | baseline | ratio | goal |",
            "|---|---|---|---|---|---|",
        ]
        for r in self.rows:
            base = f"{r.baseline:.3f} {r.unit} ({r.baseline_name})" if r.baseline is not None else ""
            ratio = f"{r.ratio:.2f}" if r.ratio is not None else ""
            lines.append(f"| {r.benchmark} | {r.case} | {r.value:.3f} {r.unit} | {base} | {ratio} | {r.goal} |")
        sizes = sorted({n for s in self.series.values() for n in s.costs})
        if sizes:
            lines += [
                "",
                "Scaling: cost per unit of work at each N (flat = linear growth of the total).",
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
            "rows": [asdict(r) | {"ratio": r.ratio} for r in self.rows],
            "scaling": {s.name: {"unit": s.unit, "costs": s.costs, "growth": s.growth()} for s in self.series.values()},
        }
        (RESULTS / f"{name}.json").write_text(json.dumps(payload, indent=2))
        return RESULTS / f"{name}.md"


def machine_info() -> dict[str, Any]:
    versions = {}
    for package in ("procstore", "fsspec", "s3fs", "moto", "orjson", "tenacity", "dbos"):
        try:
            versions[package] = metadata.version(package)
        except metadata.PackageNotFoundError:
            continue
    return {
        "python": platform.python_version(),
        "platform": platform.platform(),
        "cpus": os.cpu_count(),
        "versions": versions,
    }


def machine() -> str:
    info = machine_info()
    versions = ", ".join(f"{k} {v}" for k, v in info["versions"].items())
    return f"{info['platform']}, {info['cpus']} CPUs, Python {info['python']}; {versions}"


async def timed(fn: Callable[[], Awaitable[Any]]) -> float:
    """Seconds `fn()` takes."""
    started = time.perf_counter()
    await fn()
    return time.perf_counter() - started


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
