"""A leader killed between a root's `.commit` and its end record: the next manager's
recovery (or `procstore gc`) writes the record from the keys, without the output, and
`Client.result`/`wait` then answer None, as if the procedure had returned None. The docs
promise the stored output, or `ResultNotKept` for one history does not hold."""

import asyncio
import random
import uuid

from procstore import Client, Context, Procedure, ProcedureManager, ProcedureWithId, ResultNotKept, Status
from procstore.testing import Armed, MemoryStore, Process, ProcessStore


class Answers(Procedure):
    type_name = "b::Answers"

    def __init__(self, data: str = "") -> None:
        pass

    async def execute(self, ctx: Context) -> Status:
        return Status.done({"answer": 42})

    def dump(self) -> str:
        return ""

    @classmethod
    def load(cls, data: str) -> "Answers":
        return cls(data)


async def main() -> None:
    inner = MemoryStore(f"b06-{uuid.uuid4().hex[:8]}")
    leader = Process("leader", [], random.Random(0))
    leader.armed.append(Armed("crash_before", 1, match="history/"))  # killed before its end record
    first = ProcedureManager(ProcessStore(inner, leader))
    first.register(Answers)
    await first.start()
    procedure = ProcedureWithId.new(Answers())
    await first.submit(procedure)
    for _ in range(200):
        if leader.dead:
            break
        await asyncio.sleep(0.01)
    assert leader.dead, "the leader did not reach its end record"
    async with ProcedureManager(inner) as second:  # its recovery records the end from the keys
        second.register(Answers)
        async with Client(inner) as client:
            try:
                got = await asyncio.wait_for(client.wait(procedure.id), 10)
            except ResultNotKept as e:
                print("ResultNotKept:", e)
                return
    raise AssertionError(f"the procedure returned {{'answer': 42}}; Client.wait answered {got!r}")


asyncio.run(main())
