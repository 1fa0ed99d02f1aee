"""Locks: `KeyRwLock` semantics, procedures serialised by their keys, and step-scoped locks."""

from __future__ import annotations

import asyncio
import json

import pytest

from procstore import Context, LockKey, ProcedureWithId, Status, StringKey
from procstore._runtime import KeyRwLock
from tests.procedures import JsonProcedure, World
from tests.runtime.helpers import blocker, eventually, steps
from tests.support import StoreTarget, manager_for


def test_lock_key_sorts_dedupes_and_prefers_exclusive() -> None:
    key = LockKey([StringKey.share("b"), StringKey.exclusive("a"), StringKey.share("a"), StringKey.share("b")])
    assert list(key) == [StringKey.exclusive("a"), StringKey.share("b")]
    assert LockKey([StringKey.share("x")]).conflicts_with(LockKey([StringKey.share("x")])) == []
    assert LockKey([StringKey.share("x")]).conflicts_with(LockKey([StringKey.exclusive("x")])) == ["x"]


def test_lock_key_checks_one_key_as_it_checks_many() -> None:
    """A single key is taken as it is given only when it is a plain `StringKey` of a string:
    an unhashable name, or a list subclass whose `len` differs from what it iterates, is
    checked as several keys are."""
    with pytest.raises(TypeError, match="unhashable"):
        LockKey([StringKey(["t"], StringKey.exclusive("t").mode)])  # type: ignore[arg-type]

    class Lying(list[StringKey]):
        def __iter__(self):  # type: ignore[no-untyped-def]
            return iter([StringKey.share("b"), StringKey.exclusive("a"), "junk"])

    with pytest.raises(TypeError, match="junk"):
        LockKey(Lying([StringKey.share("b")]))
    assert LockKey(()).keys_to_lock() == () and LockKey([StringKey.share("b")]).keys_to_lock() == (
        StringKey.share("b"),
    )


async def test_shared_holders_coexist_and_exclusive_waits() -> None:
    lock = KeyRwLock()
    await lock.acquire(StringKey.share("k"))
    await lock.acquire(StringKey.share("k"))
    writer = asyncio.ensure_future(lock.acquire(StringKey.exclusive("k")))
    await asyncio.sleep(0)
    assert not writer.done()
    lock.release(StringKey.share("k"))
    await asyncio.sleep(0)
    assert not writer.done()
    lock.release(StringKey.share("k"))
    await writer
    lock.release(StringKey.exclusive("k"))
    assert len(lock) == 0


async def test_waiters_are_served_in_order_and_writers_do_not_starve() -> None:
    lock = KeyRwLock()
    order: list[str] = []
    await lock.acquire(StringKey.share("k"))

    async def take(name: str, key: StringKey) -> None:
        async with lock.hold(key):
            order.append(name)
            await asyncio.sleep(0)

    tasks = [
        asyncio.ensure_future(take("w1", StringKey.exclusive("k"))),
        asyncio.ensure_future(take("r1", StringKey.share("k"))),
        asyncio.ensure_future(take("w2", StringKey.exclusive("k"))),
    ]
    await asyncio.sleep(0)
    lock.release(StringKey.share("k"))
    await asyncio.gather(*tasks)
    assert order == ["w1", "r1", "w2"]
    assert len(lock) == 0


async def test_cancelled_waiter_takes_nothing() -> None:
    lock = KeyRwLock()
    await lock.acquire(StringKey.exclusive("k"))
    waiter = asyncio.ensure_future(lock.acquire(StringKey.exclusive("k")))
    await asyncio.sleep(0)
    waiter.cancel()
    await asyncio.gather(waiter, return_exceptions=True)
    lock.release(StringKey.exclusive("k"))
    assert len(lock) == 0


async def test_procedures_with_the_same_exclusive_key_run_one_at_a_time(memory_target: StoreTarget) -> None:
    world = World.new()
    name, gate = blocker()
    async with manager_for(memory_target) as manager:
        first = await manager.submit(steps(world, 2, name="first", exclusive=["table/1"], block=name))
        second = await manager.submit(steps(world, 2, name="second", exclusive=["table/1"]))
        reader = await manager.submit(steps(world, 1, name="reader", share=["catalog"]))
        await reader.wait()
        await asyncio.sleep(0.02)
        assert not second.state.is_ended() and world.counts["second/0"] == 0
        gate.set()
        await first.wait()
        await second.wait()
    assert world.log.index("first/1") < world.log.index("second/0")


async def test_opposite_key_orders_do_not_deadlock(memory_target: StoreTarget) -> None:
    world = World.new()
    async with manager_for(memory_target) as manager:
        watchers = [
            await manager.submit(steps(world, 3, name=f"p{i}", exclusive=["a", "b"] if i % 2 else ["b", "a"]))
            for i in range(10)
        ]
        await asyncio.wait_for(asyncio.gather(*(w.wait() for w in watchers)), 10)


class UsesStepLock(JsonProcedure):
    """Holds a step-scoped exclusive lock while it increments a shared counter non-atomically."""

    type_name = "test::UsesStepLock"

    async def execute(self, ctx: Context) -> Status:
        async with ctx.provider.acquire_lock(StringKey.exclusive("counter")):
            world = self.world
            value = world.counts["counter"]
            await asyncio.sleep(0.001)
            world.counts["counter"] = value + 1
        return Status.done()


async def test_acquire_lock_within_a_step(memory_target: StoreTarget) -> None:
    world = World.new()
    manager = manager_for(memory_target)
    manager.register(UsesStepLock)
    async with manager:
        watchers = [await manager.submit(ProcedureWithId.new(UsesStepLock({"world": world.name}))) for _ in range(20)]
        await asyncio.gather(*(w.wait() for w in watchers))
    assert world.counts["counter"] == 20


async def test_locks_are_released_when_a_procedure_fails(memory_target: StoreTarget) -> None:
    world = World.new()
    async with manager_for(memory_target) as manager:
        failing = await manager.submit(steps(world, 2, name="bad", fail_at=0, exclusive=["t"]))
        after = await manager.submit(steps(world, 1, name="after", exclusive=["t"]))
        await eventually(lambda: failing.state.is_ended())
        assert await after.wait() == "after done"
    assert json.dumps(sorted(world.effects)) == '["after/0"]'


async def test_cancelled_waiter_behind_a_release_in_the_same_tick() -> None:
    """A waiter cancelled in the same loop tick as the holder's release (as `stop()` does to
    every runner at once) must neither take the lock nor break the queue."""
    lock = KeyRwLock()
    await lock.acquire(StringKey.exclusive("k"))
    first = asyncio.ensure_future(lock.acquire(StringKey.exclusive("k")))
    second = asyncio.ensure_future(lock.acquire(StringKey.exclusive("k")))
    await asyncio.sleep(0)
    first.cancel()
    lock.release(StringKey.exclusive("k"))  # the head was cancelled: `second` gets it
    await asyncio.gather(first, return_exceptions=True)
    await asyncio.wait_for(second, 1)
    assert lock.would_block(StringKey.exclusive("k"))  # `second` holds it
    lock.release(StringKey.exclusive("k"))
    assert len(lock) == 0


async def test_stop_with_many_procedures_waiting_on_locks(memory_target: StoreTarget) -> None:
    world = World.new()
    name, gate = blocker()
    manager = manager_for(memory_target)
    await manager.start()
    for i in range(10):
        await manager.submit(steps(world, 2, name=f"p{i}", exclusive=["t"], block=name))
    await asyncio.sleep(0.01)
    await manager.stop()
    gate.set()
    async with manager_for(memory_target) as second:
        await eventually(lambda: all(i.state.is_done() for i in second.list_procedures()))
        assert all(i.state.is_done() for i in second.list_procedures())
