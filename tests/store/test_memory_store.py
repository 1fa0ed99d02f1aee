"""`MemoryStore` (`memory://`, the one in-memory scheme): shared names, conditional writes, and a flat cost."""

from __future__ import annotations

import asyncio
import contextlib
import uuid

import pytest

from procstore.store import open_state_store
from procstore.store.memory import MemoryStore
from procstore.testing import Fault, FaultyStore, SimulatedCrash


def fresh() -> MemoryStore:
    store = open_state_store(f"memory://t-{uuid.uuid4().hex}/")
    assert isinstance(store, MemoryStore)
    return store


async def test_round_trip_and_prefix_listing() -> None:
    store = fresh()
    assert await store.get("a") is None
    await store.put("procedure/a/0000000000.step", b"zero")
    await store.put("procedure/a/0000000001.step", b"one")
    await store.put("procedure/ab/0000000000.step", b"other id")
    await store.put("procedure", b"a key that is also a prefix")
    await store.put("other/x", b"x")
    assert await store.walk("procedure/a/") == ["procedure/a/0000000000.step", "procedure/a/0000000001.step"]
    assert await store.walk("procedure/") == [
        "procedure/a/0000000000.step", "procedure/a/0000000001.step", "procedure/ab/0000000000.step"
    ]  # fmt: skip
    assert await store.walk("procedure") == ["procedure", *await store.walk("procedure/")]
    assert await store.walk("nothing/") == []
    assert len(await store.walk("")) == 5
    assert await store.get_many(["other/x", "missing"]) == [b"x", None]
    modified = await store.walk_modified("other/")
    assert list(modified) == ["other/x"] and modified["other/x"] is not None
    await store.batch_delete(["procedure/a/0000000000.step", "missing"])
    await store.delete("procedure/a/")  # a folder is a prefix: nothing to do
    await store.delete("other/x")
    assert await store.walk("") == ["procedure", "procedure/a/0000000001.step", "procedure/ab/0000000000.step"]


async def test_create_only_and_compare_and_swap() -> None:
    store = fresh()
    assert await store.put_if_absent("k", b"1") is True
    assert await store.put_if_absent("k", b"2") is False and await store.get("k") == b"1"
    found = await store.get_versioned("k")
    assert found is not None
    _, version = found
    assert await store.put_if_version("k", b"3", version) is True
    assert await store.put_if_version("k", b"4", version) is False  # stale version
    assert await store.put_if_version("new", b"n", None) is True
    assert await store.put_if_version("new", b"m", None) is False
    assert await store.get("k") == b"3" and await store.get("new") == b"n"
    # The same bytes written again are a new version: a swap from the old one fails.
    found = await store.get_versioned("k")
    assert found is not None
    await store.put("k", b"3")
    assert await store.put_if_version("k", b"5", found[1]) is False


async def test_names_are_shared_within_the_process_and_isolated_between_names() -> None:
    name = f"shared-{uuid.uuid4().hex}"
    first, second, other = MemoryStore(name), open_state_store(f"memory://{name}/"), fresh()
    await first.put("k", b"v")
    assert await second.get("k") == b"v" and await other.get("k") is None
    MemoryStore.forget(name)
    assert await MemoryStore(name).get("k") is None


async def test_memory_urls_open_procstores_store_and_the_former_mem_scheme_warns_but_opens_the_same() -> None:
    name = f"schemes-{uuid.uuid4().hex}"
    store = open_state_store(f"memory://{name}/")
    assert isinstance(store, MemoryStore) and store.url == f"memory://{name}/"
    await store.put("k", b"v")
    with pytest.warns(DeprecationWarning, match="use memory://"):
        former = open_state_store(f"mem://{name}/")
    assert isinstance(former, MemoryStore) and await former.get("k") == b"v"


async def test_one_winner_among_concurrent_creates() -> None:
    store = fresh()
    results = await asyncio.gather(*(store.put_if_absent("k", str(i).encode()) for i in range(50)))
    assert results.count(True) == 1


async def test_faults_and_crashes_wrap_it() -> None:
    store = FaultyStore(fresh(), faults=[Fault("crash", nth=1)])
    await store.put("a", b"1")
    with contextlib.suppress(SimulatedCrash):
        await store.put("b", b"2")
    assert await store.inner.get("a") == b"1" and await store.inner.get("b") is None


async def test_a_path_in_a_memory_url_is_a_folder_of_its_store() -> None:
    """As with a bucket: `memory://app/tenant/` is the folder `tenant/` of `memory://app/`."""
    name = f"app-{uuid.uuid4().hex}"
    whole, folder = open_state_store(f"memory://{name}/"), open_state_store(f"memory://{name}/tenant/")
    assert await folder.put_if_absent("procedure/x", b"1")
    assert await whole.get("tenant/procedure/x") == b"1"
    assert await folder.walk("procedure/") == ["procedure/x"]
    await whole.batch_delete(["tenant/procedure/x"])
    assert await folder.get("procedure/x") is None


def test_a_missing_key_is_answered_without_yielding_and_a_present_one_after_one_yield() -> None:
    """As a local directory's `stat`: a runner's look for its operator request (a missing key,
    nearly always) costs no turn of the event loop; every other operation yields once."""
    store = MemoryStore(f"yield-{uuid.uuid4().hex}")
    missing = store.get("absent")
    with pytest.raises(StopIteration) as answered:
        missing.send(None)
    assert answered.value.value is None
    asyncio.run(store.put("present", b"x"))
    present = store.get("present")
    assert present.send(None) is None  # the yield
    with pytest.raises(StopIteration) as read:
        present.send(None)
    assert read.value.value == b"x"
