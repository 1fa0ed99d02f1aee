"""Creating a table with one subprocedure per region: success, rollback, crashes, locks."""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from pathlib import Path

import pytest

from machines.create_table import CreateTable, new_create_table, register
from machines.region_migration import SimCluster, check_cluster
from machines.region_migration.cluster import DatanodeError
from procstore import ProcedureFailed, ProcedureManager, ProcedureWithId
from procstore.store import LocalDirStore, StateStore, open_state_store
from procstore.testing import FaultyStore, SimulatedCrash


def manager_on(store: StateStore, cluster: SimCluster, **options: float) -> ProcedureManager:
    manager = ProcedureManager(store, retry_delay=0.001, max_retry_delay=0.01, **options)  # type: ignore[arg-type]
    register(manager, cluster)
    return manager


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

    async def refuse_create(kind: str, region: int, **args: object) -> dict[str, object]:
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
    async def run(crash_at: int | None, when: str, target: str) -> int:
        faulty = FaultyStore(open_state_store(target), crash_at=crash_at, crash_when=when)  # type: ignore[arg-type]
        cluster = SimCluster(faulty, [1, 2, 3])
        pwid = ProcedureWithId.new(new_create_table(cluster, "cpu", 7, [1, 2, 3]))
        submitted = False
        first = manager_on(faulty, cluster)
        with contextlib.suppress(SimulatedCrash):
            await first.start()
            watcher = await first.submit(pwid)
            submitted = True
            done = asyncio.ensure_future(watcher.wait())
            crashed = asyncio.ensure_future(faulty.crashed.wait())
            await asyncio.wait([done, crashed], return_when=asyncio.FIRST_COMPLETED, timeout=20)
            crashed.cancel()
        await first.stop()
        if submitted:
            done.cancel()
        store = open_state_store(target)
        survivor = SimCluster(store, [1, 2, 3])
        await survivor.load()
        async with manager_on(store, survivor) as second:
            resumed = second.procedure_watcher(pwid.id)
            if resumed is None and not submitted:
                resumed = await second.submit(ProcedureWithId(pwid.id, new_create_table(survivor, "cpu", 7, [1, 2, 3])))
            if resumed is not None:
                await asyncio.wait_for(resumed.wait(), 20)
        assert await check_cluster(store) == []
        assert (await survivor.metadata.get_table_info(7) or {}).get("state") == "ready"
        assert await store.walk("procedure/") == []
        return len(faulty.ops)

    def url(n: int) -> str:
        return f"memory://ct-{uuid.uuid4().hex}/" if kind == "memory" else str(tmp_path / f"run-{n}")

    total = await run(None, "before", url(0))
    for crash_at in range(total):
        for when in ("before", "after"):
            try:
                await run(crash_at, when, url(crash_at * 2 + (when == "after")))
            except AssertionError as e:
                raise AssertionError(f"crash {when} operation {crash_at} of {total}: {e}") from e
