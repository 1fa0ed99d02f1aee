"""Flow control: `Procedure.concurrency()` (at most N running per key), `rate_limit` (at most
N first starts of a type per period) and `priority()` among those waiting. Waiting ones say
why in `ProcedureInfo.waiting`; every manager obeys the limits after a restart, since they
are computed from the stored procedure. Virtual time."""

from __future__ import annotations

import asyncio
import json
import random
from typing import Any, ClassVar

import pytest

from procstore import (
    Concurrency,
    Context,
    Lease,
    Procedure,
    ProcedureFailed,
    ProcedureWithId,
    RateLimit,
    Status,
)
from procstore._runtime.flow_control import Admission, FlowControl
from procstore.ids import ProcedureId
from procstore.store.activity import ActivityStore
from procstore.store.rate_starts import RateStartsStore
from procstore.testing import kill_manager, run_simulated
from tests.support import StoreTarget, manager_for, store_targets

RUNNING: set[str] = set()
PEAK: dict[str, int] = {}
STARTED: list[tuple[str, float]] = []


class Migration(Procedure):
    """Runs for `seconds` (a durable sleep) under concurrency key `key` (limit `limit`)."""

    type_name = "test::Migration"

    def __init__(self, state: dict[str, Any]) -> None:
        self.state = state

    def dump(self) -> str:
        return json.dumps(self.state)

    def concurrency(self) -> Concurrency | None:
        return Concurrency(self.state["key"], self.state.get("limit", 3))

    def priority(self) -> int:
        return int(self.state.get("priority", 0))

    async def execute(self, ctx: Context) -> Status:
        if not self.state.get("began"):
            key = self.state["key"]
            self.state["began"] = True
            RUNNING.add(str(ctx.procedure_id))
            STARTED.append((self.state.get("name", ""), asyncio.get_running_loop().time()))
            PEAK[key] = max(PEAK.get(key, 0), len(RUNNING))
            return Status.sleep(self.state.get("seconds", 10))
        RUNNING.discard(str(ctx.procedure_id))
        return Status.done()


class Create(Procedure):
    """One call to a rate-limited cloud API."""

    type_name = "test::Create"
    rate_limit: ClassVar[RateLimit | None] = RateLimit(starts=10, per=1.0)

    def __init__(self, state: dict[str, Any]) -> None:
        self.state = state

    def dump(self) -> str:
        return json.dumps(self.state)

    def priority(self) -> int:
        return int(self.state.get("priority", 0))

    async def execute(self, ctx: Context) -> Status:
        STARTED.append((self.state.get("name", ""), asyncio.get_running_loop().time()))
        return Status.done()


@pytest.fixture(autouse=True)
def fresh() -> None:
    RUNNING.clear()
    PEAK.clear()
    STARTED.clear()


def migration(key: str = "cluster/c1", **state: Any) -> ProcedureWithId:
    return ProcedureWithId.new(Migration({"key": key, **state}))


def test_at_most_limit_run_at_once_per_key() -> None:
    async def main() -> None:
        async with manager_for("memory://flow-limit/", Migration) as manager:
            watchers = [await manager.submit(migration(name=str(i))) for i in range(7)]
            watchers.append(await manager.submit(migration("cluster/c2")))
            await asyncio.sleep(1)
            infos = {i.id: i for i in manager.list_procedures()}
            waiting = [i for i in infos.values() if i.waiting and "concurrency slot" in i.waiting]
            assert len(waiting) == 4
            assert "'cluster/c1' (3 running, limit 3)" in (waiting[0].waiting or "")
            sleeping = [i for i in infos.values() if i.waiting and i.waiting.startswith("sleeping until")]
            assert len(sleeping) == 4  # three of cluster/c1, one of cluster/c2
            # Three batches of ten seconds (3, 3, 1), in virtual time: at 29 s the last one
            # still runs, and two seconds later every procedure has ended.
            ends = [asyncio.ensure_future(w.wait()) for w in watchers]
            await asyncio.sleep(28)
            assert not all(end.done() for end in ends)
            async with asyncio.timeout(2):
                await asyncio.gather(*ends)
            assert [info.waiting for info in manager.list_procedures()] == [None] * 8
            assert PEAK == {"cluster/c1": 3, "cluster/c2": 4}  # c2's one ran beside c1's three

    run_simulated(main())


def test_the_highest_priority_waiting_starts_first() -> None:
    async def main() -> None:
        async with manager_for("memory://flow-priority/", Migration) as manager:
            first = await manager.submit(migration(name="first", limit=1))
            await asyncio.sleep(1)
            rest = [await manager.submit(migration(name=n, limit=1, priority=p)) for n, p in [("low", 0), ("high", 5)]]
            await asyncio.gather(first.wait(), *(w.wait() for w in rest))
            assert [name for name, _ in STARTED] == ["first", "high", "low"]

    run_simulated(main())


def test_a_rate_limit_spaces_the_starts_of_a_type() -> None:
    async def main() -> None:
        async with manager_for("memory://flow-rate/", Create) as manager:
            watchers = [await manager.submit(ProcedureWithId.new(Create({"name": str(i)}))) for i in range(25)]
            async with asyncio.timeout(3.0):  # (virtual time) 25 starts at 10 a second, not held back longer
                await asyncio.gather(*(w.wait() for w in watchers))
            times = [t for _, t in STARTED]
            for i in range(len(times) - 10):
                assert times[i + 10] - times[i] >= 1.0  # never more than 10 in a second

    run_simulated(main())


def test_a_cancel_ends_the_wait_for_a_slot() -> None:
    async def main() -> None:
        async with manager_for("memory://flow-cancel/", Migration) as manager:
            await manager.submit(migration(limit=1, seconds=1000))
            waiting = migration(limit=1)
            watcher = await manager.submit(waiting)
            await asyncio.sleep(1)
            async with asyncio.timeout(4):  # virtual seconds, not the 1,000 s slot holder's
                await manager.cancel(waiting.id, "not now")
                with pytest.raises(ProcedureFailed, match="not now"):
                    await watcher.wait()

    run_simulated(main())


def test_declared_limits_are_checked() -> None:
    with pytest.raises(ValueError):
        Concurrency("k", 0)
    with pytest.raises(TypeError):
        Concurrency("", 1)
    with pytest.raises(ValueError):
        RateLimit(0, 1.0)
    with pytest.raises(ValueError):
        RateLimit(1, 0)


real_store = store_targets("memory", "local", "s3")


def test_the_limit_holds_after_a_restart(real_store: StoreTarget) -> None:
    """Resumed ones were running: they keep their slots, and a new one waits for them."""

    async def main() -> None:
        # Long enough that a store slowed by a busy machine (S3 on moto) cannot end them
        # before the late one is looked at; the look waits for the late one to be waiting.
        running = [migration(limit=2, seconds=3.0) for _ in range(2)]
        async with manager_for(real_store, Migration) as first:
            for procedure in running:
                await first.submit(procedure)
            await asyncio.sleep(0.1)
        async with manager_for(real_store, Migration) as second:
            late = await second.submit(migration(limit=2, name="late", seconds=0.1))
            waiting: list[str | None] = []
            for _ in range(100):
                info = {i.id: i for i in second.list_procedures()}
                waiting = [i.waiting for i in info.values() if i.waiting and "slot" in i.waiting]
                if waiting or late.state.is_done():
                    break
                await asyncio.sleep(0.02)
            assert len(waiting) == 1
            await asyncio.wait_for(late.wait(), 10)
            for procedure in running:
                watcher = second.procedure_watcher(procedure.id)
                assert watcher is not None
                await asyncio.wait_for(watcher.wait(), 10)

    asyncio.run(main())


@pytest.mark.parametrize("seed", range(5))
def test_after_a_restart_the_resumed_running_ones_keep_their_slots_first(seed: int) -> None:
    """Recovery starts stored procedures in any order: those that were running take their
    slots before any that was still waiting can."""

    async def main() -> None:
        url = f"memory://flow-restart-order-{seed}/"
        procedures = [migration(limit=2, seconds=60, name=str(i)) for i in range(5)]
        async with manager_for(url, Migration) as first:
            for procedure in procedures:
                await first.submit(procedure)
            await asyncio.sleep(1)
            assert len([i for i in first.list_procedures() if i.waiting and "slot" in i.waiting]) == 3
        PEAK.clear()
        async with manager_for(url, Migration) as second:
            watchers = [second.procedure_watcher(p.id) for p in procedures]
            await asyncio.gather(*(w.wait() for w in watchers if w is not None))
        assert PEAK == {"cluster/c1": 2}  # never a third beside the two that were running

    run_simulated(main(), seed=seed)


def test_a_procedure_waiting_to_start_says_why_in_its_activity() -> None:
    async def main() -> None:
        async with manager_for("memory://flow-activity/", Migration) as manager:
            await manager.submit(migration(limit=1, seconds=100))
            waiting = migration(limit=1)
            await manager.submit(waiting)
            await asyncio.sleep(5)
            activity = await ActivityStore(manager.store.store).get(waiting.id)
            assert activity is not None and activity.doing == "waiting to start"
            assert activity.reason == "waiting for a concurrency slot of 'cluster/c1' (1 running, limit 1)"

    run_simulated(main())


class Flaky(Migration):
    """A `Migration` whose second step fails while `OUTAGE` holds (it retries nothing)."""

    type_name = "test::FlakyMigration"
    OUTAGE: ClassVar[list[bool]] = [True]

    async def execute(self, ctx: Context) -> Status:
        if not self.state.get("prepared"):
            self.state["prepared"] = True
            return Status.executing()
        if self.OUTAGE[0]:
            raise RuntimeError("datanode down")
        return await super().execute(ctx)


def test_a_procedure_resumed_after_it_failed_waits_for_a_slot() -> None:
    # It held no slot once it failed: an operator's resume makes it a new contender, not
    # one that was running before a restart (which takes its slot at once).
    async def main() -> None:
        async with manager_for("memory://flow-resumed/", Flaky, keep_failed=True) as manager:
            failed = [await manager.submit(ProcedureWithId.new(Flaky({"key": "k", "limit": 1}))) for _ in range(4)]
            for watcher in failed:
                with pytest.raises(ProcedureFailed):
                    await watcher.wait()
            Flaky.OUTAGE[0] = False
            resumed = [await manager.resume(w.procedure_id) for w in failed]
            await asyncio.sleep(1)
            waiting = [i.waiting for i in manager.list_procedures() if i.waiting and "concurrency slot" in i.waiting]
            assert len(waiting) == 3
            await asyncio.gather(*(w.wait() for w in resumed))
            assert PEAK == {"k": 1}

    try:
        run_simulated(main())
    finally:
        Flaky.OUTAGE[0] = True


class RatedOnKey(Create):
    """A `Create` of at most one start an hour, under concurrency key "k" (limit 1), first in line."""

    type_name = "test::RatedOnKey"
    rate_limit: ClassVar[RateLimit | None] = RateLimit(starts=1, per=3600)

    def concurrency(self) -> Concurrency | None:
        return Concurrency("k", 1)

    def priority(self) -> int:
        return 10

    async def execute(self, ctx: Context) -> Status:
        if self.state.pop("nap", False):
            return Status.sleep(10)  # holding its slot
        return await super().execute(ctx)


class UnratedOnKey(RatedOnKey):
    type_name = "test::UnratedOnKey"
    rate_limit: ClassVar[RateLimit | None] = None

    def priority(self) -> int:
        return 0


def test_a_waiter_held_back_by_its_rate_leaves_a_free_slot_to_the_next() -> None:
    async def main() -> None:
        async with manager_for("memory://flow-rate-head/", RatedOnKey, UnratedOnKey) as manager:
            await (await manager.submit(ProcedureWithId.new(RatedOnKey({"name": "a1"})))).wait()
            await manager.submit(ProcedureWithId.new(RatedOnKey({"name": "a2"})))  # waits an hour for its rate
            await asyncio.sleep(1)
            # b takes the free slot at once; c waits for it, and b's release wakes c, not a2.
            b, c = [await manager.submit(ProcedureWithId.new(UnratedOnKey({"name": n, "nap": True}))) for n in "bc"]
            async with asyncio.timeout(28):  # virtual seconds: a2's rate holds it for an hour
                await asyncio.gather(b.wait(), c.wait())
            assert [name for name, _ in STARTED] == ["a1", "b", "c"]

    run_simulated(main())


def test_a_waiter_held_for_a_slot_whose_rate_is_full_when_the_slot_frees_starts_once_its_rate_allows() -> None:
    """a2 waits for the slot a1 holds (a wait with no timer of its own); when a1 frees it,
    a2's rate allows no start for an hour: it must look again then, not wait for ever."""

    async def main() -> None:
        async with manager_for("memory://flow-rate-after-slot/", RatedOnKey) as manager:
            began = asyncio.get_running_loop().time()
            await manager.submit(ProcedureWithId.new(RatedOnKey({"name": "a1", "nap": True})))
            await asyncio.sleep(1)
            a2 = await manager.submit(ProcedureWithId.new(RatedOnKey({"name": "a2"})))
            async with asyncio.timeout(3700):  # virtual seconds: the rate allows a2 at 3600
                await a2.wait()
            assert [name for name, _ in STARTED] == ["a1", "a2"] and STARTED[1][1] - began >= 3600

    run_simulated(main())


class Hourly(Create):
    type_name = "test::HourlyCreate"
    rate_limit: ClassVar[RateLimit | None] = RateLimit(starts=2, per=3600)


def test_the_rate_holds_after_a_restart(real_store: StoreTarget) -> None:
    # The starts of the type are stored: the next manager goes on counting them.
    async def main() -> None:
        creates = [ProcedureWithId.new(Hourly({"name": str(i)})) for i in range(4)]
        async with manager_for(real_store, Hourly) as first:
            for procedure in creates:
                await first.submit(procedure)
            await asyncio.sleep(0.3)
        async with manager_for(real_store, Hourly) as second:
            await asyncio.sleep(0.3)
            waiting = [i.waiting for i in second.list_procedures() if i.waiting]
            assert len(STARTED) == 2 and len(waiting) == 2, (STARTED, waiting)
            assert "rate limit of 'test::HourlyCreate'" in (waiting[0] or "")
            for procedure in creates[2:]:
                await second.cancel(procedure.id, "done")

    asyncio.run(main())


def test_the_rate_holds_after_a_takeover() -> None:
    async def main() -> None:
        url = "memory://flow-rate-takeover/"
        creates = [ProcedureWithId.new(Hourly({"name": str(i)})) for i in range(4)]
        first = manager_for(url, Hourly, lease=Lease(ttl=10.0, holder="first"))
        await first.start()
        await first.wait_until_leading()
        for procedure in creates:
            await first.submit(procedure)
        await asyncio.sleep(60)
        await kill_manager(first)
        async with manager_for(url, Hourly, lease=Lease(ttl=10.0, holder="second")) as second:
            await second.wait_until_leading()
            watchers = [second.procedure_watcher(p.id) for p in creates[2:]]
            await asyncio.gather(*(w.wait() for w in watchers if w is not None))
        await first.stop()
        starts = [at for _, at in STARTED]
        assert len(starts) == 4 and starts[2] - starts[0] >= 3600, starts

    run_simulated(main())


def test_stored_starts_ahead_of_the_clock_hold_a_type_back_one_period_at_most() -> None:
    async def main() -> None:
        url = "memory://flow-rate-ahead/"
        async with manager_for(url, Hourly) as manager:
            await RateStartsStore(manager.store.store).put(Hourly.type_name, [1e15, 1e15])
            watcher = await manager.submit(ProcedureWithId.new(Hourly({"name": "next"})))
            await asyncio.wait_for(watcher.wait(), 7200)
        assert [at for _, at in STARTED] == [pytest.approx(3600, abs=1)]

    run_simulated(main())


class _NoStarts:
    """No stored starts, and none kept: the rate counts this flow control's own."""

    async def get(self, type_name: str) -> list[float]:
        return []

    async def put(self, type_name: str, starts: object) -> None:
        pass


def test_a_rate_whose_window_moves_in_the_last_bit_of_the_clock_waits_and_does_not_spin() -> None:
    """Sixty procedures of three types, with a shared slot and two rates, come and go at
    seeded times. At one moment the oldest start in a rate's window was due in exactly 0
    seconds by one sum and not yet gone by another: the waiter behind it looked again at once,
    on a simulated clock that never moved, for ever. Every one is admitted, in a bounded
    number of looks."""
    rnd = random.Random(3)

    async def main() -> int:
        loop = asyncio.get_running_loop()
        looks = 0

        class Counted(FlowControl):
            __slots__ = ()

            def _blocked(self, waiter: Any) -> tuple[str | None, float | None]:
                nonlocal looks
                looks += 1
                if looks > 20_000:
                    raise AssertionError(f"{looks} looks at virtual time {loop.time():.3f}: a waiter spins")
                return super()._blocked(waiter)

        flow = Counted(_NoStarts(), clock=loop.time)  # type: ignore[arg-type]
        limit = rnd.randint(1, 3)
        rates = {"A": RateLimit(rnd.randint(1, 3), rnd.choice([1.0, 5.0, 30.0])), "B": None, "C": RateLimit(1, 10.0)}
        admitted = 0

        async def one() -> None:
            nonlocal admitted
            await asyncio.sleep(rnd.random() * 20)
            kind = rnd.choice("ABC")
            slot = Concurrency("K", limit) if rnd.random() < 0.9 else None
            admission = Admission(kind, slot, rates[kind], rnd.randint(0, 2))
            pid = ProcedureId.random()
            assert await flow.admit(pid, admission, started=False, unless=asyncio.Event(), report=lambda _: None)
            admitted += 1
            await asyncio.sleep(rnd.random() * 10)
            flow.release(pid)

        await asyncio.gather(*(one() for _ in range(60)))
        return admitted

    assert run_simulated(main()) == 60
