"""`Client.get` and `Client.list` carry what the manager running a procedure published
between its steps (backing off: attempt, last error), read from any process."""

from __future__ import annotations

import asyncio

from procstore import Client, ProcedureWithId
from tests.runtime.test_activity import GATES, Waits
from tests.support import StoreTarget, manager_for, store_targets

target = store_targets("memory", "local")


async def test_a_procedure_backing_off_shows_its_attempt_and_last_error(target: StoreTarget) -> None:
    GATES["client-retry"] = asyncio.Event()
    slow = manager_for(target, Waits, max_retry_times=1000, retry_delay=0.2, max_retry_delay=0.2)
    async with slow as manager, Client(target.url, target.storage_options) as client:
        procedure = ProcedureWithId.new(Waits({"how": "retry", "gate": "client-retry"}))
        watcher = await manager.submit(procedure)
        for _ in range(500):
            status = await client.get(procedure.id)
            if status.activity is not None and status.activity.attempt >= 2:
                break
            await asyncio.sleep(0.02)
        assert status.activity is not None and status.activity.doing == status.doing == "backing off"
        assert status.activity.last_error is not None and "the datanode is busy" in status.activity.last_error
        (listed,) = await client.list(id_prefix=str(procedure.id))
        assert listed.activity is not None and listed.activity.doing == "backing off"
        GATES["client-retry"].set()
        await asyncio.wait_for(watcher.wait(), 20)
        ended = await client.get(procedure.id)
        assert ended.activity is None and ended.doing is None
