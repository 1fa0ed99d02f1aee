"""The demo: create tables and migrate regions on a simulated cluster while the manager is
killed at random store operations and restarted.

Everything lives in one store: the procedures under `procedure/`, the cluster under
`cluster/` (`tables/{id}.json` routes, `datanodes/{id}.json` replicas, `table_info/`).
Each round starts a manager (and a fresh view of the cluster, loaded from the store) with a
simulated crash armed at a random store operation. A crash kills the manager with no
cleanup; the next round recovers. The last round runs without a crash. The invariants are
then read back from the store alone.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
import shlex
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from procstore import (
    DuplicateProcedure,
    EndNotRecorded,
    ManagerStopped,
    ProcedureFailed,
    ProcedureId,
    ProcedureManager,
    ProcedureWithId,
    Watcher,
)
from procstore.store import StateStore, open_state_store
from procstore.store.history import HistoryStore
from procstore.testing import FaultyStore, SimulatedCrash
from procstore_machines.create_table import CreateTable, new_create_table
from procstore_machines.create_table import register as register_create_table
from procstore_machines.region_migration import (
    RegionMigration,
    SimCluster,
    VolatileContext,
    check_cluster,
    new_migration,
)
from procstore_machines.region_migration.cluster import REGION_LEASE_SECONDS, region_id

DATANODES = [1, 2, 3, 4]


@dataclass
class Job:
    """One procedure the demo runs, and what became of it."""

    kind: str
    label: str
    procedure_id: ProcedureId
    spec: dict[str, Any]
    outcome: str = "pending"
    crashes_survived: int = 0


@dataclass
class Plan:
    bootstrap: dict[int, list[int]]
    """Tables created before the demo starts: table id -> the leader of each region."""
    jobs: list[Job] = field(default_factory=list)


def make_plan(rng: random.Random, size: int) -> Plan:
    """`size` new tables and `size` migrations (of distinct regions of bootstrap tables)."""
    bootstrap = {1000 + t: [rng.choice(DATANODES) for _ in range(rng.randint(2, 4))] for t in range(max(2, size // 2))}
    jobs: list[Job] = []

    def new_id() -> ProcedureId:
        return ProcedureId(uuid.UUID(int=rng.getrandbits(128), version=4))

    for t in range(size):
        leaders = [rng.choice(DATANODES) for _ in range(rng.randint(2, 5))]
        spec = {"table": f"metrics_{t}", "table_id": 2000 + t, "leaders": leaders}
        jobs.append(Job("create table", f"metrics_{t} ({len(leaders)} regions)", new_id(), spec))
    candidates = [(tid, n, leader) for tid, leaders in bootstrap.items() for n, leader in enumerate(leaders, start=1)]
    rng.shuffle(candidates)
    for tid, number, leader in candidates[:size]:
        target = rng.choice([d for d in DATANODES if d != leader])
        spec = {"regions": [region_id(tid, number)], "from": leader, "to": target}
        jobs.append(Job("migrate region", f"{tid}/{number}: {leader} -> {target}", new_id(), spec))
    return Plan(bootstrap, jobs)


def build(job: Job, cluster: SimCluster) -> CreateTable | RegionMigration:
    s = job.spec
    if job.kind == "create table":
        return new_create_table(cluster, s["table"], s["table_id"], s["leaders"])
    return new_migration(cluster, s["regions"], s["from"], s["to"])


def new_manager(store: StateStore, cluster: SimCluster) -> ProcedureManager:
    manager = ProcedureManager(store, max_retry_times=8, retry_delay=0.01, max_retry_delay=0.2)
    register_create_table(manager, cluster)
    RegionMigration.register_with(manager, lambda _p: VolatileContext(cluster))
    return manager


def inject_mailbox_faults(cluster: SimCluster, rng: random.Random, plan: Plan, heal: bool) -> str:
    """Some datanodes answer slowly or time out; in rounds before the last (`heal` False),
    the source of a pending migration may be cut off, forcing the lease slow path."""
    for node in DATANODES:
        fault = cluster.mailbox.fault(node)
        fault.delay = rng.choice([0.0, 0.0, 0.002, 0.01])
        fault.timeouts = rng.choice([0, 0, 1, 2])
    sources = sorted({j.spec["from"] for j in plan.jobs if j.kind == "migrate region" and j.outcome == "pending"})
    if heal or not sources or rng.random() > 0.4:
        return ""
    node = rng.choice(sources)
    cluster.mailbox.fault(node).partitioned = True
    return f"datanode {node} cut off"


async def _recorded_outcome(store: FaultyStore, procedure_id: ProcedureId) -> str:
    record = await HistoryStore(store).find(procedure_id)
    if record is None:
        return "pending"
    return "done" if record.outcome == "done" else f"failed: {record.error}"


async def _wait(watcher: Watcher) -> str | None:
    """The procedure's outcome; None (still pending) if the manager stopped (was killed)
    before it ended, or its end could not be written: the next round resumes it."""
    try:
        await watcher.wait()
    except ProcedureFailed as e:
        return f"failed: {e.error}"
    except (ManagerStopped, EndNotRecorded):
        return None
    return "done"


async def run_round(
    store_url: str, options: dict[str, Any], plan: Plan, crash_at: int | None, rng: random.Random
) -> str:
    """One manager's life on the store; returns what happened."""
    faulty = FaultyStore(
        open_state_store(store_url, options), crash_at=crash_at, crash_when=rng.choice(["before", "after"])
    )
    cluster = SimCluster(faulty, DATANODES)
    notes = ""
    waits: dict[ProcedureId, asyncio.Future[Any]] = {}
    manager = new_manager(faulty, cluster)
    try:
        with contextlib.suppress(SimulatedCrash):
            await cluster.load()
            notes = inject_mailbox_faults(cluster, rng, plan, heal=crash_at is None)
            if crash_at is None:
                # The healed round: datanodes open regions asynchronously and signal the
                # migration when done (`region-opened`), which waits for it without polling.
                cluster.open_regions_asynchronously(0.05)
            await manager.start()
            for job in plan.jobs:
                # A procedure the store still holds is followed again, even one reported
                # failed: a rollback that could not finish runs again after a restart.
                watcher = manager.procedure_watcher(job.procedure_id)
                if watcher is None and job.outcome == "pending":
                    try:
                        watcher = await manager.submit(ProcedureWithId(job.procedure_id, build(job, cluster)))
                    except DuplicateProcedure:
                        # It ran to its end before the crash: its history record says how.
                        job.outcome = await _recorded_outcome(faulty, job.procedure_id)
                if watcher is not None:
                    waits[job.procedure_id] = asyncio.ensure_future(_wait(watcher))
            crashed: asyncio.Future[Any] = asyncio.ensure_future(faulty.crashed.wait())
            # Wait only on what is still pending: a finished future would return at once.
            while not faulty.crashed.is_set() and (pending := [w for w in waits.values() if not w.done()]):
                pending.append(crashed)
                await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
            crashed.cancel()
        await manager.stop()
    finally:
        await cluster.stop_opening()
        await faulty.close()
    crashed_now = faulty.crashed.is_set()
    for job in plan.jobs:
        future = waits.pop(job.procedure_id, None)
        outcome = future.result() if future is not None and future.done() and not future.cancelled() else None
        if outcome is not None:
            job.outcome = outcome
        elif job.outcome == "pending" and crashed_now:
            job.crashes_survived += 1
        if future is not None:
            future.cancel()
    what = "ran to the end"
    if crashed_now:
        op = next((o for o in faulty.ops if o.index == crash_at), None)
        what = f"killed {faulty.crash_when} {op.kind} {op.key}" if op else "killed at start"
    return what + (f" ({notes})" if notes else "")


async def bootstrap(store_url: str, options: dict[str, Any], plan: Plan) -> None:
    store = open_state_store(store_url, options)
    try:
        await store.check_access()
        cluster = SimCluster(store, DATANODES)
        await cluster.load()
        for table_id, leaders in plan.bootstrap.items():
            if await cluster.metadata.get_route(table_id) is None:
                await cluster.create_table(table_id, dict(enumerate(leaders, start=1)), {})
    finally:
        await store.close()


async def verify(store_url: str, options: dict[str, Any], plan: Plan) -> list[str]:
    """The invariants, read from the store alone."""
    store = open_state_store(store_url, options)
    try:
        broken = await check_cluster(store)
        left = await store.walk("procedure/")
        if left:
            broken.append(f"{len(left)} procedure keys left in the store, e.g. {left[0]}")
        cluster = SimCluster(store, DATANODES)
        for job in plan.jobs:
            if job.outcome == "pending":
                broken.append(f"{job.kind} {job.label}: never finished")
            if job.kind == "create table" and job.outcome == "done":
                info = await cluster.metadata.get_table_info(job.spec["table_id"])
                if (info or {}).get("state") != "ready":
                    broken.append(f"table {job.spec['table']}: done, but its table info is {info}")
        return broken
    finally:
        await store.close()


async def run_demo(
    store_url: str, seed: int, size: int, crashes: int, console: Console, options: dict[str, Any] | None = None
) -> int:
    options = options or {}
    rng = random.Random(seed)
    plan = make_plan(rng, size)
    started = time.monotonic()
    console.print(f"[bold]procstore demo[/] seed={seed} size={size} crashes={crashes}")
    console.print(f"  store: {store_url}  (cluster state under cluster/, procedures under procedure/)")
    console.print(f"  {len(plan.jobs)} procedures on {len(DATANODES)} datanodes; lease {REGION_LEASE_SECONDS}s")
    await bootstrap(store_url, options, plan)
    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    with Progress(*columns, console=console, transient=True) as progress:
        task = progress.add_task("round 1", total=len(plan.jobs))
        number = 0
        while True:
            number += 1
            finished = sum(1 for j in plan.jobs if j.outcome != "pending")
            # Kill rounds while there is work to kill, then one healed round without a kill,
            # which also finishes whatever a kill left (a rollback to run again, say).
            last = number > crashes or finished == len(plan.jobs)
            crash_at = None if last else rng.randrange(5, 15 * size)
            progress.update(task, description=f"round {number}")
            what = await run_round(store_url, options, plan, crash_at, rng)
            finished = sum(1 for j in plan.jobs if j.outcome != "pending")
            progress.update(task, completed=finished)
            progress.console.print(f"  round {number}: {what}; {finished}/{len(plan.jobs)} finished")
            if last:
                break
    return await report(store_url, options, plan, console, time.monotonic() - started)


async def report(store_url: str, options: dict[str, Any], plan: Plan, console: Console, elapsed: float) -> int:
    table = Table(title="procedures", show_lines=False)
    for column in ("procedure", "what", "outcome", "crashes survived"):
        table.add_column(column)
    for job in plan.jobs:
        style = "green" if job.outcome == "done" else "yellow"
        table.add_row(job.kind, job.label, f"[{style}]{job.outcome}[/]", str(job.crashes_survived))
    console.print(table)
    broken = await verify(store_url, options, plan)
    console.print(f"  finished in {elapsed:.1f}s")
    if broken:
        console.print("[bold red]INVARIANTS BROKEN[/]")
        for line in broken:
            console.print(f"  - {line}")
        return 1
    console.print(
        "[bold green]invariants hold[/]: every region has exactly one leader, the metadata agrees "
        "with the datanodes, no region leaked, and the store holds no procedure keys."
    )
    # The procedures' keys are gone; each run's end record stays in history, for the CLI.
    flags = [f"-s {shlex.quote(f'{k}={v if isinstance(v, str) else json.dumps(v)}')}" for k, v in options.items()]
    where = escape(" ".join([shlex.quote(store_url), *flags]))
    console.print("  what ran, as an operator sees it:")
    console.print(f"    procstore history {where}", soft_wrap=True)
    console.print(f"    procstore show {where} {str(plan.jobs[0].procedure_id)[:8]}", soft_wrap=True)
    return 0
