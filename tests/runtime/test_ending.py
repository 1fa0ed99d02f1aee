"""How a procedure's end deletes its keys: without listing its folder when this term wrote
every key, by listing it whenever a write's outcome is unknown."""

from __future__ import annotations

import contextlib
from collections import Counter
from collections.abc import Awaitable, Callable
from typing import TypeVar

from procstore import ProcedureFailed, ProcedureWithId
from procstore.store import StateStore, open_state_store
from procstore.store.wrapping import WrappingStore
from procstore.testing import Fault, FaultyStore
from tests.procedures import Parent, World
from tests.runtime.helpers import steps
from tests.support import StoreTarget, manager_for, store_targets

T = TypeVar("T")

target = store_targets("local", "s3", "memory")


class Counting(WrappingStore):
    def __init__(self, inner: StateStore) -> None:
        super().__init__(inner)
        self.calls: Counter[str] = Counter()
        self.listed: list[str] = []

    async def around(self, kind: str, key: str, call: Callable[[], Awaitable[T]], value: bytes | None = None) -> T:
        self.calls[kind] += 1
        if kind == "walk":
            self.listed.append(key)
        return await call()

    async def delete_in_order(self, first, then, folder):  # type: ignore[no-untyped-def]
        self.calls["delete_in_order"] += 1
        await self.inner.delete_in_order(first, then, folder)


async def test_a_procedure_this_term_wrote_ends_without_listing_its_folder(target: StoreTarget) -> None:
    world = World.new()
    store = Counting(open_state_store(target.url, target.storage_options))
    async with manager_for(store) as manager:
        store.listed.clear()
        done = steps(world, 3)
        await (await manager.submit(done)).wait()
        tree = ProcedureWithId.new(Parent.create(world, ["a", "b"]))
        await (await manager.submit(tree)).wait()
        assert [k for k in store.listed if "procedure/" in k] == []  # no LIST at the end
        assert await store.walk("procedure/") == []  # and nothing left behind
    await store.inner.close()


async def test_a_write_with_an_unknown_outcome_makes_the_end_list_the_folder(local_target: StoreTarget) -> None:
    """A step write that landed but whose every answer was lost: the runner fails the
    procedure without knowing the key exists, so its end must list the folder to find it."""
    world = World.new()
    counting = Counting(open_state_store(local_target.url))
    store = FaultyStore(counting)
    store.plan.faults.append(Fault("transient", kinds=frozenset({"put_if_absent"}), key="*/0000000001.step",
                                   when="after"))  # fmt: skip
    async with manager_for(store, max_retry_times=1) as manager:
        procedure = steps(world, 3)
        watcher = await manager.submit(procedure)
        with contextlib.suppress(ProcedureFailed):
            await watcher.wait()
        assert any(str(procedure.id) in k for k in counting.listed)
        assert await counting.walk(f"procedure/{procedure.id}/") == []
    await counting.inner.close()
