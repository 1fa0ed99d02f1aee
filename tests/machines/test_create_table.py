"""Creating a table with one subprocedure per region: success, rollback, crashes, locks."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from procstore import ProcedureFailed, ProcedureManager, ProcedureWithId
from procstore.store import StateStore
from procstore.store.local import LocalDirStore
from procstore.testing import CrashExplorer
from procstore_machines.create_table import CreateTable, new_create_table, register
from procstore_machines.region_migration import SimCluster, check_cluster
from procstore_machines.region_migration.cluster import DatanodeError
from tests.machines.scenarios import CreateThreeRegionTable, run_url
from tests.support import manager_for


def manager_on(store: StateStore, cluster: SimCluster, **options: Any) -> ProcedureManager:
    return manager_for(store, register=lambda m: register(m, cluster), **options)


async def test_creates_the_table_and_its_regions(tmp_path: Path) -> None:
    store = LocalDirStore(tmp_path)
    cluster = SimCluster(store, [1, 2, 3])
    async with manager_on(store, cluster) as manager:
        watcher = await manager.submit(ProcedureWithId.new(new_create_table(cluster, "cpu", 7, [1, 2, 3, 1])))
        assert await watcher.wait() == {"table_id": 7, "regions": 4}
        children = [i for i in manager.list_procedures() if i.parent_id == watcher.procedure_id]
        assert len(children) == 4
        assert {str(k) for i in children for k in i.lock_keys} == {
            f"exclusive:greptime.public.cpu.region-{n}" for n in range(1, 5)
        }
    route = await cluster.metadata.get_route(7)
    assert route is not None and [r.leader for r in route.regions] == [1, 2, 3, 1]
    assert (await cluster.metadata.get_table_info(7)) == {"name": "greptime.public.cpu", "state": "ready"}
    assert await check_cluster(store) == []
    assert await store.walk("procedure/") == []


async def test_a_failed_region_rolls_the_whole_table_back(tmp_path: Path) -> None:
    store = LocalDirStore(tmp_path)
    cluster = SimCluster(store, [1, 2, 3])
    original = cluster.datanodes[3].handle

    async def refuse_create(kind: str, region: int, **args: Any) -> dict[str, object]:
        if kind == "create":
            raise DatanodeError("disk full")
        return await original(kind, region, **args)

    cluster.datanodes[3].handle = refuse_create  # type: ignore[method-assign,assignment]
    async with manager_on(store, cluster, max_retry_times=2) as manager:
        watcher = await manager.submit(ProcedureWithId.new(new_create_table(cluster, "cpu", 7, [1, 2, 3])))
        with pytest.raises(ProcedureFailed, match=r"regions \[3\]"):
            await watcher.wait()
    assert await cluster.metadata.get_route(7) is None
    assert await cluster.metadata.get_table_info(7) is None
    assert all(not node.replicas for node in cluster.datanodes.values())
    assert await check_cluster(store) == []


async def test_second_create_of_the_same_table_waits_then_finds_it(tmp_path: Path) -> None:
    store = LocalDirStore(tmp_path)
    cluster = SimCluster(store, [1, 2])
    async with manager_on(store, cluster) as manager:
        first = await manager.submit(ProcedureWithId.new(new_create_table(cluster, "cpu", 7, [1, 2])))
        second = await manager.submit(ProcedureWithId.new(new_create_table(cluster, "cpu", 7, [1, 2])))
        assert await first.wait() == await second.wait()
    assert [n for n, _, _ in cluster.mailbox.sent].count(1) == 1  # the second created nothing


def test_stored_form(tmp_path: Path) -> None:
    machine = new_create_table(SimCluster(LocalDirStore(tmp_path), [1]), "cpu", 7, [1])
    assert machine.dump() == (
        '{"persistent_ctx":{"catalog":"greptime","schema":"public","table":"cpu","table_id":7,'
        '"regions":[{"number":1,"leader":1}]},"state":{"create_table_state":"Prepare"}}'
    )
    assert CreateTable.decode(machine.dump())[0] == machine.persistent


@pytest.mark.parametrize("kind", ["memory", "local"])
async def test_crash_at_every_store_operation(tmp_path: Path, kind: str) -> None:
    """Killed before and after every store operation (the machine's own and the world's)."""
    report = await CrashExplorer(CreateThreeRegionTable(), run_url(tmp_path, kind)).explore(double_execution=True)
    report.assert_ok()
    assert report.operations > 5
