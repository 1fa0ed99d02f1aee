"""`StateMachine`: a procedure written as typed states (the region-migration style).

A machine holds a persistent context (a dataclass, stored with the state), a volatile
context (rebuilt by a factory after every load, never stored) and its current state. Each
`execute` runs `state.next(ctx)`; the state is replaced only when `next` returns, so an
exception leaves it as it was and the same step runs again on retry or after recovery.

Stored form: `{"persistent_ctx": {...}, "state": {TAG: "StateName", ...fields}}`.
"""

from __future__ import annotations

import abc
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar, Generic, Self, TypeVar

import orjson

from procstore._runtime.manager import ProcedureManager
from procstore.machine.codec import MachineDataError, convert, dumps, to_builtins
from procstore.machine.registry import StateRegistry
from procstore.procedure import Context, Procedure, Status

C = TypeVar("C")
P = TypeVar("P")
V = TypeVar("V")


class State(abc.ABC, Generic[C]):
    """One state of a machine: a dataclass whose `next` performs one step.

    `next` returns the state to move to and the `Status` for the runtime (persist, suspend
    on subprocedures, or done). Raise `RetryLater` for transient failures.
    """

    @abc.abstractmethod
    async def next(self, ctx: C) -> tuple[State[C], Status]:
        """Run this state's step; must be safe to run again after a crash."""


@dataclass(slots=True)
class MachineContext(Generic[P, V]):
    """What a state's `next` sees: the stored context, the volatile one, and the runtime's."""

    persistent: P
    volatile: V
    procedure: Context | None = None
    """The runtime's context for the current call (id, provider, `is_retrying`)."""

    @property
    def runtime(self) -> Context:
        if self.procedure is None:
            raise RuntimeError("the machine is not running: no runtime context yet")
        return self.procedure


VolatileFactory = Callable[[P], V]


class StateMachine(Procedure, Generic[P, V]):
    """Base class of typed state machines. Subclasses set:

    - `type_name`: the procedure type (the loader's key);
    - `states`: the `StateRegistry` of its states;
    - `persistent_type`: the dataclass of its persistent context.

    Build one with `Machine.create(persistent, factory)`; register its loader with
    `Machine.register_with(manager, factory)`, where `factory(persistent)` builds the
    volatile context.
    """

    states: ClassVar[StateRegistry]
    persistent_type: ClassVar[type[Any]]

    def __init__(self, persistent: P, state: State[MachineContext[P, V]], volatile: V) -> None:
        self.context: MachineContext[P, V] = MachineContext(persistent, volatile)
        self.state = state

    @classmethod
    def initial_state(cls) -> State[MachineContext[P, V]]:
        """The state a new machine starts in; override in the subclass."""
        raise NotImplementedError(f"{cls.__qualname__} must define initial_state()")

    @classmethod
    def create(
        cls, persistent: P, factory: VolatileFactory[P, V], state: State[MachineContext[P, V]] | None = None
    ) -> Self:
        return cls(persistent, state if state is not None else cls.initial_state(), factory(persistent))

    @property
    def persistent(self) -> P:
        return self.context.persistent

    @property
    def volatile(self) -> V:
        return self.context.volatile

    async def execute(self, ctx: Context) -> Status:
        self.context.procedure = ctx
        next_state, status = await self.state.next(self.context)
        self.state = next_state
        return status

    def dump(self) -> str:
        return dumps({"persistent_ctx": to_builtins(self.context.persistent), "state": self.states.dump(self.state)})

    @classmethod
    def decode(cls, data: str) -> tuple[P, State[MachineContext[P, V]]]:
        """Parse stored data; raises `MachineDataError` naming the machine and the field."""
        machine = cls.type_name
        try:
            obj = orjson.loads(data)
        except orjson.JSONDecodeError as e:
            raise MachineDataError(machine, "$", f"not JSON: {e}") from None
        if not isinstance(obj, dict):
            raise MachineDataError(machine, "$", f"expected an object, got {type(obj).__name__}")
        for key in ("persistent_ctx", "state"):
            if key not in obj:
                raise MachineDataError(machine, key, "missing")
        persistent = convert(obj["persistent_ctx"], cls.persistent_type, machine=machine, field="persistent_ctx")
        state: State[MachineContext[P, V]] = cls.states.load(obj["state"])
        return persistent, state

    @classmethod
    def loader(cls, factory: VolatileFactory[P, V]) -> Callable[[str], Self]:
        """The loader to register: decodes, then rebuilds the volatile context with `factory`."""

        def load_machine(data: str) -> Self:  # type: ignore[type-var] # Self is bound by `cls`
            persistent, state = cls.decode(data)
            return cls(persistent, state, factory(persistent))

        return load_machine

    @classmethod
    def register_with(cls, manager: ProcedureManager, factory: VolatileFactory[P, V]) -> None:
        manager.register_loader(cls.type_name, cls.loader(factory))

    @classmethod
    def load(cls, data: str) -> Self:
        raise TypeError(
            f"{cls.__qualname__} needs its volatile-context factory to load: register it with "
            f"{cls.__qualname__}.register_with(manager, factory)"
        )
