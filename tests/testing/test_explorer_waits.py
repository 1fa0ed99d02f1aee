"""The crash explorer proves signals are consumed exactly once: killed before and after
every store operation (the signal's consumption in the step that read it, the deletion of
its key), each run delivers each signal to exactly one step, in the order sent, and leaves
no signal behind. And a durable timer, killed around its step's write and its wake-up,
never wakes before its stored time (in virtual time)."""

from __future__ import annotations

import asyncio
import json
import uuid
from typing import Any

from procstore import Context, Procedure, ProcedureId, ProcedureManager, ProcedureWithId, Status
from procstore.store import StateStore
from procstore.store.signals import SIGNALS_PATH, SignalStore
from procstore.testing import CrashExplorer, Scenario, run_simulated

RECEIVED: dict[str, list[Any]] = {}
RECEIVER = ProcedureId(uuid.UUID(int=38))


class Receiver(Procedure):
    """Waits for two signals "go", one per wait, and records what each step received."""

    type_name = "tests::Receiver"

    def __init__(self, data: dict[str, Any]) -> None:
        self.data = data

    def dump(self) -> str:
        return json.dumps(self.data)

    async def execute(self, ctx: Context) -> Status:
        got: list[Any] = self.data.setdefault("got", [])
        if self.data.get("waiting"):
            got.append(ctx.signals.get("go", "timed out"))
            self.data["waiting"] = False
            return Status.executing()
        if len(got) < 2:
            self.data["waiting"] = True
            return Status.wait_for_signal("go", timeout=30)
        RECEIVED[str(ctx.procedure_id)] = got
        return Status.done()


class Signalled(Scenario):
    name = "signalled"

    async def prepare(self, store: StateStore) -> None:
        RECEIVED.clear()
        signals = SignalStore(store)
        for n in range(2):
            await signals.put(RECEIVER, "go", n)

    def attach(self, manager: ProcedureManager, store: StateStore) -> None:
        manager.register(Receiver)

    async def procedures(self, store: StateStore) -> list[ProcedureWithId]:
        return [ProcedureWithId(RECEIVER, Receiver({}))]

    async def snapshot(self, store: StateStore) -> object:
        return dict(RECEIVED)

    async def invariant(self, store: StateStore) -> None:
        assert {str(RECEIVER): [0, 1]} == RECEIVED
        assert await store.walk(SIGNALS_PATH) == []


async def test_each_signal_is_consumed_exactly_once_whatever_the_crash() -> None:
    report = await CrashExplorer(Signalled(), lambda n: f"memory://explorer-signals-{n}-{uuid.uuid4().hex}/").explore()
    report.assert_ok()
    assert report.explored > 10  # around every operation, the signals' deletions included


class Napper(Procedure):
    """Sleeps until a stored time, and fails if woken before it."""

    type_name = "tests::Napper"

    def __init__(self, data: dict[str, Any]) -> None:
        self.data = data

    def dump(self) -> str:
        return json.dumps(self.data)

    async def execute(self, ctx: Context) -> Status:
        now: float = asyncio.get_running_loop().wall_time()  # type: ignore[attr-defined]
        until = self.data.get("until")
        if until is None:
            self.data["until"] = now + 10  # within the explorer's 30 s per run
            return Status.sleep_until(self.data["until"])
        if now < until:
            raise AssertionError(f"woken {until - now:.3f}s early")
        return Status.done()


class Napping(Scenario):
    name = "napping"

    def attach(self, manager: ProcedureManager, store: StateStore) -> None:
        manager.register(Napper)

    async def procedures(self, store: StateStore) -> list[ProcedureWithId]:
        return [ProcedureWithId(RECEIVER, Napper({}))]


def test_a_timer_never_wakes_early_whatever_the_crash() -> None:
    explorer = CrashExplorer(Napping(), lambda n: f"memory://explorer-timers-{n}-{uuid.uuid4().hex}/")
    report = run_simulated(explorer.explore())
    report.assert_ok()
    assert report.explored > 4


class SleepyReceiver(Procedure):
    """Sleeps, then waits for two signals "go" with no step between: the step that reads
    one waits for the next (consumed and a new wait in one message), and the step that reads
    the last ends the procedure (consumed with its `.commit`)."""

    type_name = "tests::SleepyReceiver"

    def __init__(self, data: dict[str, Any]) -> None:
        self.data = data

    def dump(self) -> str:
        return json.dumps(self.data)

    async def execute(self, ctx: Context) -> Status:
        if not self.data.get("slept"):
            self.data["slept"] = True
            return Status.sleep(5)
        got: list[Any] = self.data.setdefault("got", [])
        if self.data.get("waiting"):
            got.append(ctx.signals.get("go", "timed out"))
        if len(got) < 2:
            self.data["waiting"] = True
            return Status.wait_for_signal("go", timeout=20)
        RECEIVED[str(ctx.procedure_id)] = got
        return Status.done()


class SleepyThenSignalled(Signalled):
    name = "sleepy-then-signalled"

    def attach(self, manager: ProcedureManager, store: StateStore) -> None:
        manager.register(SleepyReceiver)

    async def procedures(self, store: StateStore) -> list[ProcedureWithId]:
        return [ProcedureWithId(RECEIVER, SleepyReceiver({}))]


def test_a_signal_consumed_by_the_last_step_is_deleted_whatever_the_crash() -> None:
    # A crash between the `.commit` and the signal's deletion: recovery deletes it.
    explorer = CrashExplorer(SleepyThenSignalled(), lambda n: f"memory://explorer-last-{n}-{uuid.uuid4().hex}/")
    report = run_simulated(explorer.explore())
    report.assert_ok()
    assert report.explored > 10
