"""Small helpers for runtime tests."""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

from procstore import ProcedureId, ProcedureManager, ProcedureState, ProcedureWithId
from tests.procedures import BLOCKERS, Steps, World


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
