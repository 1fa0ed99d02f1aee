"""Durable waits across a takeover, on each store and in real time: a leader is killed while
a procedure sleeps, another waits for a signal and a third holds a concurrency slot; a
client sends the signal while no manager leads; the standby that takes over wakes the
sleeper, delivers the signal once and keeps the slot held."""

from __future__ import annotations

import asyncio

from procstore import Client, Lease, ProcedureManager
from procstore.testing import kill_manager
from tests.runtime.test_flow_control import PEAK, RUNNING, Migration, migration
from tests.runtime.test_signals import Waiter, waiter
from tests.runtime.test_timers import Sleeper, sleeper
from tests.support import StoreTarget, manager_for, store_targets

target = store_targets("memory", "local", "s3")


def leased(target: StoreTarget, holder: str) -> ProcedureManager:
    lease = Lease(ttl=1.0, holder=holder)
    return manager_for(target, Sleeper, Waiter, Migration, lease=lease, request_poll_interval=0.1)


async def test_a_standby_takes_over_sleepers_signal_waiters_and_slots(target: StoreTarget) -> None:
    RUNNING.clear()
    PEAK.clear()
    sleeping, waiting = sleeper(2.0), waiter()
    slotted = [migration(key="cluster/takeover", limit=1, seconds=1.0) for _ in range(2)]
    first, second = leased(target, "first"), leased(target, "second")
    await first.start()
    try:
        await first.wait_until_leading()
        await second.start()
        for procedure in (sleeping, waiting, *slotted):
            await first.submit(procedure)
        await asyncio.sleep(0.3)  # the sleeper and the waiter have stored their waits
        await kill_manager(first)
        async with Client(target.url, target.storage_options) as client:
            await client.signal(waiting.id, "go", {"n": 1})
        await asyncio.wait_for(second.wait_until_leading(), 30)
        watchers = {p.id: second.procedure_watcher(p.id) for p in (sleeping, waiting, *slotted)}
        assert all(w is not None for w in watchers.values()), watchers
        outputs = {pid: await asyncio.wait_for(w.wait(), 30) for pid, w in watchers.items() if w is not None}
        assert outputs[waiting.id] == [{"go": {"n": 1}}]  # delivered once, to the step that read it
        assert isinstance(outputs[sleeping.id], float)
        assert PEAK["cluster/takeover"] == 1  # the limit held across the two leaders
    finally:
        await second.stop()
        await first.stop()
