"""A manager without `lease=` refuses a store whose lease has a live holder (issue 32,
item 10): it would run the leader's procedures a second time."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from procstore import Lease, LeaseHeld, ProcedureManager, StoreUnavailable
from procstore.testing import kill_manager
from tests.procedures import World
from tests.runtime.helpers import blocker, eventually, steps
from tests.support import StoreTarget, manager_for, store_targets

TTL = 1.0

target = store_targets("local", "memory", "s3")


def leader(target: StoreTarget, **options: Any) -> ProcedureManager:
    return manager_for(target, lease=Lease(ttl=TTL, holder="cp-1.internal:7000"), **options)


async def test_a_manager_without_a_lease_refuses_a_store_whose_leader_renews_its_lease(target: StoreTarget) -> None:
    world = World.new()
    gate, opened = blocker()
    async with leader(target) as first:
        await first.wait_until_leading()
        await first.submit(steps(world, 3, block=gate, block_at=1))
        await eventually(lambda: world.counts["steps/0"] == 1)
        lone = manager_for(target)
        with pytest.raises(LeaseHeld) as refused:
            await lone.start()
        assert isinstance(refused.value, StoreUnavailable)
        assert refused.value.key == "lease/procedures.json"
        assert refused.value.holder == "cp-1.internal:7000"
        message = str(refused.value)
        assert "lease/procedures.json" in message and "cp-1.internal:7000" in message
        assert "lease=" in message and "stop" in message
        assert not lone.is_running
        assert world.counts["steps/0"] == 1  # nothing ran a second time
        opened.set()


async def test_a_manager_without_a_lease_starts_once_the_leader_has_released_it(target: StoreTarget) -> None:
    world = World.new()
    async with leader(target) as first:
        await first.wait_until_leading()
    async with manager_for(target) as lone:
        watcher = await lone.submit(steps(world, 2))
        await asyncio.wait_for(watcher.wait(), 10)


async def test_a_manager_without_a_lease_starts_after_a_killed_leaders_lease_expired_and_runs_its_work(
    target: StoreTarget,
) -> None:
    world = World.new()
    gate, opened = blocker()
    first = leader(target)
    await first.start()
    pid = (await first.submit(steps(world, 3, block=gate, block_at=1))).procedure_id
    await eventually(lambda: world.counts["steps/0"] == 1)
    await kill_manager(first)  # its lease stays as it was, unreleased, until it expires
    opened.set()
    async with manager_for(target) as lone:  # watches the lease for a TTL, then starts
        watcher = lone.procedure_watcher(pid)
        assert watcher is not None
        await asyncio.wait_for(watcher.wait(), 10)
    await first.stop()


async def test_the_lease_looked_at_is_the_one_under_the_managers_parent_path(memory_target: StoreTarget) -> None:
    async with leader(memory_target, parent_path="region-a/") as first:
        await first.wait_until_leading()
        with pytest.raises(LeaseHeld) as refused:
            await manager_for(memory_target, parent_path="region-a/").start()
        assert refused.value.key == "region-a/lease/procedures.json"
        async with manager_for(memory_target, parent_path="region-b/") as other:  # another region's store
            assert other.is_running


async def test_a_parent_path_without_a_slash_keeps_every_key_under_it() -> None:
    """`parent_path="region-a"` is the folder `region-a/` (as `ProcedureStore` reads it): the
    leased manager's probe of the store's conditional writes goes there too, not to
    `region-alease/` (outside a prefix that a bucket policy may be the only one allowed)."""
    from procstore.ids import ProcedureId
    from procstore.store.wrapping import MUTATING_KINDS
    from procstore.testing import FaultyStore, MemoryStore

    recorder = FaultyStore(MemoryStore(f"slash-{ProcedureId.random()}"))
    world = World.new()
    async with ProcedureManager(recorder, lease=Lease(ttl=TTL), parent_path="region-a") as manager:
        await manager.wait_until_leading()
        await asyncio.wait_for((await manager.submit(steps(world, 2))).wait(), 10)
    written = {key for op in recorder.ops if op.kind in MUTATING_KINDS for key in op.key.split(",")}
    assert written and sorted(key for key in written if not key.startswith("region-a/")) == []
