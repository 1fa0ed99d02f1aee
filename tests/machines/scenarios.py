"""Crash-explorer scenarios for the machines: each builds its world in the run's store."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from pathlib import Path

from procstore import ProcedureManager, ProcedureWithId
from procstore.store import StateStore
from procstore.testing import Scenario
from procstore_machines.create_table import new_create_table
from procstore_machines.create_table import register as register_create_table
from procstore_machines.publish import new_publish, read_current
from procstore_machines.publish import register as register_publish
from procstore_machines.region_migration import SimCluster
from procstore_machines.region_migration.scenario import TABLE, ClusterScenario, MigrateTwoRegions

__all__ = ["TABLE", "ClusterScenario", "MigrateTwoRegions"]


def run_url(tmp_path: Path, kind: str) -> Callable[[int], str]:
    """A fresh store per explorer run: a memory:// name or a folder under `tmp_path`."""
    if kind == "memory":
        return lambda n: f"memory://machines-{uuid.uuid4().hex}/"
    return lambda n: str(tmp_path / f"run-{n}")


class CreateThreeRegionTable(ClusterScenario):
    name = "create table (3 regions)"

    def attach(self, manager: ProcedureManager, store: StateStore) -> None:
        register_create_table(manager, self.cluster(store))

    async def procedures(self, store: StateStore) -> list[ProcedureWithId]:
        return [ProcedureWithId.new(new_create_table(self.cluster(store), "cpu", 7, [1, 2, 3]))]

    async def snapshot(self, store: StateStore) -> object:
        info = await SimCluster(store, [1]).metadata.get_table_info(7)
        return await super().snapshot(store), info


class PublishV2(Scenario):
    """Site, build output and procedures share the run's store: every write is a kill point."""

    name = "publish docs v2 over v1"

    async def prepare(self, store: StateStore) -> None:
        for version, files in {"v1": {"index.html": b"one"}, "v2": {"index.html": b"two", "b.css": b"b"}}.items():
            for path, data in files.items():
                await store.put(f"docs/{version}/{path}", data)
        await store.put("docs/current", b'{"version":"v1"}')
        await store.put("docs/versions/v1/index.html", b"one")

    def attach(self, manager: ProcedureManager, store: StateStore) -> None:
        register_publish(manager, store, store)

    async def procedures(self, store: StateStore) -> list[ProcedureWithId]:
        return [ProcedureWithId.new(await new_publish(store, store, "docs", "v2"))]

    async def snapshot(self, store: StateStore) -> object:
        return (await read_current(store, "docs"))[0], await store.walk("docs/versions/")
