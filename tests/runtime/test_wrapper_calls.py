"""What a store and its wrappers are asked: a step's crash points reach a store that
observes them (a wrapper with its own `around`, `FaultyStore`) and, on one that does not
(every backend), cost no call at all; an operation a wrapper passes goes to the store it
wraps without its `around`."""

from __future__ import annotations

import uuid
from collections import Counter
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from procstore import Context, Procedure, ProcedureWithId, Status
from procstore.store import StateStore, WrappingStore, open_state_store
from procstore.store.memory import MemoryStore
from tests.support import manager_for

T = TypeVar("T")


class MarksItsSteps(Procedure):
    """Two steps, each with a crash point of its own."""

    type_name = "tests::MarksItsSteps"

    def __init__(self, data: str = "0") -> None:
        self.step = int(data)

    def dump(self) -> str:
        return str(self.step)

    async def execute(self, ctx: Context) -> Status:
        await ctx.crash_point(f"in-step-{self.step}")
        self.step += 1
        return Status.done() if self.step == 2 else Status.executing()


class CountingCrashPoints(WrappingStore):
    """A wrapper with its own `around`: it sees every operation, crash points included."""

    def __init__(self, inner: StateStore) -> None:
        super().__init__(inner)
        self.crash_points: list[str] = []

    async def around(self, kind: str, key: str, call: Callable[[], Awaitable[T]], value: bytes | None = None) -> T:
        if kind == "crash_point":
            self.crash_points.append(key)
        return await call()


class IgnoresCrashPoints(MemoryStore):
    """A backend that says crash points do nothing here, and counts the calls it gets anyway."""

    observes_crash_points = False

    def __init__(self, name: str) -> None:
        super().__init__(name)
        self.calls: Counter[str] = Counter()

    async def crash_point(self, key: str) -> None:
        self.calls[key] += 1


async def run_marks_its_steps(store: StateStore) -> None:
    async with manager_for(store, MarksItsSteps) as manager:
        await (await manager.submit(ProcedureWithId.new(MarksItsSteps()))).wait()


async def test_a_wrapper_with_its_own_around_sees_every_crash_point_and_attempt() -> None:
    store = CountingCrashPoints(open_state_store(f"memory://{uuid.uuid4().hex}/"))
    assert store.observes_crash_points
    await run_marks_its_steps(store)
    names = [key.split("/", 1)[1] for key in store.crash_points]
    assert names == ["1/#attempt", "1/in-step-0", "2/#attempt", "2/in-step-1"]


async def test_a_store_that_does_not_observe_crash_points_gets_no_call_for_them() -> None:
    store = IgnoresCrashPoints(uuid.uuid4().hex)
    await run_marks_its_steps(store)
    assert store.calls == Counter()


def test_a_backend_that_overrides_crash_point_observes_them_unless_it_says_otherwise() -> None:
    class Observing(MemoryStore):
        async def crash_point(self, key: str) -> None:
            pass

    assert Observing("x").observes_crash_points
    assert not IgnoresCrashPoints("x").observes_crash_points
    assert not open_state_store(f"memory://{uuid.uuid4().hex}/").observes_crash_points
    store: Any = CountingCrashPoints(Observing("y"))
    assert store.observes_crash_points


class OverridesCrashPoint(WrappingStore):
    """A wrapper that observes crash points by overriding `crash_point` itself, not `around`."""

    def __init__(self, inner: StateStore) -> None:
        super().__init__(inner)
        self.crash_points: list[str] = []

    async def crash_point(self, key: str) -> None:
        self.crash_points.append(key)


async def test_a_wrapper_that_overrides_crash_point_sees_every_crash_point() -> None:
    store = OverridesCrashPoint(open_state_store(f"memory://{uuid.uuid4().hex}/"))
    assert store.observes_crash_points
    await run_marks_its_steps(store)
    names = [key.split("/", 1)[1] for key in store.crash_points]
    assert names == ["1/#attempt", "1/in-step-0", "2/#attempt", "2/in-step-1"]


class PassesReads(WrappingStore):
    """A wrapper with nothing to do for reads: says so, and counts what reaches `around`."""

    def __init__(self, inner: StateStore) -> None:
        super().__init__(inner)
        self.kinds: Counter[str] = Counter()

    def passes(self, kind: str) -> bool:
        return kind == "get"

    async def around(self, kind: str, key: str, call: Callable[[], Awaitable[T]], value: bytes | None = None) -> T:
        self.kinds[kind] += 1
        return await call()


async def test_a_wrapper_that_passes_an_operation_is_not_asked_around_it() -> None:
    store = PassesReads(open_state_store(f"memory://{uuid.uuid4().hex}/"))
    await store.put("a", b"1")
    assert await store.get("a") == b"1"
    assert await store.get("missing") is None
    assert store.kinds == Counter({"put": 1})
