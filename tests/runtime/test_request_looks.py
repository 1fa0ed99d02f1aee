"""Runners' looks for their operator request, answered together when many look at once."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from procstore import ProcedureId
from procstore._runtime.looks import RequestLooks
from procstore.errors import StoreUnavailable
from procstore.store.local import LocalDirStore
from procstore.store.requests import OperatorRequest, RequestStore


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


async def test_many_looks_at_once_are_one_listing_and_each_sees_its_request(tmp_path: Path) -> None:
    store = Listings(tmp_path)
    requests = RequestStore(store)
    ids = [ProcedureId.random() for _ in range(20)]
    await requests.put(ids[3], OperatorRequest.new("cancel", "stop it"))
    looks = RequestLooks(requests)
    found = await asyncio.gather(*(looks.get(pid) for pid in ids))
    assert [pid for pid, request in zip(ids, found, strict=True) if request is not None] == [ids[3]]
    assert found[3] is not None and found[3].reason == "stop it"
    assert store.walks == 1 and store.gets == 1  # the listing, then the one request listed


async def test_one_look_alone_is_one_read(tmp_path: Path) -> None:
    store = Listings(tmp_path)
    assert await RequestLooks(RequestStore(store)).get(ProcedureId.random()) is None
    assert (store.walks, store.gets) == (0, 1)


async def test_a_look_asked_for_during_a_listing_waits_for_the_next_one(tmp_path: Path) -> None:
    """The listing under way began before the request was stored: it cannot answer a look
    asked for after that, which must see the request."""
    store = Listings(tmp_path)
    requests = RequestStore(store)
    looks = RequestLooks(requests)
    late = ProcedureId.random()
    store.hold = asyncio.Event()
    first = asyncio.gather(looks.get(ProcedureId.random()), looks.get(ProcedureId.random()))
    while store.walks == 0:
        await asyncio.sleep(0.001)
    await requests.put(late, OperatorRequest.new("fail", "too late for that listing"))
    asking = asyncio.ensure_future(looks.get(late))
    await asyncio.sleep(0.01)
    store.hold.set()
    assert await first == [None, None]
    request = await asyncio.wait_for(asking, 5)
    assert request is not None and request.kind == "fail"


async def test_a_failed_listing_fails_every_look_of_its_batch(tmp_path: Path) -> None:
    store = Listings(tmp_path)
    store.fail = StoreUnavailable("listing requests/: 503 Slow Down", key="requests/")
    looks = RequestLooks(RequestStore(store))
    answers = await asyncio.gather(*(looks.get(ProcedureId.random()) for _ in range(3)), return_exceptions=True)
    assert all(isinstance(a, StoreUnavailable) for a in answers)
    store.fail = None
    assert await asyncio.gather(*(looks.get(ProcedureId.random()) for _ in range(3))) == [None] * 3


async def test_a_cancelled_look_leaves_the_others_answered(tmp_path: Path) -> None:
    store = Listings(tmp_path)
    store.hold = asyncio.Event()
    looks = RequestLooks(RequestStore(store))
    gone = asyncio.ensure_future(looks.get(ProcedureId.random()))
    kept = asyncio.ensure_future(looks.get(ProcedureId.random()))
    while store.walks == 0:
        await asyncio.sleep(0.001)
    gone.cancel()
    store.hold.set()
    assert await asyncio.wait_for(kept, 5) is None
    with pytest.raises(asyncio.CancelledError):
        await gone


async def test_a_look_ahead_answers_the_next_get_and_only_that_one(tmp_path: Path) -> None:
    """A runner looks ahead when its `execute()` has returned, while its step's write goes
    on: a request stored before that is seen by the next attempt; one stored after, by the
    attempt after it."""
    store = Listings(tmp_path)
    requests = RequestStore(store)
    looks = RequestLooks(requests)
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


async def test_an_unused_failed_look_ahead_is_dropped_quietly(tmp_path: Path) -> None:
    import gc

    seen: list[dict[str, object]] = []
    asyncio.get_running_loop().set_exception_handler(lambda _loop, context: seen.append(context))
    store = Listings(tmp_path)
    store.fail = StoreUnavailable("listing requests/: 503", key="requests/")
    looks = RequestLooks(RequestStore(store))
    ended = [ProcedureId.random(), ProcedureId.random()]
    for pid in ended:
        looks.look_ahead(pid)
    await asyncio.sleep(0.05)
    for pid in ended:
        looks.forget(pid)
    store.fail = None  # which holds the error, and through its traceback the looks
    gc.collect()
    await asyncio.sleep(0)
    assert [c["message"] for c in seen] == []
