"""The local disk without procstore: what a procedure's file operations cost issued raw.

- `ceiling`: durable creates per second (temp file, write, fsync, create-only rename, folder
  fsync) at 1, 4, 8, 16... threads: the disk's parallel-fsync ceiling.
- `same_operations`: N sequences of exactly the file operations a 5-step procedure performs
  on a local store, from plain threads (no event loop, no procstore): make its folder
  (fsyncing the parent), six durable creates (the submitted state, four steps, the commit),
  then the deletion in the documented order (the five `.step` files, a folder fsync, the
  `.commit`, the folder). Run at several concurrencies; the best is the baseline.
"""

from __future__ import annotations

import os
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from procstore.store.durable import create_exclusively, fsync_dir

CONCURRENCIES = (1, 4, 8, 16, 32, 64)


def _durable_create(folder: Path, name: str, value: bytes) -> None:
    temp = folder / f".tmp-{uuid.uuid4().hex}"
    fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    try:
        os.write(fd, value)
        os.fsync(fd)
    finally:
        os.close(fd)
    if create_exclusively(temp, folder / name):
        temp.unlink()
    fsync_dir(folder)


def _one_procedure(parent: Path, value: bytes) -> None:
    folder = parent / str(uuid.uuid4())
    folder.mkdir()
    fsync_dir(parent)
    names = [f"{i:010d}.step" for i in range(5)]
    for name in names:
        _durable_create(folder, name, value)
    _durable_create(folder, "0000000005.commit", b"")
    for name in names:
        (folder / name).unlink()
    fsync_dir(folder)
    (folder / "0000000005.commit").unlink()
    folder.rmdir()


def _run(threads: int, count: int, work: object) -> float:
    """Seconds for `count` calls of `work()` spread over `threads` threads."""
    assert callable(work)
    started = time.perf_counter()
    with ThreadPoolExecutor(threads) as pool:
        for future in [pool.submit(work) for _ in range(count)]:
            future.result()
    return time.perf_counter() - started


def same_operations(parent: Path, n: int, value: bytes, concurrencies: tuple[int, ...]) -> dict[int, float]:
    """Procedures' worth of file operations per second at each concurrency (N sequences)."""
    parent.mkdir(parents=True, exist_ok=True)
    return {c: n / _run(c, n, lambda: _one_procedure(parent, value)) for c in concurrencies}


def ceiling(parent: Path, writes: int, value: bytes, threads: int) -> float:
    """Durable creates per second with `threads` threads (each create in its own new name)."""
    folder = parent / f"ceiling-{uuid.uuid4().hex}"
    folder.mkdir(parents=True)
    fsync_dir(parent)
    names = iter(range(writes))
    rate = writes / _run(threads, writes, lambda: _durable_create(folder, f"{next(names):010d}.step", value))
    for path in folder.iterdir():
        path.unlink()
    folder.rmdir()
    return rate


def concurrencies_for(n: int) -> tuple[int, ...]:
    """The concurrencies tried for N sequences: none above N, 1 only for small N, and for the
    largest N only those that won at N=1,000 (each try takes minutes there)."""
    if n >= 10_000:
        return (8, 16, 32)
    return tuple(c for c in CONCURRENCIES if c <= n and (c > 1 or n <= 100)) or (1,)
