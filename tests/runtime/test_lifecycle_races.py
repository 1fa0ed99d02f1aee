"""Reproductions of the review's lifecycle races and hangs (issue 15), through the public API."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest

from procstore import (
    Context,
    Lease,
    LockCycle,
    LockKey,
    ManagerStopped,
    ProcedureFailed,
    ProcedureId,
    ProcedureManager,
    ProcedureWithId,
    Status,
    StoreError,
    StringKey,
)
from procstore._aio import run_blocking
from procstore.store.io_threads import IoThreads
from procstore.store.local import LocalDirStore
from procstore.store.procedure_store import ProcedureStore
from procstore.testing import Fault, FaultyStore
from tests.procedures import BLOCKERS, JsonProcedure, World
from tests.runtime.helpers import blocker, steps
from tests.support import StoreTarget, manager_for


class BadLocks(JsonProcedure):
    """Its lock_key() raises: a bug in user code."""

    type_name = "races::BadLocks"

    async def execute(self, ctx: Context) -> Status:
        return Status.done()

    def lock_key(self) -> LockKey:
        raise KeyError("no such table")


class CancelsItself(JsonProcedure):
    """execute() cancels and awaits its own helper task, and lets the CancelledError out."""

    type_name = "races::CancelsItself"

    async def execute(self, ctx: Context) -> Status:
        helper = asyncio.ensure_future(asyncio.sleep(10))
        await asyncio.sleep(0)
        helper.cancel()
        await helper
        return Status.done()


class HoldsC(JsonProcedure):
    """Holds lock `c`; waits for its gate, then runs a child that wants `b`."""

    type_name = "races::HoldsC"

    async def execute(self, ctx: Context) -> Status:
        if not self.data.get("suspended"):
            await BLOCKERS[self.data["gate"]].wait()
            self.data["suspended"] = True
            child = ProcedureWithId(ProcedureId.parse(self.data["child"]), WantsB({"world": self.data["world"]}))
            return Status.suspended([child])
        state = ctx.provider.procedure_state(ProcedureId.parse(self.data["child"]))
        self.world.log.append(f"child ended: {state.kind.name if state else None}")
        return Status.done()

    def lock_key(self) -> LockKey:
        return LockKey([StringKey.exclusive("c")])


class WantsB(JsonProcedure):
    type_name = "races::WantsB"

    async def execute(self, ctx: Context) -> Status:
        return Status.done()

    def lock_key(self) -> LockKey:
        return LockKey([StringKey.exclusive("b")])


PROCEDURES = (BadLocks, CancelsItself, HoldsC, WantsB)


async def test_a_lock_key_that_raises_stores_nothing_and_never_stops_a_start(tmp_path: Path) -> None:
    world = World.new()
    async with manager_for(str(tmp_path), *PROCEDURES) as manager:
        with pytest.raises(KeyError, match="no such table"):
            await manager.submit(ProcedureWithId.new(BadLocks({"world": world.name})))
    assert await LocalDirStore(tmp_path).walk("procedure/") == []

    # One stored anyway (an older release, another process): start() reports it and goes on.
    bad = ProcedureId.random()
    await ProcedureStore(LocalDirStore(tmp_path)).create_procedure(bad, BadLocks.type_name, "{}", None)
    async with manager_for(str(tmp_path), *PROCEDURES) as manager:
        assert [p.procedure_id for p in manager.recovery_problems] == [bad]
        assert "lock_key() failed" in manager.recovery_problems[0].reason
        await (await manager.submit(steps(world, 1))).wait()


async def test_a_stray_cancelled_error_fails_the_procedure_instead_of_hanging(memory_target: StoreTarget) -> None:
    world = World.new()
    async with manager_for(memory_target, *PROCEDURES) as manager:
        watcher = await manager.submit(ProcedureWithId.new(CancelsItself({"world": world.name})))
        with pytest.raises(ProcedureFailed, match="nothing cancelled the procedure"):
            await asyncio.wait_for(watcher.wait(), 10)


async def test_concurrent_starts_run_every_procedure_once(tmp_path: Path) -> None:
    world = World.new()
    name, gate = blocker()
    async with manager_for(str(tmp_path), *PROCEDURES) as first:
        await first.submit(steps(world, 2, block=name, block_at=1))
        while world.counts["steps/0"] == 0:
            await asyncio.sleep(0.01)
    manager = manager_for(str(tmp_path), *PROCEDURES)
    gate.set()
    await asyncio.gather(manager.start(), manager.start(), manager.start())
    while world.counts["steps/1"] == 0:
        await asyncio.sleep(0.01)
    await asyncio.gather(manager.stop(), manager.stop())
    await asyncio.sleep(0.1)
    assert world.counts["steps/1"] == 1


async def test_stop_returns_only_once_an_in_flight_submit_can_no_longer_land(tmp_path: Path) -> None:
    world = World.new()
    slow = Fault("delay", kinds=frozenset({"put_if_absent"}), key="*/0000000000.step", seconds=0.3)
    store = FaultyStore(LocalDirStore(tmp_path), faults=[slow])
    manager = manager_for(store)
    await manager.start()
    submitting = asyncio.ensure_future(manager.submit(steps(world, 1)))
    await asyncio.sleep(0.05)
    await manager.stop()
    with pytest.raises(StoreError, match="may have landed"):
        await submitting
    keys = await LocalDirStore(tmp_path).walk("procedure/")
    await asyncio.sleep(0.5)
    assert await LocalDirStore(tmp_path).walk("procedure/") == keys == []


@pytest.mark.parametrize("in_thread", [run_blocking, IoThreads(2, "test-io").run], ids=["run_blocking", "IoThreads"])
async def test_a_thread_is_waited_for_however_often_its_caller_is_cancelled(
    in_thread: Callable[[Callable[[], None]], Awaitable[None]],
) -> None:
    finished = threading.Event()

    def write() -> None:
        time.sleep(0.3)
        finished.set()

    task = asyncio.ensure_future(in_thread(write))
    await asyncio.sleep(0.05)
    task.cancel()
    await asyncio.sleep(0.01)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert finished.is_set(), "returned while the write could still land"


async def test_wait_until_leading_raises_after_the_standbys_stop(tmp_path: Path) -> None:
    leader = manager_for(str(tmp_path), *PROCEDURES, lease=Lease(ttl=5.0, holder="leader"))
    standby = manager_for(str(tmp_path), *PROCEDURES, lease=Lease(ttl=5.0, holder="standby"))
    await leader.start()
    await standby.start()
    waiting = asyncio.ensure_future(standby.wait_until_leading())
    await asyncio.sleep(0.1)
    await standby.stop()
    with pytest.raises(ManagerStopped):
        await asyncio.wait_for(waiting, 5)
    await leader.stop()


async def test_the_epoch_never_goes_backwards_when_the_lease_object_is_deleted(tmp_path: Path) -> None:
    lease_file = tmp_path / "lease" / "procedures.json"
    manager = manager_for(str(tmp_path), *PROCEDURES, lease=Lease(ttl=2.0, holder="only"))
    epochs = []
    for _ in range(2):
        await manager.start()
        await manager.wait_until_leading()
        epochs.append(json.loads(lease_file.read_bytes())["epoch"])
        await manager.stop()
    lease_file.unlink()
    await manager.start()
    await manager.wait_until_leading()
    epochs.append(json.loads(lease_file.read_bytes())["epoch"])
    await manager.stop()
    assert epochs == sorted(epochs) and len(set(epochs)) == 3, epochs


@pytest.mark.parametrize(
    "record",
    [
        {"holder": "ghost", "epoch": 4, "renewal": 1, "ttl": "inf", "released": False},
        {"holder": "ghost", "epoch": 1e300, "renewal": 1, "ttl": 0.5, "released": False},
        {"holder": "ghost", "epoch": 4, "renewal": 1, "ttl": 0.5, "released": "false"},
    ],
)
async def test_an_invalid_lease_record_is_taken_over_as_an_unreadable_one(
    tmp_path: Path, record: dict[str, object]
) -> None:
    (tmp_path / "lease").mkdir()
    (tmp_path / "lease" / "procedures.json").write_text(json.dumps(record))
    manager = manager_for(str(tmp_path), *PROCEDURES, lease=Lease(ttl=0.5, holder="new"))
    await manager.start()
    try:
        await asyncio.wait_for(manager.wait_until_leading(), 10)
        assert manager.leader == "new"
    finally:
        await manager.stop()


async def test_a_three_procedure_lock_cycle_fails_one_instead_of_deadlocking(memory_target: StoreTarget) -> None:
    world = World.new()
    name, gate = blocker()
    child = ProcedureId.random()
    async with manager_for(memory_target, *PROCEDURES) as manager:
        holder = await manager.submit(
            ProcedureWithId.new(HoldsC({"world": world.name, "gate": name, "child": str(child)}))
        )
        await asyncio.sleep(0.05)  # P holds c
        other = await manager.submit(steps(world, 1, name="q", exclusive=["b", "c"]))  # Q takes b, waits for c
        await asyncio.sleep(0.05)
        gate.set()  # P's child now wants b
        await asyncio.wait_for(asyncio.gather(holder.wait(), other.wait()), 10)
        state = manager.procedure_state(child)
        assert state is not None and state.is_failed() and isinstance(state.cause, LockCycle), state
    assert "child ended: FAILED" in world.log and "q/0" in world.log


def test_an_is_predicate_reads_the_same_called_or_not() -> None:
    from procstore import ProcedureState

    done = ProcedureState.done()
    assert done.is_done() and done.is_done
    assert not done.is_running() and not done.is_running  # a bound method was always true
    assert ProcedureManager("memory://never-started/").is_running is False  # a plain bool, JSON-ready


def test_a_predicate_answer_cannot_be_changed() -> None:
    """The answers are shared by every state: changing one would change them all."""
    import copy
    import pickle

    from procstore import ProcedureState
    from procstore.state import Predicate

    done, running = ProcedureState.done(), ProcedureState.running()
    with pytest.raises(AttributeError):
        Predicate.__init__(done.is_running, True)
    with pytest.raises(AttributeError):
        done.is_running._value = True
    assert not running.is_done() and not running.is_done
    for answer in (done.is_done, done.is_running):
        assert copy.copy(answer) == answer and copy.deepcopy(answer) == answer
        assert pickle.loads(pickle.dumps(answer)) == answer


def test_the_kinds_have_one_name_and_the_old_spelling_warns() -> None:
    from procstore import ProcedureState, ProcedureStateKind

    assert "DONE" not in vars(ProcedureState)  # no second name in the class itself
    with pytest.warns(DeprecationWarning, match=r"ProcedureStateKind\.DONE"):
        assert ProcedureState.DONE is ProcedureStateKind.DONE
    with pytest.raises(AttributeError):
        _ = ProcedureState.NOT_A_KIND


def test_each_lease_option_has_one_name_and_the_old_ones_warn() -> None:
    lease = Lease(ttl=10.0)
    assert (lease.stop_margin, lease.late_write_grace, lease.adopt_interval) == (2.0, 50.0, 30.0)
    assert Lease(ttl=10.0, stop_margin=1.0).stop_margin == 1.0
    with pytest.warns(DeprecationWarning, match="stop_margin"):
        assert lease.margin == 2.0
    with pytest.warns(DeprecationWarning, match="late_write_grace"):
        assert lease.grace == 50.0
    with pytest.warns(DeprecationWarning, match="adopt_interval"):
        assert lease.adopt_every == 30.0


def test_the_old_lease_option_names_stay_attributes_of_the_class() -> None:
    # Looked up on the class (as `dir()`, `help()` and a type checker do), not only read
    # through a fallback: a misspelt attribute of a `Lease` is then still an error to mypy.
    assert {"margin", "grace", "adopt_every"} <= set(dir(Lease))
    assert all(hasattr(Lease, name) for name in ("margin", "grace", "adopt_every"))
    assert not hasattr(Lease, "__getattr__")
    with pytest.raises(AttributeError, match="stop_margn"):
        _ = Lease().stop_margn  # type: ignore[attr-defined]
