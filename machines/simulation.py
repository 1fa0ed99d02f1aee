"""The example machines' ready cluster simulation: `python -m procstore.testing.simulate`.

One world holds all four machines: region migrations and table creations on the simulated
cluster (kept in the store), publishes of a docs site (kept in the store), and service
provisioning (files in a folder of its own). The cluster (its datanodes and mailbox) is
one, shared by every manager, as a real one would be; the docs site is written through each
manager's view of the store, so that manager's pauses and faults reach those writes too.
"""

from __future__ import annotations

import json
import random
import shutil
import tempfile
from pathlib import Path

from procstore import ProcedureManager, ProcedureWithId
from procstore.store import StateStore
from procstore.testing.cluster_store import Process
from procstore_machines.create_table import new_create_table
from procstore_machines.create_table import register as register_create_table
from procstore_machines.provision import CreateResource, ProvisionService, check_world
from procstore_machines.publish import new_publish, read_current
from procstore_machines.publish import register as register_publish
from procstore_machines.region_migration import (
    RegionMigration,
    SimCluster,
    VolatileContext,
    check_cluster,
    new_migration,
    region_id,
)
from procstore_machines.region_migration.cluster import REGION_OPENED

TABLE = 1024
NODES = [1, 2, 3]
VERSIONS = {"v1": {"index.html": b"one"}, "v2": {"index.html": b"two", "b.css": b"b"}, "v3": {"index.html": b"3"}}


class MachinesWorld:
    """A `procstore.testing.World` of the example machines."""

    signal_names = (REGION_OPENED,)
    """What the simulation's schedule sends besides what a procedure waits for: the
    datanode's answer, perhaps before a migration waits for it, or after."""

    def __init__(self) -> None:
        self.folder = Path(tempfile.mkdtemp(prefix="procstore-sim-"))
        self.services: dict[str, list[str]] = {}
        self.next_table = 2000
        self.touched: dict[str, set[int]] = {}
        """The regions each migration or create-table acts on, by its id."""
        self.cluster: SimCluster

    async def prepare(self, store: StateStore) -> None:
        self.cluster = SimCluster(store, NODES)
        await self.cluster.create_table(TABLE, {1: 1, 2: 1}, {})
        for version, files in VERSIONS.items():
            for path, data in files.items():
                await store.put(f"docs/{version}/{path}", data)
        await store.put("docs/current", b'{"version":"v1"}')
        await store.put("docs/versions/v1/index.html", b"one")

    def attach(self, manager: ProcedureManager, process: Process, store: StateStore) -> None:
        cluster = self.cluster
        RegionMigration.register_with(manager, lambda _p: VolatileContext(cluster))
        register_create_table(manager, cluster)
        register_publish(manager, store, store)
        manager.register(ProvisionService)
        manager.register(CreateResource)

    async def new_procedure(
        self, rng: random.Random, name: str, process: Process, store: StateStore
    ) -> ProcedureWithId:
        kind = rng.choice(["migrate", "create", "publish", "provision"])
        cluster = self.cluster
        if kind == "migrate":
            route = await cluster.metadata.get_route(TABLE)
            assert route is not None
            region = rng.choice(route.regions)
            target = rng.choice([n for n in NODES if n != region.leader])
            migration = ProcedureWithId.new(new_migration(cluster, [region.region_id], region.leader, target))
            self.touched[str(migration.id)] = {region.region_id}
            return migration
        if kind == "create":
            self.next_table += 1
            leaders = [rng.choice(NODES) for _ in range(rng.randint(1, 3))]
            create = ProcedureWithId.new(new_create_table(cluster, f"t{self.next_table}", self.next_table, leaders))
            self.touched[str(create.id)] = {region_id(self.next_table, n) for n in range(1, len(leaders) + 1)}
            return create
        if kind == "publish":
            return ProcedureWithId.new(await new_publish(store, store, "docs", rng.choice(sorted(VERSIONS))))
        resources = sorted({f"r{rng.randint(1, 4)}" for _ in range(rng.randint(1, 3))})
        self.services[name] = resources
        return ProcedureWithId.new(ProvisionService.create(self.folder, name, resources))

    async def check(self, store: StateStore, outcomes: dict[str, str]) -> list[str]:
        # A migration or create with no outcome was deleted by an operator while it ran
        # (`procstore delete` is destructive by design) or restarted: its regions are not
        # checked.
        unchecked = {f"region {r}:" for pid, rs in self.touched.items() if pid not in outcomes for r in rs}
        problems = [p for p in await check_cluster(store) if not p.startswith(tuple(unchecked))]
        version, _ = await read_current(store, "docs")
        if version not in VERSIONS:
            problems.append(f"docs: the current version is {version!r}")
        # A provision that failed leaves what it made (it has no rollback): check the ready ones.
        problems += check_world(self.folder, {s: r for s, r in self.services.items() if self._ready(s)})
        shutil.rmtree(self.folder, ignore_errors=True)
        return problems

    def _ready(self, service: str) -> bool:
        catalog = self.folder / "catalog" / f"{service}.json"
        return catalog.exists() and json.loads(catalog.read_bytes()).get("state") == "ready"


__all__ = ["TABLE", "MachinesWorld", "region_id"]
