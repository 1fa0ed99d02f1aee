"""A submitted procedure's first write and its run are one task: no task for the write and
another for the run (the submit's caller is answered once the write is stored)."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from procstore import Context, ProcedureWithId, Status
from procstore.store import StateStore, WrappingStore, open_state_store
from tests.procedures import LabelledSteps
from tests.support import manager_for

T = TypeVar("T")

TASKS: dict[str, list[asyncio.Task[Any] | None]] = {}
"""The task of each write and step of a procedure, by its label."""


class InItsTask(LabelledSteps):
    type_name = "tests::InItsTask"

    async def execute(self, ctx: Context) -> Status:
        TASKS.setdefault(self.label, []).append(asyncio.current_task())
        self.step += 1
        return Status.done() if self.step == 2 else Status.executing()


class NotesWritingTasks(WrappingStore):
    def __init__(self, inner: StateStore) -> None:
        super().__init__(inner)
        self.first_writes: list[asyncio.Task[Any] | None] = []

    async def around(self, kind: str, key: str, call: Callable[[], Awaitable[T]], value: bytes | None = None) -> T:
        if kind == "put_if_absent" and key.endswith("/0000000000.step"):
            self.first_writes.append(asyncio.current_task())
        return await call()


async def test_the_first_write_and_every_step_run_in_one_task() -> None:
    label = uuid.uuid4().hex
    store = NotesWritingTasks(open_state_store(f"memory://{label}/"))
    async with manager_for(store, InItsTask) as manager:
        watcher = await manager.submit(ProcedureWithId.new(InItsTask(f"{label}:0")))
        assert watcher.state.kind.name in ("RUNNING", "DONE")
        await watcher.wait()
    [write] = store.first_writes
    assert write is not None and write is not asyncio.current_task()
    assert TASKS[label] == [write, write]
