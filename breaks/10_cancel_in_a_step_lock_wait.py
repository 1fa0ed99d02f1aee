"""A cancel that interrupts a step waiting in `ctx.acquire_lock` (or holding it) leaves the
lock free for the next procedure."""

import asyncio
import uuid

from procstore import Client, Context, Procedure, ProcedureManager, ProcedureWithId, Status
from procstore.lock_key import StringKey
from procstore.testing import MemoryStore

HELD = {}


class Locker(Procedure):
    type_name = "b::Locker"

    def __init__(self, data: str = "") -> None:
        self.hold = float(data or 0)

    async def execute(self, ctx: Context) -> Status:
        async with ctx.provider.acquire_lock(StringKey.exclusive("k")):
            HELD[str(ctx.procedure_id)] = True
            await asyncio.sleep(self.hold)
        return Status.done()

    def dump(self) -> str:
        return str(self.hold)

    @classmethod
    def load(cls, data: str) -> "Locker":
        return cls(data)


async def main() -> None:
    store = MemoryStore(f"b10-{uuid.uuid4().hex[:8]}")
    async with ProcedureManager(store, request_poll_interval=0.05) as manager, Client(store) as client:
        manager.register(Locker)
        holder, waiter, late = (ProcedureWithId.new(Locker(s)) for s in ("3600", "0", "0"))
        watchers = [await manager.submit(p) for p in (holder, waiter)]
        await asyncio.sleep(0.3)
        await client.cancel(waiter.id, "stop waiting")  # interrupted inside acquire_lock
        await asyncio.sleep(0.3)
        await client.cancel(holder.id, "stop holding")  # interrupted while holding
        for w in watchers:
            try:
                await asyncio.wait_for(w.wait(), 5)
            except Exception as e:
                print(type(e).__name__)
        done = await manager.submit(late)
        assert await asyncio.wait_for(done.wait(), 5) is None
        print("the lock was free for the next procedure")


asyncio.run(main())
