"""`Client.get` says when no manager leads the store: a procedure nothing runs does not look alive."""

from __future__ import annotations

import asyncio
from pathlib import Path

from procstore import Client, Lease
from procstore.store.local import LocalDirStore
from procstore.testing import kill_manager
from tests.procedures import World
from tests.runtime.helpers import blocker, steps
from tests.support import manager_for


async def test_a_procedure_whose_leader_died_says_no_manager_until_one_leads(tmp_path: Path) -> None:
    name, _ = blocker()
    manager = manager_for(LocalDirStore(tmp_path), lease=Lease(ttl=1.0, holder="cp-1"))
    await manager.start()
    await asyncio.wait_for(manager.wait_until_leading(), 10)
    procedure = steps(World.new(), 2, block=name)
    await manager.submit(procedure)
    async with Client(tmp_path) as client:
        assert (await client.get(procedure.id)).doing == "running"
        await kill_manager(manager)  # its lease stays, unrenewed
        await manager.stop()
        for _ in range(100):
            status = await client.get(procedure.id)
            if status.no_manager:
                break
            await asyncio.sleep(0.05)
        assert status.no_manager and status.doing == "no manager" and status.status == "unfinished"
        listed = await client.list()
        assert [s.doing for s in listed if s.id == procedure.id] == ["no manager"]
    # A store whose managers run without a lease says nothing of it.
    async with manager_for(LocalDirStore(tmp_path / "plain")) as plain, Client(tmp_path / "plain") as client:
        other = steps(World.new(), 2, block=name)
        await plain.submit(other)
        assert not (await client.get(other.id)).no_manager
