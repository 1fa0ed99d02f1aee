"""`python -m benchmarks [--quick] [--only NAME]`: run, print, and write benchmarks/results/."""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass

import click

from benchmarks import memstore, observability, placement, recovery, suites
from benchmarks.harness import Report, machine
from benchmarks.stores import targets

CEILING_THREADS = (1, 4, 8, 16, 32)
NAMES = ("step", "throughput", "recovery", "memory", "lease", "memstore", "observability")


@dataclass(frozen=True)
class Sizes:
    """N for each benchmark (by store where it differs)."""

    step: dict[str, tuple[int, ...]]
    throughput: dict[str, tuple[int, ...]]
    recovery: tuple[int, ...]
    memory: tuple[int, ...]
    """From 1,000 up: below that the growth of the resident set is within the allocator's granularity."""
    dbos_max: int
    """The largest N DBOS runs at: beyond it a run takes minutes (about 30 workflows/s here)."""
    lease: dict[str, tuple[int, ...]]
    observability: dict[str, tuple[int, ...]]
    memstore: tuple[int, ...]
    """Keys held; memory:// is measured up to 10,000 only (beyond, one run takes minutes)."""
    ceiling_writes: int
    """Durable creates per measurement of the disk's parallel-fsync ceiling."""
    request_pairs: int
    """PUT and GET pairs per measurement of whether the S3 server serves two requests at once."""
    placement: int
    """N of the ablation of spreading the procedure folders (`benchmarks.placement`)."""


QUICK = Sizes(  # CI runs this: under three minutes
    step={"local": (1, 100), "memory": (1, 100), "s3": (1, 25), "s3-15ms": (1, 25)},
    throughput={"local": (1, 100), "memory": (1, 100), "s3": (1, 25)},
    recovery=(100, 1000),
    memory=(1000,),
    dbos_max=100,
    lease={"local": (100,), "memory": (100,), "s3": (25,)},
    observability={"local": (100,), "memory": (100,), "s3": (25,), "s3-15ms": (25,)},
    memstore=(100, 10_000),
    ceiling_writes=400,
    request_pairs=20,
    placement=100,
)
FULL = Sizes(  # S3 stops at 1,000: the moto server here does ~150 puts/s, 10,000 would take 7 minutes
    # memory:// stops at 1,000, as when it was fsspec's memory filesystem, so that figures stay
    # comparable with earlier runs (see --only memstore for what the scheme's store costs).
    step={
        "local": (1, 100, 1000, 10_000),
        "memory": (1, 100, 1000),
        "s3": (1, 100, 1000),
        "s3-15ms": (1, 100),
        "s3-lognormal": (1, 100),
    },
    throughput={"local": (1, 100, 1000, 10_000), "memory": (1, 100, 1000), "s3": (1, 100, 1000)},
    recovery=(1, 100, 1000, 10_000),
    memory=(1000, 10_000),
    dbos_max=1000,
    lease={"local": (100, 1000), "memory": (100, 1000), "s3": (100,)},
    observability={"local": (100, 1000), "memory": (100, 1000), "s3": (100,), "s3-15ms": (100,)},
    memstore=(100, 1000, 10_000, 100_000),
    ceiling_writes=2000,
    request_pairs=100,
    placement=1000,
)


async def run(quick: bool, only: tuple[str, ...]) -> Report:
    report = Report(quick, only)
    chosen = set(only or NAMES)
    mode, sizes = ("quick", QUICK) if quick else ("full", FULL)
    print(f"procstore benchmarks ({mode}) on {machine()}", flush=True)
    with targets(["local", "memory", "s3", "s3-15ms", "s3-lognormal"]) as stores:
        local = stores[0]
        if "step" in chosen:
            for target in stores:
                for n in sizes.step.get(target.key, ()):
                    await suites.step_overhead(report, target, n)
                if target.kind == "s3":
                    await suites.requests_at_once(report, target, sizes.request_pairs)
        if "throughput" in chosen:
            await suites.disk_ceiling(report, local, sizes.ceiling_writes, CEILING_THREADS)
            for target in stores:
                for n in sizes.throughput.get(target.key, ()):
                    with_dbos = target.kind == "local" and n <= sizes.dbos_max
                    await suites.throughput(report, target, n, with_dbos=with_dbos)
            await placement.ablation(report, local, sizes.placement)
        if "recovery" in chosen:
            for n in sizes.recovery:
                await recovery.recovery(report, local, n, with_dbos=n == sizes.dbos_max)
        if "memory" in chosen:
            for n in sizes.memory:
                await suites.memory(report, n)
        if "lease" in chosen:
            for target in stores:
                for n in sizes.lease.get(target.key, ()):
                    await suites.lease_overhead(report, target, n)
        if "memstore" in chosen:
            for n in sizes.memstore:
                await memstore.per_operation(report, n, with_fsspec=n <= 10_000)
            await memstore.explorer_speed(report)
        # Last: it configures the OpenTelemetry SDK for the rest of the process.
        if "observability" in chosen:
            for target in stores:
                for n in sizes.observability.get(target.key, ()):
                    await observability.observability_overhead(report, target, n)
    return report


@click.command()
@click.option("--quick", is_flag=True, help="Smaller sizes (under 3 minutes); what CI runs.")
@click.option("--only", multiple=True, type=click.Choice(NAMES), help="Run only these benchmarks.")
def main(quick: bool, only: tuple[str, ...]) -> None:
    """Measure procstore against the writes it cannot avoid and against DBOS (see benchmarks/suites.py)."""
    logging.disable(logging.WARNING)
    started = time.perf_counter()
    report = asyncio.run(run(quick, only))
    path = report.write()
    print(f"\n{report.markdown()}\nwrote {path} and its .json in {time.perf_counter() - started:.0f} s")


main()
