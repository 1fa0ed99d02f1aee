"""A signal payload holding a NaN or an infinity is stored as null, silently: the docs
promise `TypeError` for "a payload JSON cannot hold" (history refuses the same for outputs)."""

import asyncio
import uuid

from procstore import Client, Context, Procedure, ProcedureManager, ProcedureWithId, Status
from procstore.testing import MemoryStore


class AwaitsGo(Procedure):
    type_name = "b::AwaitsGo"

    def __init__(self, data: str = "") -> None:
        self.waited = data == "1"

    async def execute(self, ctx: Context) -> Status:
        if self.waited:
            return Status.done(repr(ctx.signals.get("go")))
        self.waited = True
        return Status.wait_for_signal("go")

    def dump(self) -> str:
        return "1" if self.waited else ""

    @classmethod
    def load(cls, data: str) -> "AwaitsGo":
        return cls(data)


async def main() -> None:
    store = MemoryStore(f"b04-{uuid.uuid4().hex[:8]}")
    async with ProcedureManager(store, request_poll_interval=0.05) as manager, Client(store) as client:
        manager.register(AwaitsGo)
        procedure = ProcedureWithId.new(AwaitsGo())
        watcher = await manager.submit(procedure)
        try:
            await client.signal(procedure.id, "go", {"ratio": float("nan")})
        except TypeError as e:
            print("refused:", e)
            return
        got = await asyncio.wait_for(watcher.wait(), 10)
        raise AssertionError(f"sent {{'ratio': nan}}, the procedure received {got}")


asyncio.run(main())
