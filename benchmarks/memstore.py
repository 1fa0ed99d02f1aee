"""`--only memstore`: procstore's own memory:// store (`MemoryStore`) against fsspec's memory
filesystem (which memory:// opened before procstore's store took that scheme).

1. The cost of one write, read and prefix listing (one procedure's keys) in a store that
   already holds N keys: fsspec's memory filesystem scans every key on each listing,
   `MemoryStore` keeps a sorted index, so its cost should stay flat from 100 to 100,000 keys.
2. Crash points explored per second by the crash explorer on the region-migration scenario
   (the example machine) on memory://: what a user's crash tests get from the default store.
"""

from __future__ import annotations

import statistics
import time
import uuid

import fsspec

from benchmarks.harness import Report, Row
from procstore.store import StateStore, open_state_store
from procstore.store.fsspec_store import FsspecStore
from procstore.testing import CrashExplorer
from procstore_machines.region_migration.scenario import MigrateTwoRegions

ROUNDS = 200


async def _filled(store: StateStore, keys: int) -> StateStore:
    for i in range(keys):
        await store.put(f"procedure/{i:08d}/0000000000.step", b"x" * 64)
    return store


async def _per_operation(store: StateStore) -> float:
    """Seconds per (write, read, listing of one procedure's folder)."""
    start = time.perf_counter()
    for i in range(ROUNDS):
        key = f"procedure/new-{i:05d}/0000000000.step"
        await store.put(key, b"y" * 64)
        await store.get(key)
        await store.walk(f"procedure/new-{i:05d}/")
    return (time.perf_counter() - start) / ROUNDS


async def per_operation(report: Report, keys: int, *, with_fsspec: bool, runs: int = 3) -> None:
    mem_store = await _filled(open_state_store(f"memory://bench-{uuid.uuid4().hex}/"), keys)
    fsspec_store = await _filled(_fsspec_memory(), keys) if with_fsspec else None
    mem: list[float] = []
    fsspec: list[float] = []
    for _ in range(runs):  # interleaved
        mem.append(1e3 * await _per_operation(mem_store))
        if fsspec_store is not None:
            fsspec.append(1e3 * await _per_operation(fsspec_store))
    row = Row("memstore", f"write + read + list one folder, {keys} keys held", mem, "ms", fsspec,
              "fsspec's memory filesystem, same operations" if fsspec else "")  # fmt: skip
    report.add(row)
    report.scale("memory://: write + read + list one folder (N = keys held)", "ms/op", keys, row.median)
    if fsspec:
        report.scale("fsspec's memory filesystem: the same (N = keys held)", "ms/op", keys, statistics.median(fsspec))


def _fsspec_memory() -> StateStore:
    root = f"bench-{uuid.uuid4().hex}"
    return FsspecStore(fsspec.filesystem("memory", skip_instance_cache=True), root, f"memory://{root}/")


async def explorer_speed(report: Report, runs: int = 3) -> None:
    """Crash points explored per second on region migration, on memory://."""
    rates: list[float] = []
    for _ in range(runs):
        explorer = CrashExplorer(MigrateTwoRegions(), lambda n: f"memory://bench-{uuid.uuid4().hex}/")
        start = time.perf_counter()
        result = await explorer.explore()
        result.assert_ok()
        rates.append(result.explored / (time.perf_counter() - start))
    report.add(
        Row("memstore", "crash points explored per second, region migration (2 regions)", rates, "points/s",
            higher_is_better=True)
    )  # fmt: skip
