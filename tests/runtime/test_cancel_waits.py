"""A cancel reaches a procedure however long it waits: in a retry's backoff, for a lock, or
for children that themselves wait (issue 18: "within a bounded time while it waits")."""

from __future__ import annotations

import asyncio
import json
import os
import time
from pathlib import Path
from typing import Any

import pytest

from procstore import (
    Context,
    LockKey,
    Procedure,
    ProcedureFailed,
    ProcedureId,
    ProcedureManager,
    ProcedureWithId,
    RetryLater,
    Status,
    StringKey,
)
from procstore._runtime.locks import KeyRwLock
from tests.support import manager_for

GATES: dict[str, asyncio.Event] = {}


class Waits(Procedure):
    """Retries for ever (`retry`), holds its lock until a gate opens (`gate`), suspends on
    one child that retries for ever (`child`), or, once a gate opens in an uninterruptible
    block, on the child `then` (`child after gate`)."""

    type_name = "cancel-waits::Waits"

    def __init__(self, data: dict[str, Any]) -> None:
        self.data = data

    def dump(self) -> str:
        return json.dumps(self.data)

    def lock_key(self) -> LockKey:
        return LockKey([StringKey.exclusive(self.data["lock"])] if "lock" in self.data else [])

    async def execute(self, ctx: Context) -> Status:
        how = self.data["how"]
        if how == "retry":
            raise RetryLater("the datanode is busy")
        if how == "gate":
            await GATES[self.data["gate"]].wait()
            return Status.done()
        if how == "child after gate" and not self.data.get("waited"):
            with ctx.uninterruptible():
                await GATES[self.data["gate"]].wait()
            self.data["waited"] = True
            return Status.suspended([ProcedureWithId.new(Waits(self.data["then"]))])
        if how == "child" and not self.data.get("waited"):
            self.data["waited"] = True
            return Status.suspended([ProcedureWithId.new(Waits({"how": "retry"}))])
        return Status.done()


EFFECTS: set[str] = set()
"""What `UndoesItsStep` steps did to the outside world, and their rollbacks undid."""


class UndoesItsStep(Procedure):
    """One step that applies `effect` under its locks; its rollback undoes it, and notes (in
    `overlapped`) whether the lock's other holder was still running then."""

    type_name = "cancel-waits::UndoesItsStep"
    rollback_supported = True

    def __init__(self, data: dict[str, Any]) -> None:
        self.data = data

    def dump(self) -> str:
        return json.dumps(self.data)

    def lock_key(self) -> LockKey:
        return LockKey([StringKey.exclusive(k) for k in self.data["locks"]])

    async def execute(self, ctx: Context) -> Status:
        EFFECTS.add(self.data["effect"])
        return Status.done()

    async def rollback(self, ctx: Context) -> None:
        if not GATES[self.data["holder_gate"]].is_set():
            EFFECTS.add(f"{self.data['effect']}/rolled back beside the holder")
        EFFECTS.discard(self.data["effect"])


class HoldsWhileItsChildRuns(Procedure):
    """Holds `lock` and, once `gate` opens, suspends on a `Waits` child that needs `child_lock`."""

    type_name = "cancel-waits::HoldsWhileItsChildRuns"

    def __init__(self, data: dict[str, Any]) -> None:
        self.data = data

    def dump(self) -> str:
        return json.dumps(self.data)

    def lock_key(self) -> LockKey:
        return LockKey([StringKey.exclusive(self.data["lock"])])

    async def execute(self, ctx: Context) -> Status:
        if self.data.get("suspended"):
            return Status.done()
        await GATES[self.data["gate"]].wait()
        self.data["suspended"] = True
        child = Waits({"how": "gate", "gate": self.data["child_gate"], "lock": self.data["child_lock"]})
        return Status.suspended([ProcedureWithId.new(child)])


def manager(tmp_path: Path) -> ProcedureManager:
    # Backoffs of a minute, and a look at requests/ only every minute: the cancel must not
    # depend on either.
    return manager_for(
        tmp_path,
        Waits,
        UndoesItsStep,
        HoldsWhileItsChildRuns,
        max_retry_times=50,
        retry_delay=60,
        max_retry_delay=60,
        request_poll_interval=60,
    )


async def cancelled_in_time(m: ProcedureManager, procedure: ProcedureWithId, settle: float = 0.2) -> None:
    watcher = await m.submit(procedure)
    await asyncio.sleep(settle)  # it is waiting now
    assert not watcher.state.is_ended()
    await m.cancel(procedure.id, "not needed any more")
    with pytest.raises(ProcedureFailed, match="not needed any more"):
        await asyncio.wait_for(watcher.wait(), 5)


async def test_a_cancel_ends_a_retry_backoff(tmp_path: Path) -> None:
    async with manager(tmp_path) as m:
        await cancelled_in_time(m, ProcedureWithId.new(Waits({"how": "retry"})))


async def test_a_cancel_ends_a_lock_wait(tmp_path: Path) -> None:
    GATES["lock-wait"] = gate = asyncio.Event()
    async with manager(tmp_path) as m:
        holder = await m.submit(ProcedureWithId.new(Waits({"how": "gate", "gate": "lock-wait", "lock": "t"})))
        await cancelled_in_time(m, ProcedureWithId.new(Waits({"how": "gate", "gate": "lock-wait", "lock": "t"})))
        gate.set()
        await asyncio.wait_for(holder.wait(), 5)  # the holder was not disturbed, and the lock is free
        GATES["after"] = asyncio.Event()
        GATES["after"].set()
        await asyncio.wait_for(
            (await m.submit(ProcedureWithId.new(Waits({"how": "gate", "gate": "after", "lock": "t"})))).wait(), 5
        )


async def test_a_cancel_reaches_a_parent_waiting_for_a_child_in_backoff(tmp_path: Path) -> None:
    async with manager(tmp_path) as m:
        await cancelled_in_time(m, ProcedureWithId.new(Waits({"how": "child"})))
        assert all(info.state.is_ended() for info in m.list_procedures())


@pytest.mark.parametrize(
    "child",
    [{"how": "retry"}, {"how": "gate", "gate": "children-never", "lock": "held"}],
    ids=["in backoff", "waiting for a lock"],
)
async def test_a_cancel_noted_during_the_step_that_suspends_reaches_the_children_it_creates(
    tmp_path: Path, child: dict[str, Any]
) -> None:
    """The cancel comes while the parent's step runs (uninterruptible here): the children the
    step then returns did not exist when it was noted, and must still inherit it, or they
    run on (a backoff, a lock wait) and the parent waits for them."""
    GATES["children-gate"] = gate = asyncio.Event()
    GATES["children-never"] = asyncio.Event()
    async with manager(tmp_path) as m:
        await m.submit(ProcedureWithId.new(Waits({"how": "gate", "gate": "children-never", "lock": "held"})))
        parent = ProcedureWithId.new(Waits({"how": "child after gate", "gate": "children-gate", "then": child}))
        watcher = await m.submit(parent)
        await asyncio.sleep(0.2)  # inside its uninterruptible block
        await m.cancel(parent.id, "not needed any more")
        gate.set()
        with pytest.raises(ProcedureFailed, match="not needed any more"):
            await asyncio.wait_for(watcher.wait(), 5)
        (created,) = [info for info in m.list_procedures() if info.parent_id == parent.id]
        assert created.state.is_failed() and "its ancestor" in (created.state.error or "")
        GATES["children-never"].set()


async def test_acquire_unless_gives_back_a_lock_granted_with_the_event() -> None:
    locks, key = KeyRwLock(), StringKey.exclusive("k")
    await locks.acquire(key)
    event = asyncio.Event()
    waiting = asyncio.ensure_future(locks.acquire_unless(key, event))
    await asyncio.sleep(0)
    locks.release(key)  # granted to the waiter...
    event.set()  # ...in the same tick as the event
    assert await waiting is False
    assert not locks.would_block(key)


async def test_a_folder_that_cannot_be_listed_does_not_stop_the_watch(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The watch checks an old request of a procedure it does not know by listing that
    procedure's folder: one that cannot be read made every look fail before it reached the
    requests after it (a cancel written by `procstore cancel`, here), for good."""
    from procstore.store.procedure_store import ProcedureStore
    from procstore.store.requests import OperatorRequest

    stranger = "00000000-2222-4000-8000-000000000001"  # listed before any other request
    (tmp_path / "procedure" / stranger).mkdir(parents=True)
    real = os.scandir

    def scandir(path: str) -> Any:
        if path.endswith(stranger):
            raise PermissionError(13, "Permission denied", path)
        return real(path)

    m = ProcedureManager(tmp_path, max_retry_times=50, retry_delay=60, max_retry_delay=60, request_poll_interval=0.05)
    m.register(Waits)
    async with m:
        monkeypatch.setattr(os, "scandir", scandir)
        store = ProcedureStore(m.store.store)
        old = OperatorRequest(kind="cancel", reason="old", requested_at=time.time() - 3600)
        await store.requests.put(ProcedureId.parse(stranger), old)
        waiting = ProcedureWithId.new(Waits({"how": "retry"}))
        watcher = await m.submit(waiting)
        await asyncio.sleep(0.2)
        await store.requests.put(waiting.id, OperatorRequest.new("cancel", "from the command line"))
        with pytest.raises(ProcedureFailed, match="from the command line"):
            await asyncio.wait_for(watcher.wait(), 5)
        assert await store.requests.get(ProcedureId.parse(stranger)) == old  # its folder may hold keys: kept


async def test_a_request_folder_that_cannot_be_read_does_not_stop_the_watch(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`requests/resume/` unreadable: every look failed, and a cancel written by the CLI
    never reached a procedure in its backoff."""
    from procstore.store.procedure_store import ProcedureStore
    from procstore.store.requests import OperatorRequest

    (tmp_path / "requests" / "resume").mkdir(parents=True)
    real, denied = os.scandir, str(tmp_path / "requests" / "resume")

    def scandir(path: str) -> Any:
        if path == denied:
            raise PermissionError(13, "Permission denied", path)
        return real(path)

    m = ProcedureManager(tmp_path, max_retry_times=50, retry_delay=60, max_retry_delay=60, request_poll_interval=0.05)
    m.register(Waits)
    async with m:
        monkeypatch.setattr(os, "scandir", scandir)  # after recovery, which fails, naming it
        waiting = ProcedureWithId.new(Waits({"how": "retry"}))
        watcher = await m.submit(waiting)
        await asyncio.sleep(0.2)
        await ProcedureStore(m.store.store).requests.put(waiting.id, OperatorRequest.new("cancel", "from the CLI"))
        with pytest.raises(ProcedureFailed, match="from the CLI"):
            await asyncio.wait_for(watcher.wait(), 5)


async def test_a_watch_that_keeps_failing_says_so_once_and_says_when_it_works_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """`requests/` unreadable: an error with its traceback at every look (each second, for as
    long as it lasts) drowned everything else in the log."""
    (tmp_path / "requests").mkdir()
    real, denied = os.scandir, {str(tmp_path / "requests")}

    def scandir(path: str) -> Any:
        if path in denied:
            raise PermissionError(13, "Permission denied", path)
        return real(path)

    m = ProcedureManager(tmp_path, request_poll_interval=0.02)
    async with m:
        monkeypatch.setattr(os, "scandir", scandir)
        await asyncio.sleep(0.3)
        denied.clear()
        await asyncio.sleep(0.1)
    failed = [r for r in caplog.records if "looking for operator requests failed" in r.getMessage()]
    assert len(failed) == 1 and failed[0].exc_info is not None, failed
    assert any("works again" in r.getMessage() for r in caplog.records)


async def _inherit(tmp_path: Path, procedure: ProcedureWithId) -> None:
    """Store `procedure` at step 0, as an earlier process left it."""
    from procstore.store.message import ProcedureMessage
    from procstore.store.open import open_state_store

    store = open_state_store(str(tmp_path))
    message = ProcedureMessage(procedure.procedure.type_name, procedure.procedure.dump(), None, 0)
    assert await store.put_if_absent(f"procedure/{procedure.id}/0000000000.step", message.encode())
    await store.close()


async def test_a_loaded_procedure_cancelled_at_its_lock_wait_undoes_the_step_an_earlier_process_ran(
    tmp_path: Path,
) -> None:
    """An earlier process ran the step of `loaded` and died before storing the next state:
    the store shows step 0 only, but the effect is out there. The next manager loads it and
    it waits for its lock behind `holder`. An operator's request then makes it roll back,
    holding its lock (never beside the holder): the effect is undone."""
    gate, effect = os.urandom(8).hex(), os.urandom(8).hex()
    GATES[gate] = asyncio.Event()
    # Recovery takes locks in the ids' order: the holder goes first.
    holder = ProcedureWithId(
        ProcedureId.parse("00000000-0000-4000-8000-000000000001"), Waits({"how": "gate", "gate": gate, "lock": "t"})
    )
    loaded = ProcedureWithId(
        ProcedureId.parse("ffffffff-0000-4000-8000-000000000001"),
        UndoesItsStep({"locks": ["t"], "effect": effect, "holder_gate": gate}),
    )
    for procedure in (holder, loaded):
        await _inherit(tmp_path, procedure)
    EFFECTS.add(effect)  # the earlier process's step
    async with manager(tmp_path) as m:
        await asyncio.sleep(0.2)  # the holder runs; `loaded` waits for the lock
        state = m.procedure_state(loaded.id)
        assert state is not None and not state.is_ended()
        await m.cancel(loaded.id, "not needed any more")
        await asyncio.sleep(0.2)
        assert effect in EFFECTS, "rolled back without its lock"
        GATES[gate].set()
        watcher = m.procedure_watcher(loaded.id)
        assert watcher is not None
        with pytest.raises(ProcedureFailed, match="not needed any more"):
            await asyncio.wait_for(watcher.wait(), 5)
    assert effect not in EFFECTS
    assert f"{effect}/rolled back beside the holder" not in EFFECTS


async def test_a_loaded_procedure_that_would_close_a_lock_cycle_waits_again_instead_of_failing(
    tmp_path: Path,
) -> None:
    """`loaded` (its step may have run in an earlier process) takes `a`, then finds that
    waiting for `b` would close a cycle: `b`'s holder waits for its child, which waits for
    `a`. Failing would leave its step's effect without a rollback, and rolling back needs
    both locks: it gives `a` back and waits for both again, and runs once they are free."""
    holder_gate, parent_gate, child_gate, effect = (os.urandom(8).hex() for _ in range(4))
    for gate in (holder_gate, parent_gate, child_gate):
        GATES[gate] = asyncio.Event()
    GATES[child_gate].set()
    # Recovery takes locks in the ids' order: `holder` takes `a`, `loaded` queues for it.
    holder = ProcedureWithId(
        ProcedureId.parse("00000000-0000-4000-8000-000000000002"),
        Waits({"how": "gate", "gate": holder_gate, "lock": "a"}),
    )
    loaded = ProcedureWithId(
        ProcedureId.parse("ffffffff-0000-4000-8000-000000000002"),
        UndoesItsStep({"locks": ["a", "b"], "effect": effect, "holder_gate": holder_gate}),
    )
    for procedure in (holder, loaded):
        await _inherit(tmp_path, procedure)
    async with manager(tmp_path) as m:
        await asyncio.sleep(0.2)
        parent = await m.submit(
            ProcedureWithId.new(
                HoldsWhileItsChildRuns({"lock": "b", "gate": parent_gate, "child_gate": child_gate, "child_lock": "a"})
            )
        )
        await asyncio.sleep(0.1)
        GATES[parent_gate].set()  # the parent holds `b` and suspends; its child queues for `a`
        await asyncio.sleep(0.1)
        GATES[holder_gate].set()  # `a` goes to `loaded`, which would now wait for `b`
        await asyncio.wait_for(parent.wait(), 5)
        watcher = m.procedure_watcher(loaded.id)
        assert watcher is not None
        await asyncio.wait_for(watcher.wait(), 5)
    assert effect in EFFECTS
