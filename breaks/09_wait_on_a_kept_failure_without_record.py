"""A root that failed, kept for an operator (keep_failed), whose leader was killed between
its `.commit` and its end record: does `Client.wait` answer once another manager runs (or
none does), or wait forever for a record nobody writes?"""

import asyncio
import random
import sys
import uuid

from procstore import Client, Context, Procedure, ProcedureFailed, ProcedureManager, ProcedureWithId, Status
from procstore.testing import Armed, MemoryStore, Process, ProcessStore, kill_manager


class Fails(Procedure):
    type_name = "b::Fails"

    def __init__(self, data: str = "") -> None:
        pass

    async def execute(self, ctx: Context) -> Status:
        raise ValueError("broken")

    def dump(self) -> str:
        return ""

    @classmethod
    def load(cls, data: str) -> "Fails":
        return cls(data)


async def main(second_manager: bool) -> None:
    inner = MemoryStore(f"b09-{uuid.uuid4().hex[:8]}")
    leader = Process("leader", [], random.Random(0))
    leader.armed.append(Armed("crash_before", 1, match="history/"))
    first = ProcedureManager(ProcessStore(inner, leader), keep_failed=True)
    first.register(Fails)
    await first.start()
    procedure = ProcedureWithId.new(Fails())
    await first.submit(procedure)
    for _ in range(300):
        if leader.dead:
            break
        await asyncio.sleep(0.01)
    assert leader.dead
    await kill_manager(first)
    second = ProcedureManager(inner, keep_failed=True)
    second.register(Fails)
    if second_manager:
        await second.start()
    try:
        async with Client(inner, poll_interval=0.05) as client:
            print("status:", (await client.get(procedure.id)).status)
            try:
                await client.wait(procedure.id, timeout=5)
            except ProcedureFailed as e:
                print("wait answered:", e)
            except TimeoutError:
                raise AssertionError("Client.wait of an ended (failed) root waited out its timeout") from None
    finally:
        if second_manager:
            await second.stop()


asyncio.run(main(sys.argv[1:] == ["manager"]))
