"""A root cancelled by an operator whose leader was killed between its `.commit` and its end
record: the next manager writes the record from the keys, with outcome `failed` and no
`ended_by`, though the operator's request (who, when, why) is still stored beside it. The
audit promise of issue 36 ("every operator action keeps who, when, why and what in
history"), and the vocabulary (`cancelled`), are lost."""

import asyncio
import random
import uuid

from procstore import Client, Context, Procedure, ProcedureManager, ProcedureWithId, Status
from procstore.testing import Armed, MemoryStore, Process, ProcessStore, kill_manager


class Slow(Procedure):
    type_name = "b::Slow"

    def __init__(self, data: str = "") -> None:
        pass

    async def execute(self, ctx: Context) -> Status:
        await asyncio.sleep(3600)
        return Status.done()

    def dump(self) -> str:
        return ""

    @classmethod
    def load(cls, data: str) -> "Slow":
        return cls(data)


async def main() -> None:
    inner = MemoryStore(f"b11-{uuid.uuid4().hex[:8]}")
    leader = Process("leader", [], random.Random(0))
    leader.armed.append(Armed("crash_before", 1, match="history/"))
    first = ProcedureManager(ProcessStore(inner, leader), request_poll_interval=0.05)
    first.register(Slow)
    await first.start()
    procedure = ProcedureWithId.new(Slow())
    await first.submit(procedure)
    await asyncio.sleep(0.2)
    async with Client(inner, poll_interval=0.05) as client:
        await client.cancel(procedure.id, reason="INC-42: wrong region")
        for _ in range(300):
            if leader.dead:
                break
            await asyncio.sleep(0.01)
        assert leader.dead
        await kill_manager(first)
        async with ProcedureManager(inner) as second:
            second.register(Slow)
            await asyncio.sleep(0.3)
            (record,) = await client.history(procedure_id=procedure.id)
    print("record:", record.outcome, record.ended_by, record.error)
    assert record.outcome == "cancelled" and record.ended_by is not None, "the cancel's audit is lost"


asyncio.run(main())
