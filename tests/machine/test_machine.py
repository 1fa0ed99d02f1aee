"""`procstore.machine`: tagged states, validated decoding, durations, and state replacement."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from procstore import ProcedureWithId, RetryLater, Status
from procstore.machine import (
    DuplicateStateName,
    Duration,
    MachineContext,
    MachineDataError,
    State,
    StateMachine,
    StateRegistry,
)
from tests.support import StoreTarget

registry = StateRegistry("demo_state", machine="test::Counter")


class Mode(enum.Enum):
    FAST = "fast"
    SLOW = "slow"


@dataclass
class Peer:
    id: int
    addr: str = ""


@dataclass
class Persistent:
    name: str
    peer: Peer
    timeout: Duration = field(default_factory=lambda: Duration(seconds=10))
    mode: Mode = Mode.FAST
    tags: list[str] = field(default_factory=list)
    limits: dict[str, int] = field(default_factory=dict)
    note: str | None = None


@dataclass
class Volatile:
    calls: int = 0
    fail_next: bool = False


Ctx = MachineContext[Persistent, Volatile]


@registry.state
@dataclass
class Start(State[Ctx]):
    async def next(self, ctx: Ctx) -> tuple[State[Ctx], Status]:
        ctx.volatile.calls += 1
        return Count(0), Status.executing()


@registry.state
@dataclass
class Count(State[Ctx]):
    n: int

    async def next(self, ctx: Ctx) -> tuple[State[Ctx], Status]:
        ctx.volatile.calls += 1
        if ctx.volatile.fail_next:
            ctx.volatile.fail_next = False
            raise RetryLater("flaky")
        if self.n + 1 >= 3:
            return Finish(Mode.SLOW), Status.executing()
        return Count(self.n + 1), Status.executing()


@registry.state
@dataclass
class Finish(State[Ctx]):
    mode: Mode

    async def next(self, ctx: Ctx) -> tuple[State[Ctx], Status]:
        return self, Status.done(ctx.persistent.name)


class Counter(StateMachine[Persistent, Volatile]):
    type_name = "test::Counter"
    states = registry
    persistent_type = Persistent

    @classmethod
    def initial_state(cls) -> State[Ctx]:
        return Start()


def factory(persistent: Persistent) -> Volatile:
    return Volatile()


def test_dump_shape_with_tag_first() -> None:
    machine = Counter.create(Persistent("a", Peer(1)), factory)
    assert machine.dump() == (
        '{"persistent_ctx":{"name":"a","peer":{"id":1,"addr":""},"timeout":"10s","mode":"fast",'
        '"tags":[],"limits":{},"note":null},"state":{"demo_state":"Start"}}'
    )
    machine.state = Count(2)
    assert machine.dump().endswith('"state":{"demo_state":"Count","n":2}}')


def test_round_trip() -> None:
    machine = Counter.create(Persistent("a", Peer(1, "x"), Duration(minutes=1), Mode.SLOW, ["t"], {"k": 1}), factory)
    machine.state = Finish(Mode.SLOW)
    persistent, state = Counter.decode(machine.dump())
    assert persistent == machine.persistent and state == Finish(Mode.SLOW)


def test_old_data_with_fewer_fields_loads_with_defaults() -> None:
    old = '{"persistent_ctx":{"name":"a","peer":{"id":1}},"state":{"demo_state":"Count","n":1}}'
    persistent, state = Counter.decode(old)
    assert persistent == Persistent("a", Peer(1, ""), Duration(seconds=10))
    assert state == Count(1)


def test_externally_tagged_single_field_state() -> None:
    _, state = Counter.decode('{"persistent_ctx":{"name":"a","peer":{"id":1}},"state":{"Finish":"slow"}}')
    assert state == Finish(Mode.SLOW)


@pytest.mark.parametrize(
    ("data", "fragments"),
    [
        ('{"persistent_ctx":{"name":"a","peer":{"id":1}},"state":{"demo_state":"Nope"}}',
         ["test::Counter", "state.demo_state", "'Nope'", "Count, Finish, Start"]),
        ('{"persistent_ctx":{"name":"a","peer":{"id":"1"}},"state":{"demo_state":"Start"}}',
         ["test::Counter", "persistent_ctx.peer.id", "Expected `int`, got `str`"]),
        ('{"persistent_ctx":{"peer":{"id":1}},"state":{"demo_state":"Start"}}',
         ["persistent_ctx", "missing required field `name`"]),
        ('{"persistent_ctx":{"name":"a","peer":{"id":1},"mode":"warp"},"state":{"demo_state":"Start"}}',
         ["persistent_ctx.mode", "Invalid enum value 'warp'"]),
        ('{"persistent_ctx":{"name":"a","peer":{"id":1},"timeout":"10 parsecs"},"state":{"demo_state":"Start"}}',
         ["persistent_ctx.timeout", "unknown unit"]),
        ('{"persistent_ctx":{"name":"a","peer":{"id":1}},"state":{"demo_state":"Count"}}',
         ["state", "missing required field `n`"]),
        ('{"persistent_ctx":{"name":"a","peer":{"id":1}},"state":{"demo_state":"Count","n":[1]}}',
         ["state.n", "Expected `int`, got `array`"]),
        ('{"state":{"demo_state":"Start"}}', ["persistent_ctx", "missing"]),
        ('{"persistent_ctx":{"name":"a","peer":{"id":1}},"state":{"x":1,"y":2}}', ["no 'demo_state' tag"]),
        ("not json", ["not JSON"]),
    ],
)  # fmt: skip
def test_decode_errors_name_machine_and_field(data: str, fragments: list[str]) -> None:
    with pytest.raises(MachineDataError) as info:
        Counter.decode(data)
    for fragment in fragments:
        assert fragment in str(info.value), str(info.value)


def test_duplicate_state_name_fails_at_definition() -> None:
    reg = StateRegistry("t")

    @reg.state
    @dataclass
    class A(State[Any]):
        async def next(self, ctx: Any) -> tuple[State[Any], Status]:
            raise NotImplementedError

    with pytest.raises(DuplicateStateName, match="'A'"):

        @reg.state
        @dataclass
        class A(State[Any]):  # type: ignore[no-redef]
            async def next(self, ctx: Any) -> tuple[State[Any], Status]:
                raise NotImplementedError


@pytest.mark.parametrize(
    ("text", "value"),
    [("10s", timedelta(seconds=10)), ("1m 30s", timedelta(seconds=90)), ("250ms", timedelta(milliseconds=250)),
     ("2h", timedelta(hours=2)), ("1d 1ns", timedelta(days=1)), ("0s", timedelta())],
)  # fmt: skip
def test_duration_text(text: str, value: timedelta) -> None:
    assert Duration.parse(text) == value


@given(st.integers(min_value=0, max_value=10**15))
def test_duration_round_trip(microseconds: int) -> None:
    value = Duration(microseconds=microseconds)
    assert Duration.parse(value.format()) == value


async def test_state_is_replaced_only_when_next_returns(memory_target: StoreTarget) -> None:
    from procstore import ProcedureManager

    volatiles: list[Volatile] = []

    def tracking_factory(persistent: Persistent) -> Volatile:
        volatiles.append(Volatile(fail_next=True))
        return volatiles[-1]

    manager = ProcedureManager(memory_target.url, retry_delay=0.001)
    Counter.register_with(manager, tracking_factory)
    async with manager:
        machine = Counter.create(Persistent("done!", Peer(1)), tracking_factory)
        watcher = await manager.submit(ProcedureWithId.new(machine))
        assert await watcher.wait() == "done!"
    # Start, Count(0) failed once then ran, Count(1), Count(2), Finish: the failed call
    # left the state unchanged, so Count(0) ran again rather than being skipped.
    assert volatiles[0].calls == 5
    assert machine.state == Finish(Mode.SLOW)
