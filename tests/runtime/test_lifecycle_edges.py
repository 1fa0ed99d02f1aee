"""The lifecycle's edges, found by a second hostile review (issue 15), through the public API:
a cancelled stop(), stop() from inside a procedure, submits racing start() and stop(), user
code raising BaseExceptions, lock keys that fail only the second time, lease epochs and
options at their bounds, procedures waiting for themselves, and a standby's cancel."""

from __future__ import annotations

import asyncio
import json
import threading
import time
import uuid
from collections import Counter
from pathlib import Path
from typing import Any, ClassVar

import pytest

from procstore import (
    Context,
    Lease,
    LockKey,
    ManagerStopped,
    Procedure,
    ProcedureFailed,
    ProcedureId,
    ProcedureManager,
    ProcedureWithId,
    Status,
    StoreError,
    StringKey,
)
from procstore.store.local import LocalDirStore
from tests.support import manager_for

RUNS: Counter[str] = Counter()
"""`name/step` -> how many times that step's execute() ran (across managers)."""
RAN_IN_ORDER: list[str] = []
"""The names of the procedures whose steps ran, in the order they ran."""


class Counted(Procedure):
    """`n` steps of `sleep` seconds each, every run of a step counted."""

    type_name = "edges::Counted"

    def __init__(self, data: dict[str, Any]) -> None:
        self.data = data

    def dump(self) -> str:
        return json.dumps(self.data, sort_keys=True)

    async def execute(self, ctx: Context) -> Status:
        await asyncio.sleep(self.data.get("sleep", 0))
        at = self.data.get("at", 0)
        RUNS[f"{self.data['name']}/{at}"] += 1
        RAN_IN_ORDER.append(self.data["name"])
        self.data["at"] = at + 1
        return Status.done() if self.data["at"] >= self.data["n"] else Status.executing()


def counted(name: str, n: int, sleep: float = 0.0) -> ProcedureWithId:
    return ProcedureWithId.new(Counted({"name": name, "n": n, "sleep": sleep}))


class Recording(LocalDirStore):
    """The real local store, recording the order writes landed in; `slow` writes and walks wait."""

    def __init__(self, root: Path, slow_write: str = "", slow_walk: float = 0.0) -> None:
        super().__init__(str(root))
        self.slow_write, self.slow_walk = slow_write, slow_walk
        self.landed: list[str] = []
        self._lock = threading.Lock()

    def _write(self, key: str, value: bytes, create_only: bool) -> bool:
        if self.slow_write and key.endswith(self.slow_write):
            time.sleep(0.3)
        ok = super()._write(key, value, create_only)
        with self._lock:
            self.landed.append(key)
        return ok

    def _walk(self, prefix: str) -> list[str]:
        time.sleep(self.slow_walk)
        return super()._walk(prefix)

    def mark(self) -> int:
        """Where the record stands now: `landed_after` gives the writes recorded since."""
        with self._lock:
            return len(self.landed)

    def landed_after(self, mark: int) -> list[str]:
        with self._lock:
            return self.landed[mark:]


@pytest.mark.parametrize("lease", [None, 2.0])
async def test_a_cancelled_stop_still_stops_everything(tmp_path: Path, lease: float | None) -> None:
    store = Recording(tmp_path)
    m = manager_for(store, Counted, lease=lease)
    await m.start()
    await m.wait_until_leading()
    await m.submit(counted("cancelled-stop", 10_000, sleep=0.005))
    await asyncio.sleep(0.1)
    stopping = asyncio.ensure_future(m.stop())
    await asyncio.sleep(0)
    stopping.cancel()  # a caller's timeout
    with pytest.raises(asyncio.CancelledError):
        await stopping
    await asyncio.wait_for(m.stop(), 10)  # the caller tries again: returns once all is over
    stopped, ran = store.mark(), len(RAN_IN_ORDER)
    await asyncio.sleep(0.3)
    assert store.landed_after(stopped) == []
    assert RAN_IN_ORDER[ran:] == []
    if lease is not None:
        assert json.loads((tmp_path / "lease" / "procedures.json").read_bytes())["released"] is True


class StopsItsManager(Procedure):
    type_name = "edges::StopsItsManager"
    managers: ClassVar[list[ProcedureManager]] = []

    def __init__(self, data: dict[str, Any]) -> None:
        self.data = data

    def dump(self) -> str:
        return "{}"

    async def execute(self, ctx: Context) -> Status:
        await self.managers[0].stop()
        return Status.done()


async def test_stop_called_from_a_procedure_stops_the_manager(tmp_path: Path) -> None:
    m = manager_for(tmp_path, Counted, StopsItsManager, lease=Lease(ttl=2.0))
    StopsItsManager.managers[:] = [m]
    await m.start()
    await m.wait_until_leading()
    await m.submit(counted("beside", 10_000, sleep=0.005))
    await m.submit(ProcedureWithId.new(StopsItsManager({})))
    await asyncio.wait_for(m.stop(), 10)  # not a deadlock with the stop() inside the procedure
    assert not m.is_running
    assert json.loads((tmp_path / "lease" / "procedures.json").read_bytes())["released"] is True


async def test_a_submit_during_start_waits_for_recovery(tmp_path: Path) -> None:
    m = manager_for(Recording(tmp_path, slow_walk=0.3), Counted)
    starting = asyncio.ensure_future(m.start())
    while not m.is_running:
        await asyncio.sleep(0.005)
    watcher = await asyncio.wait_for(m.submit(counted("during-start", 2, sleep=0.5)), 10)
    await asyncio.wait_for(starting, 10)  # not "registered twice"
    await asyncio.wait_for(watcher.wait(), 10)
    await m.stop()
    assert RUNS["during-start/0"] == RUNS["during-start/1"] == 1


async def test_a_submit_whose_caller_gives_up_still_runs(tmp_path: Path) -> None:
    store = Recording(tmp_path, slow_write="0000000000.step")
    m = manager_for(store, Counted)
    async with m:
        procedure = counted("given-up", 2)
        with pytest.raises(asyncio.TimeoutError):
            await asyncio.wait_for(m.submit(procedure), 0.05)
        watcher = m.procedure_watcher(procedure.id)
        while watcher is None:
            await asyncio.sleep(0.01)
            watcher = m.procedure_watcher(procedure.id)
        await asyncio.wait_for(watcher.wait(), 10)
    assert RUNS["given-up/0"] == RUNS["given-up/1"] == 1


async def test_wait_until_leading_raises_manager_stopped_when_stopped_during_recovery(tmp_path: Path) -> None:
    a = manager_for(tmp_path, Counted, lease=Lease(ttl=1.0, holder="A"))
    b = manager_for(Recording(tmp_path, slow_walk=1.0), Counted, lease=Lease(ttl=1.0, holder="B"))
    await a.start()
    await b.start()
    waiter = asyncio.ensure_future(b.wait_until_leading())
    await a.stop()  # released: B takes over and recovers, slowly
    while b.leader != "B":
        await asyncio.sleep(0.01)
    await asyncio.wait_for(b.stop(), 10)
    with pytest.raises(ManagerStopped):
        await asyncio.wait_for(waiter, 5)


class Raises(Procedure):
    """Raises what `data["raise"]` names, from execute() or from dump()."""

    type_name = "edges::Raises"

    def __init__(self, data: dict[str, Any]) -> None:
        self.data = data

    def dump(self) -> str:
        if self.data.get("in") == "dump" and self.data.get("armed"):
            raise _RAISED[self.data["raise"]]()
        return json.dumps(self.data)

    async def execute(self, ctx: Context) -> Status:
        self.data["armed"] = True
        if self.data.get("in") == "execute":
            raise _RAISED[self.data["raise"]]()
        return Status.executing()


class UsersOwn(BaseException):
    pass


_RAISED: dict[str, type[BaseException]] = {
    "own": UsersOwn,
    "generator-exit": GeneratorExit,
    "cancelled": asyncio.CancelledError,
}


@pytest.mark.parametrize("where", ["execute", "dump"])
@pytest.mark.parametrize("raised", sorted(_RAISED))
async def test_a_base_exception_from_user_code_fails_the_procedure(tmp_path: Path, where: str, raised: str) -> None:
    m = manager_for(tmp_path, Counted, Raises, max_running_procedures=1)
    async with m:
        watcher = await m.submit(ProcedureWithId.new(Raises({"in": where, "raise": raised})))
        with pytest.raises(ProcedureFailed):
            await asyncio.wait_for(watcher.wait(), 10)
        # The slot it held is free again.
        await asyncio.wait_for((await m.submit(counted(f"after-{where}-{raised}", 1))).wait(), 10)
    # Its failure is stored: a restart does not run it again.
    again = manager_for(tmp_path, Counted, Raises)
    async with again:
        assert again.procedure_state(watcher.procedure_id) is None
        assert again.recovery_problems == []


class FlakyLocks(Counted):
    """Its lock_key() works once per object, then raises (it reads a table that went)."""

    type_name = "edges::FlakyLocks"

    def __init__(self, data: dict[str, Any]) -> None:
        super().__init__(data)
        self.calls = 0

    def lock_key(self) -> LockKey:
        self.calls += 1
        if self.calls > 1:
            raise KeyError("table dropped meanwhile")
        return LockKey([StringKey.exclusive("table")])


async def test_a_lock_key_computed_once_at_recovery(tmp_path: Path) -> None:
    first = manager_for(tmp_path, Counted, FlakyLocks)
    async with first:
        await first.submit(ProcedureWithId.new(FlakyLocks({"name": "flaky", "n": 2, "sleep": 30})))
        await first.submit(counted("other", 2, sleep=30))
    second = manager_for(tmp_path, Counted, FlakyLocks)
    await asyncio.wait_for(second.start(), 10)  # not a KeyError
    assert len([i for i in second.list_procedures() if not i.state.is_ended()]) == 2
    await second.stop()


async def test_a_lease_epoch_at_its_maximum_is_a_clear_error(tmp_path: Path) -> None:
    (tmp_path / "lease").mkdir()
    record = {"holder": "x", "epoch": 2**63 - 1, "renewal": 0, "ttl": 1.0, "released": True}
    (tmp_path / "lease" / "procedures.json").write_text(json.dumps(record))
    m = manager_for(tmp_path, Counted, lease=Lease(ttl=1.0))
    with pytest.raises(StoreError, match="epoch has reached its maximum"):
        await asyncio.wait_for(m.start(), 10)


@pytest.mark.parametrize(
    "options",
    [
        {"ttl": 4e7},
        {"ttl": float("inf"), "stop_margin": 1.0},
        {"ttl": float("nan")},
        {"ttl": 1.0, "adopt_interval": float("nan")},
        {"ttl": 1.0, "late_write_grace": float("inf")},
    ],
)
def test_lease_options_a_record_could_not_hold_are_refused(options: dict[str, float]) -> None:
    with pytest.raises(ValueError, match="lease"):
        Lease(**options)  # type: ignore[arg-type]


class SuspendsOn(Procedure):
    """Suspends on its own id, or (as a child) on its parent's."""

    type_name = "edges::SuspendsOn"

    def __init__(self, data: dict[str, Any]) -> None:
        self.data = data

    def dump(self) -> str:
        return json.dumps(self.data)

    async def execute(self, ctx: Context) -> Status:
        if self.data.get("waited"):
            return Status.done()
        self.data["waited"] = True
        if self.data["on"] == "self":
            return Status.suspended([ProcedureWithId(ctx.procedure_id, SuspendsOn(dict(self.data)))])
        if self.data["on"] == "a child naming me":
            child = SuspendsOn({"on": "parent", "parent": str(ctx.procedure_id)})
            return Status.suspended([ProcedureWithId.new(child)])
        parent = ProcedureId.parse(self.data["parent"])
        return Status.suspended([ProcedureWithId(parent, SuspendsOn({"on": "x"}))])


async def test_a_procedure_waiting_for_itself_fails_instead_of_hanging(tmp_path: Path) -> None:
    m = manager_for(tmp_path, Counted, SuspendsOn)
    async with m:
        watcher = await m.submit(ProcedureWithId.new(SuspendsOn({"on": "self"})))
        with pytest.raises(ProcedureFailed, match="would never end"):
            await asyncio.wait_for(watcher.wait(), 10)


async def test_a_child_waiting_for_its_parent_fails_and_the_parent_goes_on(tmp_path: Path) -> None:
    m = manager_for(tmp_path, Counted, SuspendsOn)
    async with m:
        watcher = await m.submit(ProcedureWithId.new(SuspendsOn({"on": "a child naming me"})))
        await asyncio.wait_for(watcher.wait(), 10)  # the parent sees its child failed, and ends
        (child,) = [i for i in m.list_procedures() if i.parent_id == watcher.procedure_id]
        assert child.state.is_failed()
        assert "would never end" in (child.state.error or "")


async def test_a_standby_cancel_never_lands_after_stop(tmp_path: Path) -> None:
    store = Recording(tmp_path, slow_write=".json")
    leader = manager_for(tmp_path, Counted, lease=Lease(ttl=5.0, holder="A"))
    standby = manager_for(store, Counted, lease=Lease(ttl=5.0, holder="B"))
    async with leader:
        await leader.wait_until_leading()
        watcher = await leader.submit(counted("standby-cancel", 10_000, sleep=0.01))
        await standby.start()
        cancelling = asyncio.ensure_future(standby.cancel(watcher.procedure_id, "no longer needed"))
        await asyncio.sleep(0.05)
        await standby.stop()
        stopped = store.mark()
        with pytest.raises(ManagerStopped):
            await cancelling
        await asyncio.sleep(0.5)
        assert [key for key in store.landed_after(stopped) if "requests/" in key] == []


ORDER: list[str] = []


class Ordered(Procedure):
    """Logs each step it runs; holds the exclusive lock `t`; step 1 (or `wait_at`) waits on a gate."""

    type_name = "edges::Ordered"
    gate: ClassVar[asyncio.Event | None] = None

    def __init__(self, data: dict[str, Any]) -> None:
        self.data = data

    def dump(self) -> str:
        return json.dumps(self.data)

    def lock_key(self) -> LockKey:
        return LockKey([StringKey.exclusive("t")])

    async def execute(self, ctx: Context) -> Status:
        at = self.data.get("at", 0)
        ORDER.append(f"{self.data['name']}/{at}")
        if at == self.data.get("wait_at", 1) and self.gate is not None:
            await self.gate.wait()  # half-way through a step when its process dies
        self.data["at"] = at + 1
        return Status.done() if at == 2 else Status.executing()


async def test_a_procedure_that_held_its_locks_takes_them_first_after_a_restart(tmp_path: Path) -> None:
    """Recovery starts the queued procedure's runner first (its id sorts first), yet the one
    that held the lock when the process died runs on before it: else the queued one would run
    over a half-done step."""
    from procstore.testing import kill_manager

    ORDER.clear()
    Ordered.gate = asyncio.Event()
    holder = ProcedureWithId(ProcedureId.parse("ffffffff-ffff-4fff-bfff-ffffffffffff"), Ordered({"name": "holder"}))
    queued = ProcedureWithId(ProcedureId.parse("00000000-0000-4000-8000-000000000000"), Ordered({"name": "queued"}))
    first = manager_for(tmp_path, Counted, Ordered)
    await first.start()
    await first.submit(holder)
    while ORDER != ["holder/0", "holder/1"]:
        await asyncio.sleep(0.005)
    await first.submit(queued)  # waits for `t`
    await kill_manager(first)
    await first.stop()
    Ordered.gate = None
    ORDER.clear()
    second = manager_for(tmp_path, Counted, Ordered)
    async with second:
        for procedure in (holder, queued):
            watcher = second.procedure_watcher(procedure.id)
            assert watcher is not None
            await asyncio.wait_for(watcher.wait(), 10)
    assert ORDER == ["holder/1", "holder/2", "queued/0", "queued/1", "queued/2"]


class Filler(Procedure):
    """No locks; waits on a gate at its first step."""

    type_name = "edges::Filler"
    gate: ClassVar[asyncio.Event] = asyncio.Event()

    def __init__(self, data: dict[str, Any]) -> None:
        self.data = data

    def dump(self) -> str:
        return json.dumps(self.data)

    async def execute(self, ctx: Context) -> Status:
        await asyncio.wait_for(self.gate.wait(), 30)
        return Status.done()


async def test_a_procedure_killed_in_its_first_step_takes_its_lock_before_a_later_submit() -> None:
    """A root stored at step 0 only may have died half-way through its first step, holding
    its lock: resumed, it takes the lock before `start()` returns, even when its runner
    starts later (behind hundreds of resumed procedures that sort first), so a procedure
    submitted right after cannot run over that half-done step."""
    from procstore.testing import kill_manager

    url = f"memory://edges-{uuid.uuid4().hex}/"  # instant writes: the submit races the resumed runners
    ORDER.clear()
    Ordered.gate = asyncio.Event()
    Filler.gate = asyncio.Event()
    holder = ProcedureWithId(
        ProcedureId.parse("ffffffff-ffff-4fff-bfff-ffffffffffff"), Ordered({"name": "holder", "wait_at": 0})
    )
    first = manager_for(url, Counted, Ordered, Filler, max_running_procedures=1000)
    await first.start()
    for i in range(300):
        await first.submit(ProcedureWithId(ProcedureId.parse(f"00000000-0000-4000-8000-{i:012d}"), Filler({})))
    await first.submit(holder)
    while ORDER != ["holder/0"]:
        await asyncio.sleep(0.005)
    await kill_manager(first)
    await first.stop()
    Ordered.gate = None
    ORDER.clear()
    second = manager_for(url, Counted, Ordered, Filler, max_running_procedures=1000)
    async with second:
        later = await second.submit(ProcedureWithId.new(Ordered({"name": "later"})))
        await asyncio.wait_for(later.wait(), 10)
        Filler.gate.set()
    assert ORDER == ["holder/0", "holder/1", "holder/2", "later/0", "later/1", "later/2"]


async def test_stop_start_stop_leaves_the_manager_stopped(tmp_path: Path) -> None:
    store = Recording(tmp_path, slow_write=".step")
    m = manager_for(store, Counted)
    await m.start()
    await m.submit(counted("stop-start-stop", 5))
    stopping = asyncio.ensure_future(m.stop())
    await asyncio.sleep(0.01)
    starting = asyncio.ensure_future(m.start())
    await asyncio.sleep(0.01)
    await asyncio.wait_for(m.stop(), 10)  # the last call wins, as in a plain sequence
    stopped = store.mark()
    await asyncio.wait_for(asyncio.gather(stopping, starting), 10)
    await asyncio.sleep(0.5)
    assert not m.is_running
    assert store.landed_after(stopped) == []


def test_a_manager_serves_two_asyncio_runs(tmp_path: Path) -> None:
    m = manager_for(tmp_path, Counted)

    async def run(name: str) -> None:
        await asyncio.gather(m.start(), m.start())
        await asyncio.wait_for((await m.submit(counted(name, 2))).wait(), 10)
        await asyncio.gather(m.stop(), m.stop())

    asyncio.run(run("first-run"))
    asyncio.run(run("second-run"))  # not "bound to a different event loop"


class Peer(Procedure):
    """Suspends on `other` in the same tick as every other peer."""

    type_name = "edges::Peer"
    barrier: ClassVar[tuple[int, asyncio.Event] | None] = None
    arrived = 0

    def __init__(self, data: dict[str, Any]) -> None:
        self.data = data

    def dump(self) -> str:
        return json.dumps(self.data)

    async def execute(self, ctx: Context) -> Status:
        if self.data.get("waited") or self.barrier is None:
            return Status.done()
        self.data["waited"] = True
        Peer.arrived += 1
        if Peer.arrived == self.barrier[0]:
            self.barrier[1].set()
        await self.barrier[1].wait()
        other = ProcedureId.parse(self.data["other"])
        return Status.suspended([ProcedureWithId(other, Peer({}))])


@pytest.mark.parametrize("peers", [2, 3])
async def test_procedures_suspending_on_each_other_in_one_tick_do_not_hang(tmp_path: Path, peers: int) -> None:
    Peer.barrier, Peer.arrived = (peers, asyncio.Event()), 0
    ids = [ProcedureId.random() for _ in range(peers)]
    async with manager_for(tmp_path, Counted, Peer) as m:
        watchers = [
            await m.submit(ProcedureWithId(pid, Peer({"other": str(ids[(i + 1) % peers])})))
            for i, pid in enumerate(ids)
        ]
        ends = await asyncio.wait_for(asyncio.gather(*(w.wait() for w in watchers), return_exceptions=True), 10)
    assert any(isinstance(end, ProcedureFailed) for end in ends)


class Guarded(Procedure):
    """Holds the exclusive key `k` for `hold` seconds; its rollback notes who held `k`."""

    type_name = "edges::Guarded"
    rollback_supported = True
    holding: ClassVar[list[str]] = []
    rollbacks: ClassVar[list[list[str]]] = []

    def __init__(self, data: dict[str, Any]) -> None:
        self.data = data

    def dump(self) -> str:
        return json.dumps(self.data)

    def lock_key(self) -> LockKey:
        return LockKey([StringKey.exclusive("k")])

    async def execute(self, ctx: Context) -> Status:
        self.holding.append(self.data["name"])
        await asyncio.sleep(self.data["hold"])
        self.holding.remove(self.data["name"])
        return Status.done()

    async def rollback(self, ctx: Context) -> None:
        self.rollbacks.append(list(self.holding))


async def test_a_procedure_cancelled_while_waiting_for_its_locks_does_not_roll_back(tmp_path: Path) -> None:
    Guarded.rollbacks.clear()
    async with manager_for(tmp_path, Counted, Guarded) as m:
        holder = await m.submit(ProcedureWithId.new(Guarded({"name": "holder", "hold": 0.5})))
        await asyncio.sleep(0.05)
        waiter = await m.submit(ProcedureWithId.new(Guarded({"name": "waiter", "hold": 0})))
        await asyncio.sleep(0.05)
        await m.cancel(waiter.procedure_id, "not needed")
        with pytest.raises(ProcedureFailed, match="not needed"):
            await asyncio.wait_for(waiter.wait(), 5)
        await asyncio.wait_for(holder.wait(), 5)
    assert Guarded.rollbacks == []  # it never ran a step: nothing to undo, and no locks to do it under


@pytest.mark.parametrize(
    "options",
    [{"holder": 123}, {"holder": "x\ud800"}, {"ttl": True}, {"ttl": 1e-9}, {"ttl": 1.0, "stop_margin": 0.9999999}],
)
def test_lease_options_of_the_wrong_type_or_unusable_are_refused(options: dict[str, Any]) -> None:
    with pytest.raises(ValueError, match="lease"):
        Lease(**options)


def test_an_error_whose_message_cannot_be_made_is_still_described() -> None:
    from procstore.errors import describe

    class BadStr(Exception):
        def __str__(self) -> str:
            raise ValueError("__str__ broke")

    assert describe(BadStr()).startswith("BadStr: ")
