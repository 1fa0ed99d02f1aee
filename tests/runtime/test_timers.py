"""Durable timers: `Status.sleep` and `Status.sleep_until` end the step, store the wake-up
time with it, and call `execute` again once it has passed, also after a restart; a sleeping
procedure holds no task, and an operator's cancel wakes it at once. Virtual time
(`run_simulated`) makes a ten-minute sleep take no real time."""

from __future__ import annotations

import asyncio
import dataclasses
import json
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from click.testing import CliRunner

from procstore import Context, Lease, LockKey, Procedure, ProcedureFailed, ProcedureWithId, Status, StringKey, Watcher
from procstore._cli.app import cli
from procstore.store import ProcedureMessage
from procstore.store.keys import KeyType
from procstore.testing import kill_manager, run_simulated
from tests import greptimedb_loader
from tests.runtime.test_signals import Waiter
from tests.support import StoreTarget, manager_for, store_targets

TEN_MINUTES = 600.0


class Sleeper(Procedure):
    """Sleeps `seconds` (or until `until`, epoch seconds), then returns the manager's clock."""

    type_name = "test::Sleeper"

    def __init__(self, state: dict[str, object]) -> None:
        self.state = state

    def dump(self) -> str:
        return json.dumps(self.state)

    async def execute(self, ctx: Context) -> Status:
        if not self.state.get("slept"):
            self.state["slept"] = True
            until = self.state.get("until")
            if isinstance(until, float | int):
                return Status.sleep_until(until)
            seconds = self.state["seconds"]
            assert isinstance(seconds, float | int)
            return Status.sleep(seconds)
        return Status.done(asyncio.get_running_loop().time())


def sleeper(seconds: float) -> ProcedureWithId:
    return ProcedureWithId.new(Sleeper({"seconds": seconds}))


def test_a_ten_minute_sleep_runs_in_virtual_time() -> None:
    async def main() -> float:
        async with manager_for("memory://timers-virtual/", Sleeper) as manager:
            watcher = await manager.submit(sleeper(TEN_MINUTES))
            woke = await watcher.wait()
            assert isinstance(woke, float)
            return woke

    assert TEN_MINUTES <= run_simulated(main()) < TEN_MINUTES + 5


def test_the_wake_up_time_is_stored_with_the_step() -> None:
    async def main() -> None:
        async with manager_for("memory://timers-stored/", Sleeper) as manager:
            procedure = sleeper(TEN_MINUTES)
            await manager.submit(procedure)
            await asyncio.sleep(1)
            raw = await manager.store.store.get(manager.store.key(procedure.id, 1, KeyType.STEP))
            assert raw is not None
            message = ProcedureMessage.decode(raw)
            assert message.wake_at is not None and message.wake_at > 0
            assert json.loads(raw)["type_name"] == "test::Sleeper"  # a plain message, one field more

    run_simulated(main())


def test_a_restart_counts_from_the_stored_time() -> None:
    async def main() -> float:
        url = "memory://timers-restart/"
        procedure = sleeper(TEN_MINUTES)
        async with manager_for(url, Sleeper) as first:
            await first.submit(procedure)
            await asyncio.sleep(200)
        async with manager_for(url, Sleeper) as second:
            watcher = second.procedure_watcher(procedure.id)
            assert watcher is not None
            woke = await watcher.wait()
            assert isinstance(woke, float)
            return woke

    # Woken 600 s after the sleep began, not 600 s after the restart (at 200 s).
    assert TEN_MINUTES <= run_simulated(main()) < TEN_MINUTES + 5


def test_sleep_until_takes_an_aware_datetime_or_epoch_seconds() -> None:
    with pytest.raises(ValueError, match="aware"):
        Status.sleep_until(datetime(2030, 1, 1))
    with pytest.raises(TypeError):
        Status.sleep_until("tomorrow")  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        Status.sleep(-1)
    when = datetime(2030, 1, 1, tzinfo=UTC)
    assert Status.sleep_until(when).wake_at == when.timestamp() == Status.sleep_until(when.timestamp()).wake_at

    async def main() -> float:
        async with manager_for("memory://timers-until/", Sleeper) as manager:
            loop = asyncio.get_running_loop()
            until = datetime.fromtimestamp(loop.wall_time(), UTC) + timedelta(minutes=10)  # type: ignore[attr-defined]
            watcher = await manager.submit(ProcedureWithId.new(Sleeper({"until": until.timestamp()})))
            woke = await watcher.wait()
            assert isinstance(woke, float)
            return woke

    assert TEN_MINUTES - 1 <= run_simulated(main()) < TEN_MINUTES + 5


def test_a_cancel_wakes_a_sleeper_at_once() -> None:
    async def main() -> float:
        async with manager_for("memory://timers-cancel/", Sleeper) as manager:
            procedure = sleeper(100 * TEN_MINUTES)
            watcher = await manager.submit(procedure)
            await asyncio.sleep(10)
            await manager.cancel(procedure.id, "no need")
            with pytest.raises(ProcedureFailed, match="no need"):
                await watcher.wait()
            return asyncio.get_running_loop().time()

    assert run_simulated(main()) < 20


def test_sleepers_hold_no_task() -> None:
    async def main() -> None:
        # Parked sleepers do not count as running: 500 of them under a limit of 10.
        async with manager_for("memory://timers-tasks/", Sleeper, max_running_procedures=10) as manager:
            watchers = []
            for i in range(500):
                watchers.append(await manager.submit(sleeper(TEN_MINUTES + i)))
                await asyncio.sleep(0.001)
            await asyncio.sleep(60)
            assert len(asyncio.all_tasks()) < 20
            outputs = await asyncio.gather(*(w.wait() for w in watchers))
            assert all(isinstance(o, float) and o >= TEN_MINUTES for o in outputs)

    run_simulated(main())


real_store = store_targets("memory", "local", "s3")


def test_a_sleeper_wakes_after_a_restart_on_each_store(real_store: StoreTarget) -> None:
    async def main() -> None:
        procedure = sleeper(0.5)
        async with manager_for(real_store, Sleeper) as first:
            await first.submit(procedure)
            await asyncio.sleep(0.1)
        async with manager_for(real_store, Sleeper) as second:
            watcher = second.procedure_watcher(procedure.id)
            assert watcher is not None
            await asyncio.wait_for(watcher.wait(), 10)

    asyncio.run(main())


def test_a_takeover_wakes_the_sleeper_of_the_former_leader() -> None:
    async def main() -> float:
        url = "memory://timers-takeover/"
        procedure = sleeper(TEN_MINUTES)
        first = manager_for(url, Sleeper, lease=Lease(ttl=10.0, holder="first"))
        await first.start()
        await first.wait_until_leading()
        await first.submit(procedure)
        await asyncio.sleep(100)
        await kill_manager(first)
        async with manager_for(url, Sleeper, lease=Lease(ttl=10.0, holder="second")) as second:
            await second.wait_until_leading()
            watcher = second.procedure_watcher(procedure.id)
            assert watcher is not None
            woke = await watcher.wait()
            assert isinstance(woke, float)
        await first.stop()
        return woke

    assert TEN_MINUTES <= run_simulated(main()) < TEN_MINUTES + 60


def test_greptimedbs_loader_reads_a_sleeping_and_a_waiting_step(tmp_path: Path) -> None:
    """The wake-up time and the awaited signal are fields GreptimeDB's loader ignores: it
    reads the step key as an unfinished procedure's (and would run it again at once)."""

    async def main() -> tuple[ProcedureWithId, ProcedureWithId]:
        sleeping = sleeper(TEN_MINUTES)
        waiting = ProcedureWithId.new(Waiter({}))
        async with manager_for(str(tmp_path), Sleeper, Waiter) as manager:
            await manager.submit(sleeping)
            await manager.submit(waiting)
            await asyncio.sleep(0.2)
        return sleeping, waiting

    sleeping, waiting = asyncio.run(main())
    loaded = greptimedb_loader.read_directory(tmp_path)
    assert set(loaded.messages) == {str(sleeping.id), str(waiting.id)}
    assert {m.step for m in loaded.messages.values()} == {1}
    assert loaded.messages[str(sleeping.id)].type_name == "test::Sleeper"


def test_procstore_show_says_until_when_a_step_sleeps(tmp_path: Path) -> None:
    async def main() -> ProcedureWithId:
        procedure = sleeper(TEN_MINUTES)
        async with manager_for(str(tmp_path), Sleeper) as manager:
            await manager.submit(procedure)
            await asyncio.sleep(0.2)
        return procedure

    procedure = asyncio.run(main())
    shown = CliRunner().invoke(cli, ["show", str(tmp_path), str(procedure.id)])
    assert shown.exit_code == 0, shown.output
    assert "then: sleeping until 20" in shown.output
    as_json = CliRunner().invoke(cli, ["show", str(tmp_path), str(procedure.id), "-o", "json"])
    assert as_json.exit_code == 0, as_json.output
    assert '"wake_at"' in as_json.output


def test_procstore_ls_says_a_procedure_sleeps(tmp_path: Path) -> None:
    async def main() -> ProcedureWithId:
        procedure = sleeper(TEN_MINUTES)
        async with manager_for(str(tmp_path), Sleeper) as manager:
            await manager.submit(procedure)
            await asyncio.sleep(0.2)
        return procedure

    procedure = asyncio.run(main())
    listed = CliRunner().invoke(cli, ["ls", str(tmp_path), "--json"])
    assert listed.exit_code == 0, listed.output
    (row,) = [json.loads(line) for line in listed.stdout.splitlines()]
    assert row["id"] == str(procedure.id) and row["waiting"].startswith("sleeping until 20")


def test_a_far_future_or_huge_sleep_keeps_the_procedure_sleeping() -> None:
    # A time after the calendar's last second is kept as it: it never comes either.
    async def main() -> None:
        async with manager_for("memory://timers-far/", Sleeper) as manager:
            far = ProcedureWithId.new(Sleeper({"until": 3e11}))
            await manager.submit(far)
            await manager.submit(sleeper(1e300))
            await asyncio.sleep(1)
            infos = manager.list_procedures()
            assert [i.state.is_failed() for i in infos] == [False, False]
            assert {i.waiting for i in infos} == {"sleeping until 9999-12-31T23:59:59+00:00"}
            await manager.cancel(far.id, "done")

    run_simulated(main())


def test_ls_and_show_survive_any_stored_wake_at(tmp_path: Path) -> None:
    # The store is written by others: a step key may hold any finite wake-up time.
    async def main() -> list[ProcedureWithId]:
        procedures = [sleeper(TEN_MINUTES), sleeper(TEN_MINUTES)]
        async with manager_for(str(tmp_path), Sleeper) as manager:
            for procedure, wake_at in zip(procedures, (-1e300, 1e300), strict=True):
                await manager.submit(procedure)
                await asyncio.sleep(0.1)
                key = manager.store.key(procedure.id, 1, KeyType.STEP)
                stored = ProcedureMessage.decode(await manager.store.store.get(key) or b"")
                await manager.store.store.put(key, dataclasses.replace(stored, wake_at=wake_at).encode())
        return procedures

    procedures = asyncio.run(main())
    for args in (
        ["ls", str(tmp_path), "--json"],
        ["ls", str(tmp_path)],
        *(["show", str(tmp_path), str(p.id)] for p in procedures),
    ):
        result = CliRunner().invoke(cli, args)
        assert result.exit_code == 0, (args, result.output, result.exception)
    listed = CliRunner().invoke(cli, ["ls", str(tmp_path), "--json"])
    waiting = sorted(json.loads(line)["waiting"] for line in listed.stdout.splitlines())
    assert waiting == ["sleeping until 1970-01-01T00:00:00+00:00", "sleeping until 9999-12-31T23:59:59+00:00"]


class LockedSleeper(Sleeper):
    type_name = "test::LockedSleeper"

    def lock_key(self) -> LockKey:
        return LockKey([StringKey.exclusive("table/42")])


def test_a_sleeper_keeps_its_locks_while_it_sleeps() -> None:
    async def main() -> list[str]:
        ended: list[str] = []

        async def track(name: str, watcher: Watcher) -> None:
            await watcher.wait()
            ended.append(name)

        async with manager_for("memory://timers-locks/", LockedSleeper) as manager:
            first = await manager.submit(ProcedureWithId.new(LockedSleeper({"seconds": TEN_MINUTES})))
            await asyncio.sleep(1)
            second = await manager.submit(ProcedureWithId.new(LockedSleeper({"seconds": 1})))
            await asyncio.gather(track("first", first), track("second", second))
        return ended

    # The second sleeps a second, the first ten minutes: it ends last only if it waited for
    # the lock the sleeping first kept.
    assert run_simulated(main()) == ["first", "second"]


class Napper(Procedure):
    """Sleeps `seconds` without storing its state (`persist=False`), then a zero-second sleep."""

    type_name = "test::Napper"

    def __init__(self, state: dict[str, object]) -> None:
        self.state = state

    def dump(self) -> str:
        return json.dumps(self.state)

    async def execute(self, ctx: Context) -> Status:
        naps = self.state.setdefault("naps", 0)
        assert isinstance(naps, int)
        self.state["naps"] = naps + 1
        if naps == 0:
            return Status.sleep(60, persist=False)
        if naps == 1:
            return Status.sleep(0)
        return Status.done(asyncio.get_running_loop().time())


def test_a_sleep_without_persist_and_a_zero_sleep() -> None:
    async def main() -> object:
        async with manager_for("memory://timers-nap/", Napper) as manager:
            procedure = ProcedureWithId.new(Napper({}))
            watcher = await manager.submit(procedure)
            await asyncio.sleep(1)
            keys = await manager.store.procedure_keys(procedure.id)
            assert [k.step for k in keys] == [0]  # the unpersisted sleep stored nothing
            return await watcher.wait()

    woke = run_simulated(main())
    assert isinstance(woke, float) and 60 <= woke < 61
