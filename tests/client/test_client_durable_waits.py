"""`Client.get` says that a procedure sleeps in a durable timer (its stored step's wait)."""

from __future__ import annotations

import asyncio
import random
import uuid

import pytest

from procstore import (
    Client,
    Context,
    OperationRefused,
    Procedure,
    ProcedureId,
    ProcedureManager,
    ProcedureNotFound,
    ProcedureWithId,
    Status,
    StoreError,
)
from procstore.testing import Armed, MemoryStore, Process, ProcessStore
from tests.support import StoreTarget, manager_for, store_targets

target = store_targets("memory", "local")


class Naps(Procedure):
    """Sleeps an hour after its first step."""

    type_name = "tests::Naps"

    def __init__(self, data: str = "") -> None:
        self.slept = data == "slept"

    async def execute(self, ctx: Context) -> Status:
        if self.slept:
            return Status.done()
        self.slept = True
        return Status.sleep(3600)

    def dump(self) -> str:
        return "slept" if self.slept else ""

    @classmethod
    def load(cls, data: str) -> Naps:
        return cls(data)


async def test_a_sleeping_procedure_says_so(target: StoreTarget) -> None:
    async with manager_for(target, Naps) as manager, Client(target.url, target.storage_options) as client:
        procedure = ProcedureWithId.new(Naps())
        await manager.submit(procedure)
        statuses = []

        async def sleeping() -> bool:
            statuses.append(await client.get(procedure.id))
            return statuses[-1].waiting is not None

        for _ in range(500):
            if await sleeping():
                break
            await asyncio.sleep(0.01)
        status = statuses[-1]
        assert status.waiting is not None and status.waiting.startswith("sleeping until"), status
        assert (status.status, status.doing) == ("unfinished", "sleeping")


class AwaitsGo(Procedure):
    """Waits for the signal `go`, then ends with its payload."""

    type_name = "tests::AwaitsGo"

    def __init__(self, data: str = "") -> None:
        self.waited = data == "waited"

    async def execute(self, ctx: Context) -> Status:
        if self.waited:
            return Status.done(ctx.signals.get("go"))
        self.waited = True
        return Status.wait_for_signal("go")

    def dump(self) -> str:
        return "waited" if self.waited else ""

    @classmethod
    def load(cls, data: str) -> AwaitsGo:
        return cls(data)


async def test_a_client_signals_a_waiting_procedure_and_is_refused_for_an_ended_or_unknown_one(
    target: StoreTarget,
) -> None:
    async with (
        manager_for(target, AwaitsGo, request_poll_interval=0.05) as manager,
        Client(target.url, target.storage_options) as client,
    ):
        procedure = ProcedureWithId.new(AwaitsGo())
        watcher = await manager.submit(procedure)
        await client.signal(procedure.id, "go", {"region": 7})
        assert await asyncio.wait_for(watcher.wait(), 10) == {"region": 7}
        with pytest.raises(OperationRefused, match="has ended"):
            await client.signal(procedure.id, "go")
        with pytest.raises(ProcedureNotFound):
            await client.signal(ProcedureId.random(), "go")
        with pytest.raises(TypeError):
            await client.signal(procedure.id, "go", object())


async def test_a_signal_whose_answer_is_lost_is_a_store_error_not_a_refusal() -> None:
    """Found by the cluster simulation: the write landed, its answer was lost, and the
    client said `OperationRefused` (nothing written) for a signal the procedure received."""
    name = f"client-signal-lost-{uuid.uuid4().hex[:8]}"
    store = MemoryStore(name)
    try:
        async with ProcedureManager(store, request_poll_interval=0.05) as manager:
            manager.register(AwaitsGo)
            procedure = ProcedureWithId.new(AwaitsGo())
            watcher = await manager.submit(procedure)
            sender = Process("sender", [], random.Random(0))
            sender.armed.append(Armed("lost", 1, match="requests/signals/"))
            async with Client(ProcessStore(store, sender)) as client:
                with pytest.raises(StoreError) as raised:
                    await client.signal(procedure.id, "go", {"region": 7})
            assert not isinstance(raised.value, OperationRefused)
            assert await asyncio.wait_for(watcher.wait(), 10) == {"region": 7}
    finally:
        MemoryStore.forget(name)
