"""Simulated time and seeded schedules: fast, and the same seed replays the same interleaving."""

from __future__ import annotations

import asyncio
import uuid

import pytest

from procstore import Context, Procedure, ProcedureManager, ProcedureWithId, Status, StringKey
from procstore.testing import run_simulated
from procstore.testing.simulation import SimulatedLoop

COUNTERS: dict[str, int] = {}
ORDER: list[str] = []


class Increment(Procedure):
    """Reads a shared counter, yields (a request to another service, say), writes it back.

    The planted bug: without `careful`, two of these interleaving between the read and the
    write lose an update. Only some interleavings show it.
    """

    type_name = "tests::Increment"
    careful = False

    def __init__(self, name: str = "") -> None:
        self.name = name

    async def execute(self, ctx: Context) -> Status:
        if self.careful:
            async with ctx.provider.acquire_lock(StringKey.exclusive("counter")):
                return await self._increment()
        return await self._increment()

    async def _increment(self) -> Status:
        for _ in range(3 * "abc".index(self.name)):  # staggered: in FIFO order, no overlap
            await asyncio.sleep(0)
        seen = COUNTERS.get("n", 0)
        await asyncio.sleep(0)
        COUNTERS["n"] = seen + 1
        ORDER.append(self.name)
        return Status.done()

    def dump(self) -> str:
        return self.name

    @classmethod
    def load(cls, data: str) -> Increment:
        return cls(data)


class CarefulIncrement(Increment):
    careful = True


async def three_increments(cls: type[Increment]) -> tuple[int, list[str]]:
    COUNTERS.clear()
    ORDER.clear()
    manager = ProcedureManager(f"memory://sim-{uuid.uuid4().hex}/")
    manager.register_loader(Increment.type_name, cls.load)
    async with manager:
        watchers = await asyncio.gather(*(manager.submit(ProcedureWithId.new(cls(name))) for name in "abc"))
        await asyncio.gather(*(w.wait() for w in watchers))
    return COUNTERS["n"], list(ORDER)


def test_a_seed_replays_its_interleaving_and_some_seed_finds_the_lost_update() -> None:
    runs = {seed: run_simulated(three_increments(Increment), seed=seed) for seed in range(30)}
    assert {seed: run_simulated(three_increments(Increment), seed=seed) for seed in range(30)} == runs
    lost = [seed for seed, (n, _) in runs.items() if n != 3]
    assert lost, "no seed interleaved the read and the write"
    assert len({tuple(order) for _, order in runs.values()}) > 1  # seeds try other orders
    for seed in range(30):
        assert run_simulated(three_increments(CarefulIncrement), seed=seed)[0] == 3


def test_simulated_time_skips_the_waits() -> None:
    async def sleepy() -> float:
        loop = asyncio.get_running_loop()
        start = loop.time()
        await asyncio.sleep(3600)
        return loop.time() - start

    # An hour in the loop's time; in real time well within the test timeout (120 s).
    assert run_simulated(sleepy()) == 3600


def test_a_lease_expires_in_virtual_time() -> None:
    """A 60 s lease, its holder killed: the standby takes over at once in real time, after
    the TTL in the loop's time."""
    from procstore import Lease
    from procstore.testing import kill_manager

    async def takeover() -> float:
        url = f"memory://sim-{uuid.uuid4().hex}/"
        first = ProcedureManager(url, lease=Lease(ttl=60.0, holder="cp-1"))
        second = ProcedureManager(url, lease=Lease(ttl=60.0, holder="cp-2"))
        await first.start()
        await second.start()
        assert first.is_leader and not second.is_leader
        loop = asyncio.get_running_loop()
        killed_at = loop.time()
        await kill_manager(first)
        await second.wait_until_leading()
        waited = loop.time() - killed_at
        await second.stop()
        await first.stop()
        return waited

    # A minute of TTL in the loop's time; the test timeout bounds the real time.
    assert run_simulated(takeover(), seed=3) >= 60.0


def test_a_loop_whose_base_init_fails_closes_without_an_error_of_its_own(monkeypatch: pytest.MonkeyPatch) -> None:
    import gc
    import selectors
    import sys

    def no_selector() -> selectors.BaseSelector:
        raise OSError("too many open files")

    errors: list[BaseException | None] = []
    monkeypatch.setattr(sys, "unraisablehook", lambda unraisable: errors.append(unraisable.exc_value))
    monkeypatch.setattr(selectors, "DefaultSelector", no_selector)
    with pytest.raises(OSError, match="too many open files"):
        SimulatedLoop(seed=1)
    gc.collect()  # the half-made loop's __del__ calls close()
    assert not [e for e in errors if "_saved_" in str(e) or "_schedule" in str(e)], errors
