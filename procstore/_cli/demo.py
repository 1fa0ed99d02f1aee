"""`procstore demo`: region migrations and table creations on a simulated cluster, with the
manager killed at random store operations (see `machines/demo.py`, installed as `procstore_machines.demo`)."""

from __future__ import annotations

import asyncio
import logging
import random
import sys
import tempfile
from pathlib import Path

import click

from procstore._cli.common import parse_storage_options, storage_option_flags


@click.command()
@click.option("--store", "store_url", help="Store URL or path (default: a new temp directory).")
@click.option("--seed", type=int, default=None, help="Random seed; the same seed replays the same run.")
@click.option("--size", type=click.IntRange(1, 100), default=6, show_default=True,
              help="Tables to create and regions to migrate.")  # fmt: skip
@click.option("--crashes", type=click.IntRange(0, 50), default=4, show_default=True, help="Kills to inject.")
@click.option("--verbose", "-v", is_flag=True, help="Show procstore's log (retries, failures, recovery).")
@storage_option_flags
def demo(
    store_url: str | None, seed: int | None, size: int, crashes: int, verbose: bool, storage_options: tuple[str, ...]
) -> None:
    """Create tables and migrate regions while the manager is killed and restarted."""
    from rich.console import Console
    from rich.logging import RichHandler

    from procstore_machines.demo import run_demo

    # Failures the demo provokes on purpose are in its summary; the log is for the curious.
    logging.basicConfig(level=logging.INFO if verbose else logging.CRITICAL, handlers=[RichHandler()])

    store_url = store_url or str(Path(tempfile.mkdtemp(prefix="procstore-demo-")) / "store")
    seed = seed if seed is not None else random.randrange(1_000_000)
    options = parse_storage_options(storage_options)
    sys.exit(asyncio.run(run_demo(store_url, seed, size, crashes, Console(), options)))
