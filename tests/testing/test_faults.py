"""Fault injection: transient errors, torn writes, delays, by wrapper and by URL."""

from __future__ import annotations

import asyncio
import uuid
from pathlib import Path

import fsspec
import pytest

from procstore import StoreError
from procstore.store import open_state_store
from procstore.store.local import LocalDirStore
from procstore.store.wrapping import WRITE_KINDS
from procstore.testing import Fault, FaultPlan, FaultyStore
from tests.procedures import World
from tests.runtime.helpers import steps
from tests.support import manager_for


async def test_transient_faults_are_retried(tmp_path: Path) -> None:
    fault = Fault(
        "transient", kinds=WRITE_KINDS, key="procedure/*/000000000[1-9].step", times=3
    )  # steps, not the submit
    store = FaultyStore(LocalDirStore(tmp_path), faults=[fault])
    world = World.new()
    async with manager_for(store, max_retry_times=3) as manager:
        assert await (await manager.submit(steps(world, 3))).wait() == "steps done"
    assert fault.fired == 3
    assert world.log == ["steps/0", "steps/1", "steps/2"]  # the failed writes did not re-run steps


async def test_a_fault_after_the_operation_has_landed(tmp_path: Path) -> None:
    """The answer is lost, not the write: retrying must not write the key twice."""
    fault = Fault("transient", kinds=frozenset({"put_if_absent"}), when="after", times=1)
    store = FaultyStore(LocalDirStore(tmp_path), faults=[fault])
    world = World.new()
    async with manager_for(store, max_retry_times=0) as manager:  # submit would retry it
        with pytest.raises(StoreError, match="it landed"):
            await manager.submit(steps(world, 2))
    # The submit reported failure although the first step landed: the next start runs it.
    async with manager_for(LocalDirStore(tmp_path)) as manager:
        [info] = manager.list_procedures()
        watcher = manager.procedure_watcher(info.id)
        assert watcher is not None and await watcher.wait() == "steps done"


async def test_torn_write_is_reported_and_kept(tmp_path: Path) -> None:
    fault = Fault("tear", kinds=WRITE_KINDS, key="*/0000000001.step")
    store = FaultyStore(LocalDirStore(tmp_path), faults=[fault])
    world = World.new()
    manager = manager_for(store)
    await manager.start()
    await manager.submit(steps(world, 3))
    await asyncio.wait_for(store.crashed.wait(), 10)  # the runner died as a killed process would
    await manager.stop()
    async with manager_for(LocalDirStore(tmp_path)) as manager:
        [problem] = manager.recovery_problems
        assert problem.key.endswith("0000000001.step") and "not JSON" in problem.reason
    assert (tmp_path / problem.key).read_bytes() != b""  # half a value, kept for the operator


async def test_delays_slow_but_do_not_break(memory_target: object) -> None:
    fault = Fault("delay", kinds=WRITE_KINDS | {"get"}, seconds=0.01)
    store = FaultyStore(open_state_store(f"memory://slow-{uuid.uuid4().hex}/"), faults=[fault])
    world = World.new()
    async with manager_for(store) as manager:
        assert await (await manager.submit(steps(world, 2))).wait() == "steps done"
    assert fault.fired >= 2


async def test_faulty_url_wraps_any_fsspec_filesystem() -> None:
    name = f"/faulty-{uuid.uuid4().hex}"
    inner = fsspec.filesystem("memory")
    plan = FaultPlan([Fault("transient", kinds=WRITE_KINDS, key="*/000000000[1-9].step", times=2)])
    options = {"fs": inner, "path": name, "plan": plan}
    world = World.new()
    async with manager_for("faulty://store/", storage_options=options) as manager:
        assert await (await manager.submit(steps(world, 3))).wait() == "steps done"
    assert plan.faults[0].fired == 2 and any(op.kind in WRITE_KINDS for op in plan.landed())

    crash = FaultPlan([Fault("crash", nth=2)])
    options = {"fs": inner, "path": name, "plan": crash}
    manager = manager_for("faulty://store/", storage_options=options)
    await manager.start()
    await manager.submit(steps(world, 4, name="again"))
    await asyncio.wait_for(crash.crashed.wait(), 10)
    await manager.stop()
    # Restarted through the same filesystem, with no faults planned this time.
    async with manager_for(
        "faulty://store/", storage_options={"fs": inner, "path": name, "plan": FaultPlan([])}
    ) as manager:
        [info] = manager.list_procedures()
        watcher = manager.procedure_watcher(info.id)
        assert watcher is not None and await watcher.wait() == "again done"
