"""What every benchmark shares: the machine's description, timing, and the results table."""

from __future__ import annotations

import json
import os
import platform
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
class Report:
    quick: bool
    rows: list[Row] = field(default_factory=list)

    def add(self, row: Row) -> None:
        self.rows.append(row)
        ratio = f"  ratio {row.ratio:.2f}" if row.ratio is not None else ""
        print(f"  {row.benchmark:<14} {row.case:<40} {row.value:>10.3f} {row.unit}{ratio}", flush=True)

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
        return "\n".join(lines) + "\n"

    def write(self) -> Path:
        RESULTS.mkdir(exist_ok=True)
        name = "latest-quick" if self.quick else "latest"
        (RESULTS / f"{name}.md").write_text(self.markdown())
        payload = {
            "machine": machine_info(),
            "quick": self.quick,
            "rows": [asdict(r) | {"ratio": r.ratio} for r in self.rows],
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
