"""A resume's or rewind's copy of a step that ended in a durable wait keeps that wait: the
restarted run waits again for the signal, or until the stored time, as a run resumed after a
crash does. The copy dropped it: the restarted run was called at once with `ctx.signals`
empty, as if its wait had timed out (a rewind to "wait for approval" skipped the approval)."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Callable
from typing import Any, ClassVar

import pytest

from procstore import (
    Client,
    Context,
    Procedure,
    ProcedureFailed,
    ProcedureId,
    ProcedureStatus,
    ProcedureWithId,
    RetryLater,
    Status,
)
from procstore.store.signals import SIGNALS_PATH
from procstore.testing import Fault, FaultyStore, MemoryStore
from tests.runtime.helpers import HeldOnce
from tests.support import manager_for


class Approval(Procedure):
    """Sleeps until `SLEEP_UNTIL` if asked, waits for the signal `approved`, then ends with
    what the step after the wait saw; that step fails while `failing` holds its id, and
    retries (recording what it saw in `seen`) while `retrying` does."""

    type_name = "tests::restart_wait::Approval"
    failing: ClassVar[set[str]] = set()
    retrying: ClassVar[set[str]] = set()
    seen: ClassVar[dict[str, list[dict[str, object]]]] = {}
    SLEEP_UNTIL = time.time() + 3600

    def __init__(self, data: str = "") -> None:
        self.stage = data or "start"

    async def execute(self, ctx: Context) -> Status:
        if self.stage == "sleep":
            self.stage = "start"
            return Status.sleep_until(self.SLEEP_UNTIL)
        if self.stage == "start":
            self.stage = "waited"
            return Status.wait_for_signal("approved")
        if str(ctx.procedure_id) in self.failing:
            self.failing.discard(str(ctx.procedure_id))
            raise ValueError("the step after the wait fails")
        if str(ctx.procedure_id) in self.retrying:
            self.seen.setdefault(str(ctx.procedure_id), []).append(dict(ctx.signals))
            raise RetryLater("not yet")
        return Status.done(dict(ctx.signals))

    def dump(self) -> str:
        return self.stage

    @classmethod
    def load(cls, data: str) -> Approval:
        return cls(data)


async def _status_when(client: Client, pid: ProcedureId, ok: Callable[[ProcedureStatus], bool]) -> ProcedureStatus:
    for _ in range(1000):
        status = await client.get(pid)
        if ok(status):
            return status
        await asyncio.sleep(0.01)
    raise AssertionError(f"procedure {pid}: {status}")


def _waits(run: int) -> Callable[[ProcedureStatus], bool]:
    return lambda status: status.run == run and (status.waiting is not None or status.is_ended)


def _ended(status: ProcedureStatus) -> bool:
    return status.is_ended


async def test_a_rewind_to_a_signal_wait_waits_again_and_a_resume_after_the_failed_step_too() -> None:
    store = MemoryStore(f"restart-wait-{uuid.uuid4().hex[:8]}")
    async with (
        manager_for(store, Approval, keep_failed=True, request_poll_interval=0.05) as manager,
        Client(store, poll_interval=0.05) as client,
    ):
        rewound, resumed = ProcedureWithId.new(Approval()), ProcedureWithId.new(Approval())
        Approval.failing.add(str(resumed.id))
        for procedure in (rewound, resumed):
            await manager.submit(procedure)
            await _status_when(client, procedure.id, _waits(1))
        await client.fail(rewound.id, "ask again")
        await client.signal(resumed.id, "approved", "first")  # read by the step that fails
        for procedure in (rewound, resumed):
            assert (await _status_when(client, procedure.id, _ended)).status == "failed"
        await client.rewind(rewound.id, 1, "ask for approval again")  # step 1: the wait
        await client.resume(resumed.id, "run the failed step again")
        for procedure in (rewound, resumed):
            status = await _status_when(client, procedure.id, _waits(2))
            assert (status.status, status.waiting) == ("unfinished", "waiting for signal 'approved'"), status
            await client.signal(procedure.id, "approved", "second")
            assert await asyncio.wait_for(client.wait(procedure.id), 10) == {"approved": "second"}


async def test_a_rewind_to_a_sleep_keeps_its_stored_wake_up_time() -> None:
    store = MemoryStore(f"restart-sleep-{uuid.uuid4().hex[:8]}")
    async with (
        manager_for(store, Approval, keep_failed=True, request_poll_interval=0.05) as manager,
        Client(store, poll_interval=0.05) as client,
    ):
        procedure = ProcedureWithId.new(Approval("sleep"))
        await manager.submit(procedure)
        slept = await _status_when(client, procedure.id, _waits(1))
        await client.fail(procedure.id, "stop sleeping")
        await _status_when(client, procedure.id, _ended)
        await client.rewind(procedure.id, 1, "sleep again")
        status = await _status_when(client, procedure.id, _waits(2))
        assert status.waiting == slept.waiting and (slept.waiting or "").startswith("sleeping until"), status


async def test_a_signal_read_for_a_step_that_a_cancel_ends_before_it_runs_stays_for_a_resume() -> None:
    """The waiter reads its signal, and meets a cancel stored during that read before its
    step runs: no step saw the signal, so the failure's `.commit` leaves it in the store, and
    the run an operator's resume starts gets it at once (it was deleted as consumed, and the
    resumed run waited for a signal already sent)."""
    procedure = ProcedureWithId.new(Approval())
    store = HeldOnce(MemoryStore(f"restart-unseen-{uuid.uuid4().hex[:8]}"), "walk", f"requests/signals/{procedure.id}")
    async with (
        manager_for(store, Approval, keep_failed=True, request_poll_interval=0.02) as manager,
        Client(store.inner, poll_interval=0.02) as client,
    ):
        watcher = await manager.submit(procedure)
        await _status_when(client, procedure.id, _waits(1))
        await client.signal(procedure.id, "approved", "sent once")
        await asyncio.wait_for(store.reached.wait(), 10)
        await client.cancel(procedure.id, "not now")
        store.release.set()
        with pytest.raises(ProcedureFailed, match="not now"):
            await asyncio.wait_for(watcher.wait(), 10)
        resumed = await manager.resume(procedure.id, reason="now")
        assert await asyncio.wait_for(resumed.wait(), 10) == {"approved": "sent once"}


async def test_a_signal_a_cancelled_step_saw_stays_consumed_when_the_first_deletion_at_its_end_fails() -> None:
    """The step after the wait sees the signal and backs off; a cancel ends it, and the
    first deletion of that signal after the `.commit` fails: no stored message names it, so
    that deletion is retried, and the run a resume starts gets the next signal (the cancel
    ended that deletion's retries, and the resumed run got the seen signal again)."""
    once = Fault("transient", kinds=frozenset({"delete", "batch_delete"}), key=f"{SIGNALS_PATH}*", times=1)
    store = FaultyStore(MemoryStore(f"restart-seen-{uuid.uuid4().hex[:8]}"), faults=[once])
    procedure = ProcedureWithId.new(Approval())
    pid = str(procedure.id)
    options: dict[str, Any] = {"retry_delay": 0.2, "max_retry_delay": 0.2, "max_retry_times": 1000}
    async with (
        manager_for(store, Approval, keep_failed=True, request_poll_interval=0.02, **options) as manager,
        Client(store.inner, poll_interval=0.02) as client,
    ):
        Approval.retrying.add(pid)
        watcher = await manager.submit(procedure)
        await _status_when(client, procedure.id, _waits(1))
        await client.signal(procedure.id, "approved", "seen by the cancelled step")
        while not Approval.seen.get(pid):
            await asyncio.sleep(0.01)
        await manager.cancel(procedure.id, "not now")
        with pytest.raises(ProcedureFailed, match="not now"):
            await asyncio.wait_for(watcher.wait(), 10)
        Approval.retrying.discard(pid)
        assert once.fired == 1
        resumed = await manager.resume(procedure.id, reason="now")
        await client.signal(procedure.id, "approved", "sent for the resumed run")
        assert await asyncio.wait_for(resumed.wait(), 10) == {"approved": "sent for the resumed run"}
