"""Crash-explorer scenarios on the simulated cluster: each builds its world in the run's store.

Used by the project's tests and benchmarks, and an example of a `Scenario` whose world lives
in the store itself (so the world's own writes are crash points too).
"""

from __future__ import annotations

import weakref

from procstore import ProcedureManager, ProcedureWithId
from procstore.store import StateStore
from procstore.testing import Scenario
from procstore_machines.region_migration.cluster import SimCluster, check_cluster, region_id
from procstore_machines.region_migration.machine import RegionMigration, VolatileContext, new_migration

TABLE = 1024


class ClusterScenario(Scenario):
    """One simulated cluster per store the explorer hands out (so a killed store's cluster dies with it)."""

    def __init__(self) -> None:
        self._clusters: weakref.WeakKeyDictionary[StateStore, SimCluster] = weakref.WeakKeyDictionary()

    def cluster(self, store: StateStore) -> SimCluster:
        if store not in self._clusters:
            self._clusters[store] = SimCluster(store, [1, 2, 3])
        return self._clusters[store]

    async def snapshot(self, store: StateStore) -> object:
        cluster = SimCluster(store, [1, 2, 3])
        routes = [await cluster.metadata.get_route(t) for t in await cluster.metadata.table_ids()]
        leaders = [(r.table_id, [x.leader for x in r.regions]) for r in routes if r is not None]
        return await check_cluster(store), leaders


class MigrateTwoRegions(ClusterScenario):
    name = "region migration (2 regions, 1 -> 2)"

    async def prepare(self, store: StateStore) -> None:
        await SimCluster(store, [1, 2, 3]).create_table(TABLE, {1: 1, 2: 1}, {})

    def attach(self, manager: ProcedureManager, store: StateStore) -> None:
        RegionMigration.register_with(manager, lambda _p: VolatileContext(self.cluster(store)))

    async def procedures(self, store: StateStore) -> list[ProcedureWithId]:
        regions = [region_id(TABLE, 1), region_id(TABLE, 2)]
        return [ProcedureWithId.new(new_migration(self.cluster(store), regions, 1, 2))]
