"""A resume or rewind copies a stored step without its durable wait (`wake_at`, `signal`):
the restarted run calls `execute` at once with `ctx.signals` empty, as if the wait had timed
out. A rewind to a "wait for approval" step skips the approval; a resume after the step
that read the approval failed (the run ended with it) goes on as if none came."""

import asyncio
import sys
import uuid

from procstore import Client, Context, Procedure, ProcedureManager, ProcedureWithId, Status
from procstore.testing import MemoryStore

FAIL_FIRST = {"armed": True}


class Approval(Procedure):
    """Waits for the signal `approved`; the step after it ends with its payload (it fails
    once, the first time, when `FAIL_FIRST` is armed)."""

    type_name = "b::Approval"

    def __init__(self, data: str = "") -> None:
        self.waited = data == "1"

    async def execute(self, ctx: Context) -> Status:
        if not self.waited:
            self.waited = True
            return Status.wait_for_signal("approved")
        if FAIL_FIRST["armed"]:
            FAIL_FIRST["armed"] = False
            raise ValueError("the step after the wait fails once")
        return Status.done({"signals": dict(ctx.signals)})

    def dump(self) -> str:
        return "1" if self.waited else ""

    @classmethod
    def load(cls, data: str) -> "Approval":
        return cls(data)


async def main(how: str) -> None:
    store = MemoryStore(f"b08-{uuid.uuid4().hex[:8]}")
    async with (
        ProcedureManager(store, request_poll_interval=0.05, keep_failed=True) as manager,
        Client(store, poll_interval=0.05) as client,
    ):
        manager.register(Approval)
        procedure = ProcedureWithId.new(Approval())
        watcher = await manager.submit(procedure)
        await asyncio.sleep(0.2)
        if how == "resume":
            await client.signal(procedure.id, "approved", "yes")  # read by the step that fails
        else:
            FAIL_FIRST["armed"] = False
            await client.fail(procedure.id, reason="restart the approval")
        try:
            await asyncio.wait_for(watcher.wait(), 5)
        except Exception as e:
            print("run 1 ended:", type(e).__name__)
        if how == "resume":
            await client.resume(procedure.id, reason="try the step again")
        else:
            await client.rewind(procedure.id, 1, reason="ask for approval again")  # step 1: the wait
        await asyncio.sleep(1.0)
        status = await client.get(procedure.id)
        print("after the restart:", status.status, status.waiting)
        assert status.status == "unfinished" and status.waiting, f"{how}: the restarted run did not wait: {status}"
        await client.signal(procedure.id, "approved", "again")
        got = await asyncio.wait_for(client.wait(procedure.id), 5)
        assert got == {"signals": {"approved": "again"}}, got


asyncio.run(main(sys.argv[1]))
