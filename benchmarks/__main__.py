"""`python -m benchmarks [--quick] [--only NAME]`: run, print, and write benchmarks/results/."""

from __future__ import annotations

import asyncio
import logging

import click

from benchmarks import suites
from benchmarks.harness import Report, machine
from benchmarks.stores import targets

NAMES = ("step", "throughput", "recovery", "memory")


async def run(quick: bool, only: tuple[str, ...]) -> Report:
    report = Report(quick)
    chosen = set(only or NAMES)
    print(f"procstore benchmarks ({'quick' if quick else 'full'}) on {machine()}", flush=True)
    with targets(["local", "memory", "s3"]) as stores:
        if "step" in chosen:
            for target in stores:
                await suites.step_overhead(report, target, quick)
        if "throughput" in chosen:
            for target in stores:
                for n in (1, 100) if quick else (1, 100, 1000):
                    if target.kind == "s3" and n > 100 and quick:
                        continue
                    await suites.throughput(report, target, n)
        if "recovery" in chosen:
            for n in (1000,) if quick else (1000, 10_000):
                await suites.recovery(report, stores[0], n)
        if "memory" in chosen:
            await suites.memory(report, 2000 if quick else 10_000)
    return report


@click.command()
@click.option("--quick", is_flag=True, help="Smaller sizes (under 3 minutes); what CI runs.")
@click.option("--only", multiple=True, type=click.Choice(NAMES), help="Run only these benchmarks.")
def main(quick: bool, only: tuple[str, ...]) -> None:
    """Measure procstore against the writes it cannot avoid (see benchmarks/suites.py)."""
    logging.disable(logging.WARNING)
    report = asyncio.run(run(quick, only))
    path = report.write()
    print(f"\nwrote {path} and its .json")


main()
