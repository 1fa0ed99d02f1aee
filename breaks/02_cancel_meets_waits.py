"""A cancel (through a Client, from another 'process') of a parent whose child is parked in
a durable sleep / a signal wait / a concurrency slot wait; a cancel of a child sleeping."""

import asyncio
import sys
import uuid

from procstore import Client, Context, Procedure, ProcedureManager, ProcedureWithId, Status
from procstore.flow import Concurrency
from procstore.testing import MemoryStore

MODE = sys.argv[1] if len(sys.argv) > 1 else "sleep"


class Child(Procedure):
    type_name = "b::Child"

    def __init__(self, data: str = "") -> None:
        self.n = int(data or 0)

    async def execute(self, ctx: Context) -> Status:
        self.n += 1
        if self.n > 1:
            return Status.done()
        if MODE == "sleep":
            return Status.sleep(3600)
        if MODE == "signal":
            return Status.wait_for_signal("go")
        await asyncio.sleep(3600)
        return Status.done()

    def concurrency(self) -> Concurrency | None:
        return Concurrency("k", 1) if MODE == "slot" else None

    def dump(self) -> str:
        return str(self.n)

    @classmethod
    def load(cls, data: str) -> "Child":
        return cls(data)


class Parent(Procedure):
    type_name = "b::Parent"

    def __init__(self, data: str = "") -> None:
        self.spawned = data == "1"

    async def execute(self, ctx: Context) -> Status:
        if self.spawned:
            return Status.done()
        self.spawned = True
        kids = [ProcedureWithId.new(Child()) for _ in range(2 if MODE == "slot" else 1)]
        return Status.suspended(kids)

    async def rollback(self, ctx: Context) -> None:
        pass

    def rollback_supported(self) -> bool:
        return True

    def dump(self) -> str:
        return "1" if self.spawned else ""

    @classmethod
    def load(cls, data: str) -> "Parent":
        return cls(data)


async def main() -> None:
    store = MemoryStore(f"b02-{uuid.uuid4().hex[:8]}")
    async with ProcedureManager(store, request_poll_interval=0.05) as manager:
        manager.register(Parent)
        manager.register(Child)
        parent = ProcedureWithId.new(Parent())
        watcher = await manager.submit(parent)
        await asyncio.sleep(0.5)
        async with Client(store) as client:
            print("before:", [(s.id, s.status, s.doing, s.waiting) for s in await client.list()])
            await client.cancel(parent.id, reason="stop")
            try:
                async with asyncio.timeout(5):
                    await watcher.wait()
            except TimeoutError:
                print("after:", [(str(s.id)[:8], s.status, s.doing, s.waiting) for s in await client.list()])
                raise AssertionError(f"{MODE}: the parent's cancel did not end it within 5 s") from None
            except Exception as e:
                print(MODE, "ended:", type(e).__name__, e)


asyncio.run(main())
