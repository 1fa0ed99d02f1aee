"""Region migration against a simulated cluster (see `machine.py` and `cluster.py`)."""

from procstore_machines.region_migration.cluster import SimCluster, check_cluster, region_id
from procstore_machines.region_migration.machine import (
    PersistentContext,
    RegionMigration,
    VolatileContext,
    new_migration,
)

__all__ = [
    "PersistentContext",
    "RegionMigration",
    "SimCluster",
    "VolatileContext",
    "check_cluster",
    "new_migration",
    "region_id",
]
