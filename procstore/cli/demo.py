"""`procstore demo`: provision services on a local "cloud", crashing the manager on the way.

Each round starts a manager on the same store, with a simulated crash armed at a random
store operation; the crash kills the manager mid-flight (no cleanup) and the next round
recovers. The last round runs without a crash. Then the world and the store are checked.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import click

from machines.provision import CreateResource, ProvisionService, check_world
from procstore import ProcedureFailed, ProcedureId, ProcedureManager, ProcedureWithId
from procstore.store import open_state_store
from procstore.testing import FaultyStore, SimulatedCrash


@dataclass
class Tracked:
    service: str
    resources: list[str]
    procedure_id: ProcedureId = field(default_factory=ProcedureId.random)
    outcome: str = "pending"
    crashes_survived: int = 0


def _plan(rng: random.Random, services: int) -> list[Tracked]:
    kinds = ["db", "cache", "queue", "bucket", "dns", "lb", "vm", "disk"]
    return [
        Tracked(
            f"svc-{i}",
            sorted(rng.sample(kinds, rng.randint(2, 5))),
            ProcedureId(uuid.UUID(int=rng.getrandbits(128), version=4)),
        )
        for i in range(services)
    ]


async def _round(
    store_url: str, world: Path, tracked: list[Tracked], crash_at: int | None, rng: random.Random
) -> tuple[bool, str]:
    """One manager's life; returns (crashed?, what happened)."""
    faulty = FaultyStore(open_state_store(store_url), crash_at=crash_at, crash_when=rng.choice(["before", "after"]))
    manager = ProcedureManager(faulty, retry_delay=0.01)
    manager.register(ProvisionService)
    manager.register(CreateResource)
    watchers = {}
    try:
        with contextlib.suppress(SimulatedCrash):
            await manager.start()
            for item in tracked:
                if item.outcome != "pending":
                    continue
                watcher = manager.procedure_watcher(item.procedure_id)
                if watcher is None and not _ready(world, item.service):
                    procedure = ProvisionService.create(world, item.service, item.resources)
                    watcher = await manager.submit(ProcedureWithId(item.procedure_id, procedure))
                if watcher is None:
                    item.outcome = "done"
                else:
                    watchers[item.service] = asyncio.ensure_future(_outcome(watcher.wait()))
            crashed = asyncio.ensure_future(faulty.crashed.wait())
            while not faulty.crashed.is_set() and not all(w.done() for w in watchers.values()):
                await asyncio.wait([*watchers.values(), crashed], return_when=asyncio.FIRST_COMPLETED)
            crashed.cancel()
        await manager.stop()
    finally:
        await faulty.close()
    for item in tracked:
        future = watchers.get(item.service)
        if future is not None and future.done() and not future.cancelled():
            item.outcome = future.result()
        elif item.outcome == "pending" and faulty.crashed.is_set():
            item.crashes_survived += 1
        if future is not None:
            future.cancel()
    if faulty.crashed.is_set():
        op = faulty.ops[crash_at] if crash_at is not None and crash_at < len(faulty.ops) else None
        where = f"{faulty.crash_when} {op.kind} {op.key}" if op else "at start"
        return True, f"crashed {where}"
    return False, "ran to the end"


async def _outcome(wait: object) -> str:
    try:
        await wait  # type: ignore[misc]
    except ProcedureFailed as e:
        return f"failed: {e.error}"
    return "done"


def _ready(world: Path, service: str) -> bool:
    path = world / "catalog" / f"{service}.json"
    return path.exists() and b'"ready"' in path.read_bytes()


async def _run(store_url: str, world: Path, seed: int, services: int, crashes: int) -> int:
    rng = random.Random(seed)
    tracked = _plan(rng, services)
    started = time.monotonic()
    click.echo(f"procstore demo: {services} services, up to {crashes} crashes, seed {seed}")
    click.echo(f"  store: {store_url}\n  world: {world}")
    for number in range(1, crashes + 2):
        crash_at = rng.randrange(3, 12 * services) if number <= crashes else None
        crashed, what = await _round(store_url, world, tracked, crash_at, rng)
        finished = sum(1 for t in tracked if t.outcome != "pending")
        click.echo(f"  round {number}: {what}; {finished}/{len(tracked)} services finished")
        if not crashed and finished == len(tracked):
            break
    return await _report(store_url, world, tracked, time.monotonic() - started)


async def _report(store_url: str, world: Path, tracked: list[Tracked], elapsed: float) -> int:
    click.echo("\n  service  resources                      outcome  crashes survived")
    for t in tracked:
        click.echo(f"  {t.service:<8} {','.join(t.resources):<30} {t.outcome:<8} {t.crashes_survived}")
    broken = check_world(world, {t.service: t.resources for t in tracked})
    store = open_state_store(store_url)
    try:
        leftover = await store.walk("procedure/")
    finally:
        await store.close()
    if leftover:
        broken.append(f"{len(leftover)} keys left in the store, e.g. {leftover[0]}")
    broken += [f"{t.service}: {t.outcome}" for t in tracked if t.outcome != "done"]
    click.echo(f"\n  finished in {elapsed:.1f}s")
    if broken:
        click.echo("  INVARIANTS BROKEN:", err=True)
        for line in broken:
            click.echo(f"    - {line}", err=True)
        return 1
    click.echo("  invariants hold: every service is ready, every resource exists once and matches")
    click.echo("  its catalog checksum, and the store holds no procedure keys.")
    return 0


@click.command()
@click.option("--store", "store_url", help="Procedure store URL or path (default: a new temp directory).")
@click.option("--seed", type=int, default=None, help="Random seed, to replay a run exactly.")
@click.option("--services", type=click.IntRange(1, 200), default=6, show_default=True, help="How many services.")
@click.option("--crashes", type=click.IntRange(0, 50), default=3, show_default=True, help="Crashes to inject.")
def demo(store_url: str | None, seed: int | None, services: int, crashes: int) -> None:
    """Provision services while the manager is killed at random store operations."""
    base = Path(tempfile.mkdtemp(prefix="procstore-demo-"))
    store_url = store_url or str(base / "store")
    seed = seed if seed is not None else random.randrange(1_000_000)
    code = asyncio.run(_run(store_url, base / "world", seed, services, crashes))
    sys.exit(code)
