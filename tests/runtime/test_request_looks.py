"""Runners' looks for their operator request, answered together when many look at once."""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import Coroutine, Sequence
from pathlib import Path
from typing import Any, ClassVar

import pytest

from procstore import Context, Procedure, ProcedureFailed, ProcedureId, ProcedureManager, ProcedureWithId, Status
from procstore._logs import current_procedure
from procstore._runtime.operator import RequestLooks
from procstore.errors import StoreUnavailable
from procstore.store.local import LocalDirStore
from procstore.store.memory import MemoryStore
from procstore.store.open import open_state_store
from procstore.store.requests import OperatorRequest, RequestStore
from procstore.testing import FaultyStore
from procstore.testing.plan import Fault
from tests.procedures import CountingProcedure
from tests.support import StoreTarget


def spawn(coro: Coroutine[Any, Any, None], name: str) -> asyncio.Task[None]:
    return asyncio.get_running_loop().create_task(coro, name=name)


class Listings(LocalDirStore):
    """Counts reads and listings; a listing can be held after it has read the folder."""

    def __init__(self, root: Path) -> None:
        super().__init__(root)
        self.gets = 0
        self.walks = 0
        self.hold: asyncio.Event | None = None
        self.fail: Exception | None = None

    async def get(self, key: str) -> bytes | None:
        self.gets += 1
        return await super().get(key)

    async def walk(self, prefix: str) -> list[str]:
        self.walks += 1
        if self.fail is not None:
            raise self.fail
        listed = await super().walk(prefix)
        if self.hold is not None:
            await self.hold.wait()  # what it shows was read before
        return listed


async def crowded(looks: RequestLooks, store: Listings) -> RequestLooks:
    """`looks` after a turn of the loop with several looks: the next ones are batched."""
    await asyncio.gather(*(looks.get(ProcedureId.random()) for _ in range(3)))
    await asyncio.sleep(0)
    store.gets = store.walks = 0
    return looks


async def test_many_looks_at_once_are_one_listing_and_each_sees_its_request(tmp_path: Path) -> None:
    store = Listings(tmp_path)
    requests = RequestStore(store)
    ids = [ProcedureId.random() for _ in range(20)]
    await requests.put(ids[3], OperatorRequest.new("cancel", "stop it"))
    looks = await crowded(RequestLooks(requests, spawn), store)
    found = await asyncio.gather(*(looks.get(pid) for pid in ids))
    assert [pid for pid, request in zip(ids, found, strict=True) if request is not None] == [ids[3]]
    assert found[3] is not None and found[3].reason == "stop it"
    assert store.walks == 1 and store.gets == 1  # the listing, then the one request listed


async def test_one_look_alone_is_one_read(tmp_path: Path) -> None:
    store = Listings(tmp_path)
    assert await RequestLooks(RequestStore(store), spawn).get(ProcedureId.random()) is None
    assert (store.walks, store.gets) == (0, 1)


async def test_looks_one_to_a_turn_read_at_once_without_a_task(tmp_path: Path) -> None:
    """A few procedures stepping (one look to a turn of the loop): each look is its own read,
    in its caller's task; a crowd of looks in one turn is batched from the next look on."""
    store = Listings(tmp_path)
    looks = RequestLooks(RequestStore(store), spawn)
    for _ in range(3):
        assert await looks.get(ProcedureId.random()) is None
        await asyncio.sleep(0)
        assert looks._look is None
    assert (store.walks, store.gets) == (0, 3)
    await crowded(looks, store)
    await asyncio.gather(*(looks.get(ProcedureId.random()) for _ in range(5)))
    assert store.walks == 1


async def test_a_look_asked_for_during_a_listing_waits_for_the_next_one(tmp_path: Path) -> None:
    """The listing under way began before the request was stored: it cannot answer a look
    asked for after that, which must see the request."""
    store = Listings(tmp_path)
    requests = RequestStore(store)
    looks = await crowded(RequestLooks(requests, spawn), store)
    late = ProcedureId.random()
    store.hold = asyncio.Event()
    first = asyncio.gather(looks.get(ProcedureId.random()), looks.get(ProcedureId.random()))
    while store.walks == 0:
        await asyncio.sleep(0.001)
    await requests.put(late, OperatorRequest.new("fail", "too late for that listing"))
    asking = asyncio.ensure_future(looks.get(late))
    await asyncio.sleep(0.01)
    store.hold.set()
    assert list(await first) == [None, None]
    request = await asyncio.wait_for(asking, 5)
    assert request is not None and request.kind == "fail"


async def test_a_failed_listing_fails_no_look_each_reads_its_own_request(tmp_path: Path) -> None:
    store = Listings(tmp_path)
    requests = RequestStore(store)
    ids = [ProcedureId.random() for _ in range(3)]
    await requests.put(ids[1], OperatorRequest.new("cancel", "still seen"))
    looks = await crowded(RequestLooks(requests, spawn), store)
    store.fail = StoreUnavailable("listing requests/: 503 Slow Down", key="requests/")
    answers = await asyncio.gather(*(looks.get(pid) for pid in ids))
    assert [a is not None for a in answers] == [False, True, False]
    assert (store.walks, store.gets) == (1, 3)


async def test_a_failed_read_fails_its_own_look_only(tmp_path: Path) -> None:
    store = Listings(tmp_path)
    requests = RequestStore(store)
    ids = [ProcedureId.random() for _ in range(3)]
    for pid in ids:
        await requests.put(pid, OperatorRequest.new("cancel", "stop"))
    failing = requests.key(ids[0])
    read = store.get

    async def get(key: str) -> bytes | None:
        if key == failing:
            raise StoreUnavailable(f"reading {key}: 503 Slow Down", key=key)
        return await read(key)

    looks = await crowded(RequestLooks(requests, spawn), store)
    store.get = get  # type: ignore[method-assign]
    answers = await asyncio.gather(*(looks.get(pid) for pid in ids), return_exceptions=True)
    assert isinstance(answers[0], StoreUnavailable)
    assert all(isinstance(a, OperatorRequest) for a in answers[1:])


async def test_a_cancelled_look_leaves_the_others_answered(tmp_path: Path) -> None:
    store = Listings(tmp_path)
    looks = await crowded(RequestLooks(RequestStore(store), spawn), store)
    store.hold = asyncio.Event()
    gone = asyncio.ensure_future(looks.get(ProcedureId.random()))
    kept = asyncio.ensure_future(looks.get(ProcedureId.random()))
    while store.walks == 0:
        await asyncio.sleep(0.001)
    gone.cancel()
    store.hold.set()
    assert await asyncio.wait_for(kept, 5) is None
    with pytest.raises(asyncio.CancelledError):
        await gone


class Spin(Procedure):
    """Steps without persisting (a look for its request before each attempt), each of
    `pause` seconds: for ever, or `steps` of them."""

    type_name = "looks::Spin"

    def __init__(self, data: dict[str, Any] | None = None) -> None:
        self.data = data or {"n": 0, "steps": None, "pause": 0.0}

    async def execute(self, ctx: Context) -> Status:
        self.data["n"] += 1
        await asyncio.sleep(self.data["pause"])
        return Status.done() if self.data["n"] == self.data["steps"] else Status.executing(persist=False)

    def dump(self) -> str:
        return json.dumps(self.data)

    @classmethod
    def load(cls, data: str) -> Spin:
        return cls(json.loads(data))


def twice() -> ProcedureWithId:
    """Steps of 50 ms, not persisted: the runners look for their requests together."""
    return ProcedureWithId.new(Spin({"n": 0, "steps": 3, "pause": 0.05}))


async def test_stop_leaves_no_look_running() -> None:
    """A look belongs to the term: `stop()` cancels it and waits for it, like every task of
    the term, so that nothing of the manager still reads the store once it has returned."""
    slow = Fault("delay", kinds=frozenset({"walk", "get"}), key="requests/*", seconds=0.05)
    manager = ProcedureManager(FaultyStore(MemoryStore(f"looks-{uuid.uuid4().hex}"), faults=[slow]))
    manager.register(Spin)
    await manager.start()
    for _ in range(5):
        await manager.submit(ProcedureWithId.new(Spin()))
    await asyncio.sleep(0.2)  # the looks of five runners, one listing at a time
    await manager.stop()
    assert [t.get_name() for t in asyncio.all_tasks() if t.get_name().startswith("procstore")] == []


async def test_one_failed_listing_fails_no_procedure() -> None:
    """One transient error of the one listing that answers many runners' looks was each
    runner's error: with `max_retry_times=0`, every procedure of the batch failed (20 of 20)
    where a failed read of its own fails one at most."""
    once = Fault("transient", kinds=frozenset({"walk"}), key="requests/", nth=2, times=1)
    manager = ProcedureManager(
        FaultyStore(MemoryStore(f"looks-{uuid.uuid4().hex}"), faults=[once]),
        max_retry_times=0,
        request_poll_interval=60,
    )
    manager.register(Spin)
    async with manager:
        watchers = await asyncio.gather(*(manager.submit(twice()) for _ in range(20)))
        outcomes = await asyncio.gather(*(w.wait() for w in watchers), return_exceptions=True)
    assert once.fired == 1
    assert [o for o in outcomes if isinstance(o, BaseException)] == []


async def test_a_look_the_listing_answers_does_not_wait_for_the_others_reads(tmp_path: Path) -> None:
    """A caller whose request the listing does not show is answered at once: held until the
    reads of the listed ones are done, its answer (as old as the listing) would let its step
    start after a request stored meanwhile, a `cancel()` that had returned (with a local
    store, 45 to 79 of 200 cancelled procedures started a step after their cancel returned)."""
    store = Listings(tmp_path)
    requests = RequestStore(store)
    listed, other = ProcedureId.random(), ProcedureId.random()
    await requests.put(listed, OperatorRequest.new("cancel", "listed"))
    slow_key, release, read = requests.key(listed), asyncio.Event(), store.get

    async def get(key: str) -> bytes | None:
        if key == slow_key:
            await release.wait()
        return await read(key)

    store.get = get  # type: ignore[method-assign]
    looks = RequestLooks(requests, spawn)
    slow, quick = asyncio.ensure_future(looks.get(listed)), asyncio.ensure_future(looks.get(other))
    try:
        assert await asyncio.wait_for(asyncio.shield(quick), 5) is None
        await requests.put(other, OperatorRequest.new("cancel", "stored after that answer"))
    finally:
        release.set()
    request = await slow
    assert request is not None and request.reason == "listed"


async def test_a_look_ahead_answers_the_next_get_and_only_that_one(tmp_path: Path) -> None:
    """A runner looks ahead when its `execute()` has returned, while its step's write goes
    on: a request stored before that is seen by the next attempt; one stored after, by the
    attempt after it."""
    store = Listings(tmp_path)
    requests = RequestStore(store)
    looks = RequestLooks(requests, spawn)
    before, after = ProcedureId.random(), ProcedureId.random()
    await requests.put(before, OperatorRequest.new("cancel", "before the look"))
    looks.look_ahead(before)
    looks.look_ahead(after)
    await asyncio.sleep(0.05)  # the look is done
    await requests.put(after, OperatorRequest.new("cancel", "after the look"))
    assert await looks.get(before) is not None
    assert await looks.get(after) is None  # the look ahead's answer
    request = await looks.get(after)  # a new look
    assert request is not None and request.reason == "after the look"


class Unreadable(Listings):
    async def get(self, key: str) -> bytes | None:
        raise StoreUnavailable(f"reading {key}: 503", key=key)


async def test_an_unused_failed_look_ahead_is_dropped_quietly(tmp_path: Path) -> None:
    import gc

    seen: list[dict[str, object]] = []
    asyncio.get_running_loop().set_exception_handler(lambda _loop, context: seen.append(context))
    looks = RequestLooks(RequestStore(Unreadable(tmp_path)), spawn)
    ended = ProcedureId.random()
    looks.look_ahead(ended)
    await asyncio.sleep(0.05)
    looks.forget(ended)
    gc.collect()
    await asyncio.sleep(0)
    assert [c["message"] for c in seen] == []


class Counted(CountingProcedure):
    """Four persisted steps; the numbers of the steps it began are in `RAN`."""

    type_name = "looks::Counted"
    RAN: ClassVar[list[int]] = []

    async def execute(self, ctx: Context) -> Status:
        self.n += 1
        Counted.RAN.append(self.n)
        return Status.done() if self.n == 4 else Status.executing(persist=True)


async def test_a_request_stored_while_a_write_backs_off_stops_the_next_step(s3_target: StoreTarget) -> None:
    """On S3 the look ahead begins when `execute()` returns; when the step's write fails and
    backs off, that answer is as old as the first attempt: the next step began with a cancel
    stored during the backoff (a second before it) unseen."""
    Counted.RAN = []
    inner = open_state_store(s3_target.url, s3_target.storage_options)
    lost = Fault("transient", kinds=frozenset({"put_if_absent", "put"}), key="*/0000000001.step", times=1)
    manager = ProcedureManager(
        # Two seconds of backoff: time for the CLI's write to land even when a loaded machine
        # slows the moto server down to hundreds of milliseconds a request.
        FaultyStore(inner, faults=[lost]),
        retry_delay=2.0,
        max_retry_delay=2.0,
        request_poll_interval=60,
    )
    manager.register(Counted)
    other = open_state_store(s3_target.url, s3_target.storage_options)  # the CLI's view
    try:
        async with manager:
            pwid = ProcedureWithId.new(Counted())
            watcher = await manager.submit(pwid)
            async with asyncio.timeout(10):
                while not lost.fired:
                    await asyncio.sleep(0.005)
            await RequestStore(other).put(pwid.id, OperatorRequest.new("cancel", "during the backoff"))
            with pytest.raises(ProcedureFailed, match="during the backoff"):
                await asyncio.wait_for(watcher.wait(), 10)
    finally:
        await other.close()
    assert Counted.RAN == [1]


class Whose(LocalDirStore):
    """Notes the procedure whose log fields the reads of `requests/` are made under."""

    def __init__(self, root: Path) -> None:
        super().__init__(root)
        self.under: list[tuple[str, str | None]] = []

    async def get(self, key: str) -> bytes | None:
        if key.startswith("requests/"):
            scope = current_procedure.get()
            self.under.append(
                (key.removeprefix("requests/").removesuffix(".json"), None if scope is None else scope.procedure_id)
            )
        return await super().get(key)


async def test_a_look_is_made_under_no_procedure(tmp_path: Path) -> None:
    """The look task was spawned in the context of the runner that asked first: its store
    requests (log records, store events on that procedure's span) were put down to that one
    procedure, though made for all of them, and after it had ended. A look read alone, in its
    own runner, is that procedure's own."""
    store = Whose(tmp_path)
    manager = ProcedureManager(store, request_poll_interval=60)
    manager.register(Spin)
    async with manager:
        watchers = [await manager.submit(twice()) for _ in range(3)]
        await asyncio.gather(*(w.wait() for w in watchers))
    assert store.under and all(under in (None, whose) for whose, under in store.under)


async def test_a_procedure_looking_alone_counts_no_turn_after_its_first_look(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One procedure stepping alone: its looks are its own reads, and after the first no
    callback counts their turns (a tenth of a step on memory); others looking are counted
    again, and a crowd is batched."""
    store = Listings(tmp_path)
    looks = RequestLooks(RequestStore(store), spawn)
    loop = asyncio.get_running_loop()
    counted: list[object] = []
    call_soon = loop.call_soon

    def noting(callback: Any, *args: Any, **kwargs: Any) -> asyncio.Handle:
        if getattr(callback, "__name__", "") == "_turn_ended":
            counted.append(callback)
        return call_soon(callback, *args, **kwargs)

    monkeypatch.setattr(loop, "call_soon", noting)
    alone = ProcedureId.random()
    for _ in range(5):
        assert await looks.get(alone) is None
        await asyncio.sleep(0)
    assert len(counted) == 1
    assert (store.walks, store.gets) == (0, 5)
    await crowded(looks, store)
    await asyncio.gather(*(looks.get(ProcedureId.random()) for _ in range(5)))
    assert store.walks == 1


class SlowSignalDeletes(MemoryStore):
    """Requests are round trips (as on S3); deleting consumed signals waits for `go`
    (`deleting` says it began)."""

    round_trips = True

    def __init__(self) -> None:
        super().__init__(f"signal-deletes-{uuid.uuid4().hex}")
        self.deleting, self.go = asyncio.Event(), asyncio.Event()

    async def batch_delete(self, keys: Sequence[str]) -> None:
        if any("/signals/" in f"/{key}" for key in keys):
            self.deleting.set()
            await asyncio.wait_for(self.go.wait(), 5)
        await super().batch_delete(keys)


class Signalled(CountingProcedure):
    """Waits for signal `go`, then runs two more steps, each stored. `RAN` lists each step begun."""

    type_name = "request_looks::Signalled"
    RAN: ClassVar[list[int]] = []

    async def execute(self, ctx: Context) -> Status:
        Signalled.RAN.append(self.n)
        self.n += 1
        if self.n == 1:
            return Status.wait_for_signal("go")
        return Status.done() if self.n == 3 else Status.executing(persist=True)


async def test_a_request_stored_while_consumed_signals_are_deleted_stops_the_next_step() -> None:
    """A step that a signal woke is stored, then the signal it consumed is deleted, before
    the next step: a cancel stored by another process during that deletion (after the step's
    write landed) stops the next step, which the look sent with the write would not see."""
    store = SlowSignalDeletes()
    Signalled.RAN = []
    manager = ProcedureManager(store, request_poll_interval=60)
    manager.register(Signalled)
    async with manager:
        procedure = ProcedureWithId.new(Signalled())
        watcher = await manager.submit(procedure)
        await manager.signal(procedure.id, "go")
        await asyncio.wait_for(store.deleting.wait(), 5)
        await RequestStore(store).put(procedure.id, OperatorRequest.new("cancel", "while its signal was deleted"))
        store.go.set()
        with pytest.raises(ProcedureFailed, match="while its signal was deleted"):
            await asyncio.wait_for(watcher.wait(), 10)
    assert Signalled.RAN == [0, 1]
