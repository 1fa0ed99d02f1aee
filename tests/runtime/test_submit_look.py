"""A submit's first look for an operator request, sent with its create where requests are
round trips (S3, GCS), and dropped when the procedure then waits before its first attempt."""

from __future__ import annotations

import asyncio
import json
import uuid
from typing import ClassVar

import pytest

from procstore import (
    Concurrency,
    Context,
    LockKey,
    Procedure,
    ProcedureFailed,
    ProcedureManager,
    ProcedureWithId,
    RateLimit,
    Status,
    StoreError,
    StringKey,
)
from procstore.store.memory import MemoryStore
from procstore.store.requests import OperatorRequest, RequestStore


class RoundTrips(MemoryStore):
    """A memory store whose requests count as round trips; step 0's create lands only once
    a procedure's look for its request (a read of `requests/{id}.json`; the watch of
    `requests/` lists) has begun (`hold_first_create`)."""

    round_trips = True

    def __init__(self) -> None:
        super().__init__(f"submit-look-{uuid.uuid4().hex}")
        self.looked = asyncio.Event()
        self.hold_first_create = False

    async def get(self, key: str) -> bytes | None:
        if "/requests/" in f"/{key}":
            self.looked.set()
        return await super().get(key)

    async def put_if_absent(self, key: str, value: bytes) -> bool:
        if self.hold_first_create and key.endswith("/0000000000.step"):
            await asyncio.wait_for(self.looked.wait(), 5)
        return await super().put_if_absent(key, value)


class Locked(Procedure):
    """Two persisted steps under lock key `k` (`by` "lock"), or in concurrency slot `k` of
    one (`by` "slot"); the first waits for `GO` when `hold` is set. `RAN` lists the (name,
    step) of each step begun."""

    type_name = "submit_look::Locked"
    RAN: ClassVar[list[tuple[str, int]]] = []
    GO: ClassVar[asyncio.Event | None] = None

    def __init__(self, name: str, hold: bool = False, by: str = "lock", n: int = 0) -> None:
        self.name, self.hold, self.by, self.n = name, hold, by, n

    def lock_key(self) -> LockKey:
        return LockKey([StringKey.exclusive("k")] if self.by == "lock" else [])

    def concurrency(self) -> Concurrency | None:
        return Concurrency("k", 1) if self.by == "slot" else None

    async def execute(self, ctx: Context) -> Status:
        Locked.RAN.append((self.name, self.n))
        if self.hold and self.n == 0 and Locked.GO is not None:
            await Locked.GO.wait()
        self.n += 1
        return Status.done() if self.n == 2 else Status.executing(persist=True)

    def dump(self) -> str:
        return json.dumps([self.name, self.hold, self.by, self.n])

    @classmethod
    def load(cls, data: str) -> Locked:
        return cls(*json.loads(data))


async def test_a_submits_first_look_is_sent_with_its_create() -> None:
    store = RoundTrips()
    store.hold_first_create = True  # lands only once the look has begun: a look after it never would
    Locked.RAN, Locked.GO = [], None
    manager = ProcedureManager(store)
    manager.register(Locked)
    async with manager:
        watcher = await manager.submit(ProcedureWithId.new(Locked("a")))
        await asyncio.wait_for(watcher.wait(), 10)
    assert Locked.RAN == [("a", 0), ("a", 1)]


@pytest.mark.parametrize("by", ["lock", "slot"])
async def test_a_request_stored_while_a_submitted_procedure_waits_to_start_stops_its_first_step(by: str) -> None:
    """The look sent with the create is as old as the create: a procedure that waits for a
    lock or a concurrency slot looks again when it gets it, and a cancel stored meanwhile
    (unseen by the watch of `requests/`, which polls once a minute here) fails it before
    its first step."""
    store = RoundTrips()
    Locked.RAN, Locked.GO = [], asyncio.Event()
    manager = ProcedureManager(store, request_poll_interval=60)
    manager.register(Locked)
    async with manager:
        holder = await manager.submit(ProcedureWithId.new(Locked("holder", hold=True, by=by)))
        async with asyncio.timeout(5):
            while Locked.RAN != [("holder", 0)]:
                await asyncio.sleep(0.001)
        waiter_id = ProcedureWithId.new(Locked("waiter", by=by))
        waiter = await manager.submit(waiter_id)
        await RequestStore(store).put(waiter_id.id, OperatorRequest.new("cancel", f"while it waited for its {by}"))
        Locked.GO.set()
        await asyncio.wait_for(holder.wait(), 10)
        with pytest.raises(ProcedureFailed, match=f"while it waited for its {by}"):
            await asyncio.wait_for(waiter.wait(), 10)
    assert ("waiter", 0) not in Locked.RAN


class LostAnswers(RoundTrips):
    """Step 0's create lands and loses its answer while `lose` is set; while `hold` is set,
    it waits for `go` (`creating` says it began)."""

    def __init__(self) -> None:
        super().__init__()
        self.lose = self.hold = False
        self.creating, self.go = asyncio.Event(), asyncio.Event()

    async def put_if_absent(self, key: str, value: bytes) -> bool:
        if not key.endswith("/0000000000.step"):
            return await super().put_if_absent(key, value)
        if self.hold:
            self.creating.set()
            await asyncio.wait_for(self.go.wait(), 5)
        created = await super().put_if_absent(key, value)
        if self.lose:
            raise StoreError("the answer was lost", key=key)
        return created


async def test_a_request_stored_while_a_resubmit_finds_its_first_key_stops_its_first_step() -> None:
    """A submit whose create landed with its answer lost is submitted again; a cancel stored
    by another process while that create runs (the key was stored already, so the cancel
    could be) fails the procedure before its first step: the look sent with a create that
    found the key is as old as the create, and is made again."""
    store = LostAnswers()
    Locked.RAN, Locked.GO = [], None
    manager = ProcedureManager(store, request_poll_interval=60, max_retry_times=0)
    manager.register(Locked)
    async with manager:
        procedure = ProcedureWithId.new(Locked("resubmitted", by="none"))
        store.lose = True
        with pytest.raises(StoreError):
            await manager.submit(procedure)
        store.lose, store.hold = False, True
        resubmit = asyncio.ensure_future(manager.submit(procedure))
        await asyncio.wait_for(store.creating.wait(), 5)
        await asyncio.sleep(0.01)  # the look sent with it has answered: no request yet
        await RequestStore(store).put(procedure.id, OperatorRequest.new("cancel", "while it was submitted again"))
        store.go.set()
        watcher = await asyncio.wait_for(resubmit, 5)
        with pytest.raises(ProcedureFailed, match="while it was submitted again"):
            await asyncio.wait_for(watcher.wait(), 10)
    assert Locked.RAN == []


class SlowStarts(RoundTrips):
    """Writing a type's recent starts (`flow/starts/`) waits for `go`; `writing` says it began."""

    def __init__(self) -> None:
        super().__init__()
        self.writing, self.go = asyncio.Event(), asyncio.Event()

    async def put(self, key: str, value: bytes) -> None:
        if "flow/starts/" in key:
            self.writing.set()
            await asyncio.wait_for(self.go.wait(), 5)
        await super().put(key, value)


class RateLimited(Locked):
    type_name = "submit_look::RateLimited"
    rate_limit = RateLimit(100, 60)


async def test_a_request_stored_while_a_rate_limited_procedure_stores_its_start_stops_its_first_step() -> None:
    """A rate-limited procedure stores its start (a round trip) after its create and before
    its first attempt: a cancel stored by another process meanwhile, after its first key
    was, fails it before its first step (the look sent with the create is older)."""
    store = SlowStarts()
    Locked.RAN, Locked.GO = [], None
    manager = ProcedureManager(store, request_poll_interval=60)
    manager.register(RateLimited)
    async with manager:
        procedure = ProcedureWithId.new(RateLimited("limited", by="none"))
        watcher = await manager.submit(procedure)
        await asyncio.wait_for(store.writing.wait(), 5)
        await RequestStore(store).put(procedure.id, OperatorRequest.new("cancel", "while its start was stored"))
        store.go.set()
        with pytest.raises(ProcedureFailed, match="while its start was stored"):
            await asyncio.wait_for(watcher.wait(), 10)
    assert Locked.RAN == []
