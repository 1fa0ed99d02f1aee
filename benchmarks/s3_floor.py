"""The floor of a 1-step procedure on S3 behind the latency proxy, and what sets it.

`python -m benchmarks.s3_floor --runs 15` starts the moto server behind the 15 ms proxy
(as `python -m benchmarks` does), then, in one process and interleaved, times a lone
1-step procedure from `submit` until `wait()` returns, against the raw baseline (its two
writes as two PUTs, one after the other), and the same procedure with what follows its
`.commit` moved out of `wait()` (measurement only, never shipped behaviour):

- `as shipped`: `wait()` returns once the tree's end record is written and its keys are
  deleted (docs/guarantees.md, "Finishing");
- `deletion after wait()`: the end record is written, the deletion runs in the background;
- `record and deletion after wait()`: `wait()` returns at the `.commit`.

It then prints one procedure's requests in order (method, key, start and end in ms from the
submit) as the procstore store layer sends them: the chain that sets the floor.
"""

from __future__ import annotations

import asyncio
import contextlib
import statistics
import time
from collections.abc import Awaitable, Callable, Iterator
from datetime import UTC, datetime
from typing import Any

import click

import procstore._runtime.runner as runner_module
from benchmarks.harness import interleaved
from benchmarks.stores import innermost, targets
from benchmarks.suites import manager, one_procedure, raw_cleanup, raw_writes

ORIGINAL_DELETE_TREE = runner_module.delete_tree


class Background:
    """Runs each tree's deletion (and, if asked, its end record) after `wait()` returns,
    by replacing the runner's `delete_tree` while in use."""

    def __init__(self, *, record_too: bool) -> None:
        self.record_too = record_too
        self.tasks: set[asyncio.Task[None]] = set()

    async def delete_tree(self, ctx: Any, root: Any, ids: Any, metas: Any, state: Any, **kw: Any) -> None:
        if not self.record_too:
            await runner_module.record_tree(ctx, ids, root, state, datetime.now(UTC))
        # The deletion writes the record again (create-only, one more PUT) off the timed path.
        task = asyncio.create_task(ORIGINAL_DELETE_TREE(ctx, root, ids, metas, state, **kw))
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    async def settled(self) -> None:
        while self.tasks:
            await asyncio.gather(*self.tasks)

    @contextlib.contextmanager
    def installed(self) -> Iterator[None]:
        runner_module.delete_tree = self.delete_tree
        try:
            yield
        finally:
            runner_module.delete_tree = ORIGINAL_DELETE_TREE


def variant(timing: Callable[[], Awaitable[None]], background: Background | None) -> Callable[[], Awaitable[None]]:
    async def run() -> None:
        if background is None:
            await timing()
            return
        with background.installed():
            await timing()

    return run


async def timeline(m: Any) -> list[tuple[str, str, float, float]]:
    """One procedure's requests through the store layer: (operation, key, start, end) in ms."""
    store = innermost(m.store.store)
    calls: list[tuple[str, str, float, float]] = []
    started = time.perf_counter()
    originals = {}
    for name in ("put", "put_if_absent", "get", "get_many", "batch_delete", "walk", "delete"):
        original = getattr(store, name, None)
        if original is None:
            continue
        originals[name] = original

        def traced(*args: Any, _name: str = name, _original: Any = original, **kw: Any) -> Any:
            async def call() -> Any:
                t0 = time.perf_counter()
                try:
                    return await _original(*args, **kw)
                finally:
                    key = str(args[0]) if args else ""
                    if isinstance(args[0] if args else None, list):
                        key = f"{len(args[0])} keys: {', '.join(str(k).rsplit('/', 1)[-1] for k in args[0])}"
                    calls.append((_name, key.rsplit("/", 2)[-1] if "keys" not in key else key, t0, time.perf_counter()))

            return call()

        setattr(store, name, traced)
    try:
        await one_procedure(m, 1)()
    finally:
        for name, original in originals.items():
            setattr(store, name, original)
    return sorted(((n, k, 1e3 * (a - started), 1e3 * (b - started)) for n, k, a, b in calls), key=lambda c: c[2])


async def measure(runs: int) -> None:
    with targets(["s3-15ms"]) as (target,):
        async with manager(target.url(), target) as m:
            store = m.store.store
            after_record = Background(record_too=False)
            after_commit = Background(record_too=True)

            async def cleanup() -> None:
                await after_record.settled()
                await after_commit.settled()
                await raw_cleanup(store)()

            procedure = one_procedure(m, 1)
            samples = await interleaved(
                runs,
                lambda: raw_writes(store, 2),
                variant(procedure, None),
                variant(procedure, after_record),
                variant(procedure, after_commit),
                cleanup=cleanup,
            )
            names = ["raw: 2 PUTs", "as shipped", "deletion after wait()", "record and deletion after wait()"]
            raw_best, raw_median = min(samples[0]), statistics.median(samples[0])
            print(f"s3 via a 15 ms proxy, 1-step procedure, {runs} interleaved runs (ms, best / median):")
            for name, xs in zip(names, samples, strict=True):
                best, median = min(xs), statistics.median(xs)
                print(f"  {name:34} {1e3 * best:7.1f} / {1e3 * median:7.1f}   x raw {best / raw_best:.2f} / "
                      f"{median / raw_median:.2f}")  # fmt: skip
            print("one procedure's requests, as shipped (store layer; ms from submit):")
            for name, key, start, end in await timeline(m):
                print(f"  {start:7.1f} - {end:7.1f}  {name:14} {key}")


@click.command()
@click.option("--runs", default=15, show_default=True, help="Interleaved runs of each timing.")
def main(runs: int) -> None:
    asyncio.run(measure(runs))


if __name__ == "__main__":
    main()
