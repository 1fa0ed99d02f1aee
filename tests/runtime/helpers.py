"""Small helpers for runtime tests."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, TypeVar

from procstore import ProcedureId, ProcedureManager, ProcedureState, ProcedureWithId
from procstore.store import StateStore
from procstore.testing import Fault, FaultyStore
from tests.procedures import BLOCKERS, Steps, World

T = TypeVar("T")


def steps(world: World, n: int = 3, **data: Any) -> ProcedureWithId:
    return ProcedureWithId.new(Steps({"world": world.name, "steps": n, **data}))


def blocker() -> tuple[str, asyncio.Event]:
    name = uuid.uuid4().hex
    BLOCKERS[name] = asyncio.Event()
    return name, BLOCKERS[name]


async def wait_for_state(manager: ProcedureManager, pid: ProcedureId, timeout: float = 10.0) -> ProcedureState:
    """Wait until the procedure has ended and return its final state."""

    async def ended() -> ProcedureState:
        while True:
            state = manager.procedure_state(pid)
            if state is not None and state.is_ended():
                return state
            await asyncio.sleep(0.005)

    return await asyncio.wait_for(ended(), timeout)


async def eventually(predicate: Any, timeout: float = 10.0) -> None:
    async def poll() -> None:
        while not predicate():
            await asyncio.sleep(0.005)

    await asyncio.wait_for(poll(), timeout)


class HeldOnce(FaultyStore):
    """A `FaultyStore` (with `faults`) whose first operation of `kind` on a key starting with
    `prefix` waits for `release`; `reached` is set when it begins to wait."""

    def __init__(self, inner: StateStore, kind: str, prefix: str, faults: Sequence[Fault] = ()) -> None:
        super().__init__(inner, faults=faults)
        self.kind, self.prefix = kind, prefix
        self.reached = asyncio.Event()
        self.release = asyncio.Event()

    async def around(self, kind: str, key: str, call: Callable[[], Awaitable[T]], value: bytes | None = None) -> T:
        if kind == self.kind and key.startswith(self.prefix) and not self.reached.is_set():
            self.reached.set()
            await self.release.wait()
        return await super().around(kind, key, call, value)
