"""The lease's clock counts a suspended machine (issue 32, item 14): a holder whose machine
was suspended since its last renewal takes its lease as lapsed and writes nothing more
until it has won the lease again."""

from __future__ import annotations

import asyncio
import time

import pytest

from procstore import Lease, LeaseClock, LeaseExpired
from procstore._runtime.lease import LEASE_KEY
from procstore.store import open_state_store
from procstore.testing import FaultyStore, SuspendableClock, run_simulated
from tests.procedures import World
from tests.runtime.helpers import blocker, eventually, steps
from tests.support import StoreTarget, manager_for

TTL = 1.0


@pytest.mark.parametrize("suspend", [TTL * 0.3, TTL * 3], ids=["shorter-than-the-lease", "longer-than-the-lease"])
async def test_a_holder_whose_machine_was_suspended_writes_nothing_until_it_wins_the_lease_again(
    local_target: StoreTarget, suspend: float
) -> None:
    world = World.new()
    store = FaultyStore(open_state_store(local_target.url))
    clock = SuspendableClock()
    manager = manager_for(store, lease=Lease(ttl=TTL, holder="cp-1", clock=clock))
    await manager.start()
    gate, opened = blocker()
    pid = (await manager.submit(steps(world, 3, block=gate, block_at=1))).procedure_id
    await eventually(lambda: world.counts["steps/0"] == 1)
    woke_at = len(store.ops)
    clock.suspend(suspend)  # the monotonic clock did not move: only the boot-time clock knows
    opened.set()  # the runner's write of its next step must be refused
    await eventually(lambda: (s := manager.procedure_state(pid)) is not None and s.is_done(), timeout=10)
    writes = [op for op in store.ops[woke_at:] if op.kind in ("put", "put_if_absent", "put_if_version")]
    assert writes[0].key == LEASE_KEY, writes[:3]
    assert manager.lease_epoch == 2
    await manager.stop()
    await store.inner.close()


async def test_a_submit_just_after_a_suspend_is_refused_saying_why(memory_target: StoreTarget) -> None:
    world = World.new()
    clock = SuspendableClock()
    async with manager_for(memory_target, lease=Lease(ttl=TTL, holder="cp-1", clock=clock)) as manager:
        await manager.wait_until_leading()
        clock.suspend(0.5)
        with pytest.raises(LeaseExpired, match="suspended for 0.5"):
            await manager.submit(steps(world, 1))


def test_the_default_clock_counts_suspend_and_reads_virtual_time_on_a_simulated_loop(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    clock = LeaseClock()
    if hasattr(time, "CLOCK_BOOTTIME"):
        # The boot-time clock itself, not the monotonic one: which clock it asks for.
        asked: list[int] = []

        def clock_gettime(which: int) -> float:
            asked.append(which)
            return 42.0

        monkeypatch.setattr(time, "clock_gettime", clock_gettime)
        assert clock.now() == 42.0 and asked == [time.CLOCK_BOOTTIME]
        monkeypatch.undo()

    async def virtual() -> tuple[float, float]:
        await asyncio.sleep(3600)
        return clock.now(), clock.suspended()

    assert run_simulated(virtual()) == (3600.0, 0.0)
