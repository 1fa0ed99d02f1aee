"""Region migration on the simulated cluster: stored form, paths, faults, crashes."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from procstore import Lease, ProcedureFailed, ProcedureManager, ProcedureWithId
from procstore.machine import Duration
from procstore.store import StateStore
from procstore.store.local import LocalDirStore
from procstore.testing import CrashExplorer
from procstore_machines.region_migration import (
    RegionMigration,
    SimCluster,
    VolatileContext,
    check_cluster,
    new_migration,
)
from procstore_machines.region_migration.cluster import StaleFencingToken, region_id
from procstore_machines.region_migration.machine import OpenCandidateRegion, PersistentContext, UpdateMetadata
from tests.machines.scenarios import MigrateTwoRegions, run_url
from tests.support import manager_for

DATA = Path(__file__).parent / "data"
TABLE = 1024
REGION = region_id(TABLE, 1)


async def new_cluster(store: StateStore, regions: int = 1) -> SimCluster:
    cluster = SimCluster(store, [1, 2, 3])
    await cluster.create_table(TABLE, {n: 1 for n in range(1, regions + 1)}, {})
    return cluster


def manager_on(store: StateStore, cluster: SimCluster) -> ProcedureManager:
    return manager_for(store, register=lambda m: RegionMigration.register_with(m, lambda _p: VolatileContext(cluster)))


async def migrate(store: StateStore, cluster: SimCluster, machine: RegionMigration) -> object:
    async with manager_on(store, cluster) as manager:
        watcher = await manager.submit(ProcedureWithId.new(machine))
        return await asyncio.wait_for(watcher.wait(), 20)


def test_serialized_form_matches_greptimedb(tmp_path: Path) -> None:
    cluster = SimCluster(LocalDirStore(tmp_path), [1, 2])
    machine = new_migration(cluster, [REGION], 1, 2)
    assert REGION == 4398046511105
    assert machine.dump() == (
        '{"persistent_ctx":{"catalog":"greptime","schema":"public","from_peer":{"id":1,"addr":""},'
        '"to_peer":{"id":2,"addr":""},"region_id":4398046511105,"timeout":"10s"},'
        '"state":{"region_migration_state":"RegionMigrationStart"}}'
    )


def test_backward_compatibility() -> None:
    """Frozen samples: GreptimeDB's context without `timeout`, and one of every state as
    procstore first wrote them. Changing how these load breaks stored procedures."""
    old = '{"catalog":"greptime","schema":"public","from_peer":{"id":1,"addr":""},"to_peer":{"id":2,"addr":""},"region_id":4398046511105}'  # noqa: E501
    from procstore.machine.codec import convert

    ctx = convert(__import__("orjson").loads(old), PersistentContext, machine="m", field="persistent_ctx")
    assert ctx.timeout == Duration(seconds=10) and ctx.region_ids == []
    for line in (DATA / "region_migration_v1.jsonl").read_text().splitlines():
        persistent, state = RegionMigration.decode(line)
        assert persistent.region_id == REGION
        machine = RegionMigration(persistent, state, None)  # type: ignore[arg-type]
        assert machine.dump() == line


def test_short_form_of_update_metadata() -> None:
    data = (
        '{"persistent_ctx":{"catalog":"greptime","schema":"public","from_peer":{"id":1,"addr":""},'
        '"to_peer":{"id":2,"addr":""},"region_id":4398046511105},"state":{"UpdateMetadata":"Downgrade"}}'
    )
    _, state = RegionMigration.decode(data)
    assert isinstance(state, UpdateMetadata) and state.kind.value == "Downgrade"


def test_lock_keys(tmp_path: Path) -> None:
    machine = new_migration(SimCluster(LocalDirStore(tmp_path), [1, 2]), [REGION, REGION + 1], 1, 2)
    assert [str(k) for k in machine.lock_key()] == [
        "share:catalog/greptime",
        f"exclusive:region/{REGION}",
        f"exclusive:region/{REGION + 1}",
        "share:schema/greptime/public",
        f"exclusive:table/{TABLE}",
    ]


async def test_migrates_several_regions(tmp_path: Path) -> None:
    store = LocalDirStore(tmp_path)
    cluster = await new_cluster(store, regions=3)
    regions = [region_id(TABLE, n) for n in (1, 2, 3)]
    output = await migrate(store, cluster, new_migration(cluster, regions, 1, 2))
    assert output == {"regions": regions, "leader": 2}
    route = await cluster.metadata.get_route(TABLE)
    assert route is not None and all(r.leader == 2 and not r.leader_downgrading for r in route.regions)
    assert await check_cluster(store) == []
    assert await store.walk("procedure/") == []


async def test_retryable_mailbox_timeouts(tmp_path: Path) -> None:
    store = LocalDirStore(tmp_path)
    cluster = await new_cluster(store)
    cluster.mailbox.fault(2).timeouts = 2  # opening the candidate times out twice
    await migrate(store, cluster, new_migration(cluster, [REGION], 1, 2))
    assert [s for s in cluster.mailbox.sent if s[1] == "open"] == [(2, "open", REGION)] * 3
    assert await check_cluster(store) == []


async def test_upgrade_failing_past_the_timeout_rolls_back(tmp_path: Path) -> None:
    store = LocalDirStore(tmp_path)
    cluster = await new_cluster(store)
    cluster.datanodes[2].handle = _refuse("upgrade", cluster.datanodes[2].handle)  # type: ignore[method-assign,assignment]
    machine = new_migration(cluster, [REGION], 1, 2, timeout=Duration(milliseconds=200))
    with pytest.raises(ProcedureFailed, match="could not be upgraded"):
        await migrate(store, cluster, machine)
    route = await cluster.metadata.get_route(TABLE)
    assert route is not None and route.regions[0].leader == 1 and not route.regions[0].leader_downgrading
    assert await check_cluster(store) == []


def _refuse(instruction: str, handle: object) -> object:
    from procstore_machines.region_migration.cluster import DatanodeError

    async def handler(kind: str, region: int, **args: object) -> object:
        if kind == instruction:
            raise DatanodeError(f"{kind} refused")
        return await handle(kind, region, **args)  # type: ignore[operator]

    return handler


async def test_unreachable_leader_takes_the_lease_slow_path(tmp_path: Path) -> None:
    store = LocalDirStore(tmp_path)
    cluster = await new_cluster(store)
    cluster.mailbox.fault(1).partitioned = True
    expired: list[tuple[int, int]] = []
    expire_lease = cluster.expire_lease

    async def record(node_id: int, region: int, fencing_token: int | None = None) -> None:
        expired.append((node_id, region))
        await expire_lease(node_id, region, fencing_token)

    cluster.expire_lease = record  # type: ignore[method-assign]
    await migrate(store, cluster, new_migration(cluster, [REGION], 1, 2))
    assert (1, REGION) in expired  # gave up on the old leader and let its lease run out
    assert cluster.datanodes[1].replicas[REGION].role == "follower"
    assert await check_cluster(store) == []


async def test_aborts_when_the_region_is_led_elsewhere(tmp_path: Path) -> None:
    store = LocalDirStore(tmp_path)
    cluster = await new_cluster(store)
    with pytest.raises(ProcedureFailed, match="not led by 3"):
        await migrate(store, cluster, new_migration(cluster, [REGION], 3, 2))
    assert await check_cluster(store) == []


async def test_a_datanode_refuses_a_lower_fencing_token_than_it_has_seen(tmp_path: Path) -> None:
    cluster = await new_cluster(LocalDirStore(tmp_path))
    await cluster.mailbox.send(2, "open", REGION, 1.0, fencing_token=5)
    with pytest.raises(StaleFencingToken, match="seen fencing token 5, refusing 4"):
        await cluster.mailbox.send(2, "upgrade", REGION, 1.0, fencing_token=4)
    assert cluster.datanodes[2].replicas[REGION].role == "follower"
    await cluster.mailbox.send(2, "upgrade", REGION, 1.0, fencing_token=5)  # the same term goes on
    await cluster.mailbox.send(3, "open", REGION, 1.0)  # no lease, no token: not fenced
    assert cluster.datanodes[2].replicas[REGION].role == "leader"


async def test_a_migration_sends_its_terms_fencing_token_to_the_datanodes(tmp_path: Path) -> None:
    store = LocalDirStore(tmp_path)
    cluster = await new_cluster(store)
    register = lambda m: RegionMigration.register_with(m, lambda _p: VolatileContext(cluster))  # noqa: E731
    async with manager_for(store, register=register, lease=Lease(ttl=5)) as manager:
        watcher = await manager.submit(ProcedureWithId.new(new_migration(cluster, [REGION], 1, 2)))
        await asyncio.wait_for(watcher.wait(), 20)
        assert manager.lease_epoch is not None
        assert {n: node.fences[REGION] for n, node in cluster.datanodes.items() if node.fences} == {
            1: manager.lease_epoch,
            2: manager.lease_epoch,
        }
    assert await check_cluster(store) == []


async def test_a_migration_resumed_after_its_region_moved_elsewhere_aborts(tmp_path: Path) -> None:
    """A migration (1 -> 2) stored past its start, whose run ended without its end stored
    (which let go of its region lock) while another migration moved the region to 3.
    Resumed, it must not make 2 a second leader (cluster simulator, machines seed 6584)."""
    store = LocalDirStore(tmp_path)
    cluster = await new_cluster(store)
    await migrate(store, cluster, new_migration(cluster, [REGION], 1, 3))
    stale = new_migration(cluster, [REGION], 1, 2)
    pid = ProcedureWithId.new(stale).id
    async with manager_on(store, cluster) as manager:
        await manager.store.store_procedure(pid, 0, RegionMigration.type_name, stale.dump(), None)
        stale.state = OpenCandidateRegion()
        await manager.store.store_procedure(pid, 1, RegionMigration.type_name, stale.dump(), None)
    async with manager_on(store, cluster) as manager:
        watcher = manager.procedure_watcher(pid)
        assert watcher is not None
        with pytest.raises(ProcedureFailed, match="not led by 1"):
            await asyncio.wait_for(watcher.wait(), 20)
    assert await check_cluster(store) == []


async def test_unknown_state_tag_is_reported_with_key_machine_and_field(tmp_path: Path) -> None:
    store = LocalDirStore(tmp_path)
    cluster = await new_cluster(store)
    bad = new_migration(cluster, [REGION], 1, 2).dump().replace("RegionMigrationStart", "Teleport")
    manager = manager_on(store, cluster)
    async with manager:
        pid = ProcedureWithId.new(new_migration(cluster, [REGION], 1, 2)).id
        await manager.store.store_procedure(pid, 0, RegionMigration.type_name, bad, None)
    async with manager_on(store, cluster) as manager:
        [problem] = manager.recovery_problems
        text = str(problem)
        for fragment in (str(pid), "0000000000.step", RegionMigration.type_name, "state.region_migration_state",
                         "'Teleport'", "RegionMigrationStart"):  # fmt: skip
            assert fragment in text, text


@pytest.mark.parametrize("kind", ["memory", "local"])
async def test_crash_at_every_store_operation(tmp_path: Path, kind: str) -> None:
    """Killed before and after every store operation (the machine's own and the world's)."""
    report = await CrashExplorer(MigrateTwoRegions(), run_url(tmp_path, kind)).explore(double_execution=True)
    report.assert_ok()
    assert report.operations > 5


async def test_waits_for_the_candidates_region_opened_signal(tmp_path: Path) -> None:
    store = LocalDirStore(tmp_path)
    cluster = await new_cluster(store, regions=2)
    cluster.datanodes[2].open_delay = 0.2  # opens asynchronously, then signals the migration
    regions = [region_id(TABLE, 1), region_id(TABLE, 2)]
    async with manager_for(
        store,
        register=lambda m: RegionMigration.register_with(m, lambda _p: VolatileContext(cluster)),
        request_poll_interval=0.05,
    ) as manager:
        watcher = await manager.submit(ProcedureWithId.new(new_migration(cluster, regions, 1, 2)))
        seen: set[str | None] = set()
        while not watcher.state.is_ended():
            seen.update(info.waiting for info in manager.list_procedures())
            await asyncio.sleep(0.01)
        assert await asyncio.wait_for(watcher.wait(), 20) == {"regions": regions, "leader": 2}
    assert any(w and w.startswith("waiting for signal 'region-opened' until") for w in seen)
    # Asked per region, and again after each signal: never polled with retries.
    assert 2 * len(regions) <= len([s for s in cluster.mailbox.sent if s[1] == "open"]) <= 4 * len(regions)
    assert await check_cluster(store) == []


async def test_falls_back_to_polling_when_the_signal_does_not_come(tmp_path: Path) -> None:
    store = LocalDirStore(tmp_path)
    cluster = await new_cluster(store)
    cluster.datanodes[2].open_delay = 0.5  # longer than the migration's timeout
    machine = new_migration(cluster, [REGION], 1, 2, timeout=Duration(seconds=0.1))
    async with manager_for(
        store,
        register=lambda m: RegionMigration.register_with(m, lambda _p: VolatileContext(cluster)),
        request_poll_interval=60.0,  # the signal is never seen in time
        max_retry_times=50,
        retry_delay=0.05,
        max_retry_delay=0.05,
    ) as manager:
        watcher = await manager.submit(ProcedureWithId.new(machine))
        assert await asyncio.wait_for(watcher.wait(), 20) == {"regions": [REGION], "leader": 2}
    assert len([s for s in cluster.mailbox.sent if s[1] == "open"]) > 2  # polled
    assert await check_cluster(store) == []
