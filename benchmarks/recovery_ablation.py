"""`python -m benchmarks.recovery_ablation DIR`: what each part of recovery's load costs, as
the ratio to the raw list-and-read that the load reaches without it.

Measurement only: each part is replaced, for the timed load alone, by a stand-in that hands
over what the part would have computed, made beforehand (the latest keys, the decoded
messages), or by nothing where nothing after it needs its result (the runners, the plan of
a store that holds roots only). The store is `benchmarks.recovery_profile`'s (filled by it
on the first run); each load is timed interleaved with the raw list-and-read and with every
other variant, and the last row removes every part at once: the floor of a loader that
lists, reads and starts a manager, with procstore's layers on the way.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import statistics
import time
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any
from unittest.mock import patch

import click

from benchmarks.crashed_manager import GATE
from benchmarks.harness import timed
from benchmarks.procedures import GATES, Loop
from benchmarks.recovery_profile import filled
from benchmarks.stores import Target
from benchmarks.suites import manager
from procstore import ProcedureId
from procstore._runtime.context import ManagerContext
from procstore.lock_key import NO_KEYS
from procstore.store import open_state_store
from procstore.store.folder import decode_or_problem
from procstore.store.procedure_store import ProcedureStore, _keys_read

Patch = Callable[[], contextlib.AbstractContextManager[Any]]
"""A stand-in for a part: entered around a timed load."""


class _IdleRunner:
    """A runner that is never started: what `_start_resumed` asks of one, doing nothing."""

    __slots__ = ("holds_locks", "meta")

    def __init__(self, _ctx: object, meta: object, *_args: object, holds_locks: bool = False, **_kw: object) -> None:
        self.meta = meta
        self.holds_locks = holds_locks

    def take_slot_if_started(self) -> None:
        pass

    def start(self) -> None:
        pass


async def precomputed(url: str) -> tuple[Callable[..., Any], Callable[..., Any], dict[ProcedureId, str]]:
    """Stand-ins for `ProcedureStore._latest_keys` and `decoded_directly` (the load's decoding
    of a value): the answers for this store, computed now (a dictionary lookup per value
    stays); and each procedure's latest data."""
    store = ProcedureStore(open_state_store(url))
    keys, _ = await store.list_keys()
    latest = store._latest_keys(keys)
    values = await store._read_all(latest[1])
    await store.store.close()
    read = _keys_read(latest[0], latest[3])
    messages = [decode_or_problem(v, key[1]) for v, key in zip(values, read, strict=True)]
    decoded: dict[bytes, Any] = {v: m for v, m in zip(values, messages, strict=True) if isinstance(v, bytes)}
    latest_data = {key[0]: m.data for key, m in zip(read, messages, strict=True) if not isinstance(m, str)}

    def latest_keys(_self: ProcedureStore, _keys: list[str]) -> Any:
        return dict(latest[0]), list(latest[1]), list(latest[2]), dict(latest[3])

    def decode(raw: bytes) -> Any:
        return decoded[raw]

    return latest_keys, decode, latest_data


_START_ALONE = "start() alone (no recovery at all)"


async def _recovers_nothing(_ctx: object) -> list[Any]:
    return []


@contextlib.contextmanager
def collector_off() -> Iterator[None]:
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


@contextlib.contextmanager
def loaded_beforehand(latest_data: dict[ProcedureId, str]) -> Iterator[None]:
    """`ManagerContext.load_with_lock_key` answered by procedures loaded before the timing
    (each procedure's own, as its runner would get it), with no lock keys (a `Loop` has none)."""
    made = {pid: (Loop.load(data), NO_KEYS) for pid, data in latest_data.items()}
    with patch.object(ManagerContext, "load_with_lock_key", lambda _ctx, pid, *_a: made[pid]):
        yield


def parts(
    latest_keys: Callable[..., Any], decode: Callable[..., Any], latest_data: dict[ProcedureId, str]
) -> dict[str, list[Patch]]:
    """Each part's stand-ins, by the part's name."""
    recovery = "procstore._runtime.recovery"

    def roots(_ctx: object, messages: dict[Any, Any], *_a: object, **_k: object) -> list[Any]:
        return list(messages.items())  # every procedure is a root here: the plan's answer

    return {
        "the listing's reading (latest keys)": [lambda: patch.object(ProcedureStore, "_latest_keys", latest_keys)],
        "decoding the values": [lambda: patch("procstore.store.procedure_store.decoded_directly", decode)],
        "the plan (strays, ended runs, parent chains, roots)": [
            lambda: patch(f"{recovery}._runs_that_ended", lambda *_a: []),
            lambda: patch(f"{recovery}._stranded", lambda *_a: {}),
            lambda: patch(f"{recovery}._children_of_ended_runs", lambda *_a: {}),
            lambda: patch(f"{recovery}._plan_unfinished", roots),
        ],
        "loading the procedures (loader, lock_key())": [lambda: loaded_beforehand(latest_data)],
        "runners (made, slots, started)": [lambda: patch(f"{recovery}.Runner", _IdleRunner)],
        "the garbage collector": [collector_off],
    }


async def measure(url: str, n: int, runs: int) -> tuple[dict[str, list[float]], dict[str, list[float]]]:
    """Every run's seconds of the raw list-and-read (`raw`) and of each variant's load; and
    each load's event loop CPU seconds (`time.thread_time()`, which other work on the
    machine moves least)."""
    latest_keys, decode, latest_data = await precomputed(url)
    every = parts(latest_keys, decode, latest_data)
    variants: dict[str, tuple[list[Patch], bool]] = {"as it is": ([], True)}  # stand-ins, telemetry
    variants.update((f"without {name}", (stand_ins, True)) for name, stand_ins in every.items())
    variants["without all of these"] = ([p for stand_ins in every.values() for p in stand_ins], True)
    variants["without telemetry (telemetry=False)"] = ([], False)
    nothing_to_recover: list[Patch] = [lambda: patch("procstore._runtime.term.recover", _recovers_nothing)]
    variants[_START_ALONE] = (nothing_to_recover, True)
    target = Target("local", url)
    raw_store = open_state_store(url)
    GATES[GATE] = asyncio.Event()  # closed: loaded procedures wait, writing nothing

    async def raw() -> None:
        latest = {key.rpartition("/")[0]: key for key in await raw_store.walk("procedure/")}
        await raw_store.get_many(list(latest.values()))

    def load(name: str, stand_ins: list[Patch], telemetry: bool) -> Callable[[], Awaitable[None]]:
        async def timing() -> None:
            m = manager(url, target, telemetry=telemetry)
            with contextlib.ExitStack() as stack:
                for stand_in in stand_ins:
                    stack.enter_context(stand_in())
                cpu = time.thread_time()
                seconds = await timed(m.start)
                cpu = time.thread_time() - cpu
            samples[name].append(seconds)
            loop_cpu[name].append(cpu)
            if name != _START_ALONE and len(m.list_procedures()) != n:
                raise AssertionError(f"{name}: loaded {len(m.list_procedures())} procedures, not {n}")
            await m.stop()
            gc.collect()  # untimed: what a variant left is not the next one's to collect

        return timing

    samples: dict[str, list[float]] = {name: [] for name in ["raw", *variants]}
    loop_cpu: dict[str, list[float]] = {name: [] for name in variants}
    for _ in range(runs):
        samples["raw"].append(await timed(raw))
        for name, (stand_ins, telemetry) in variants.items():
            await load(name, stand_ins, telemetry)()
    await raw_store.close()
    return samples, loop_cpu


@click.command()
@click.argument("folder", type=click.Path(file_okay=False, path_type=Path))
@click.option("-n", "count", default=10_000, show_default=True, help="Procedures in the store.")
@click.option("--runs", default=5, show_default=True, help="Interleaved runs of each variant.")
def main(folder: Path, count: int, runs: int) -> None:
    """Print each variant's load and its ratio to the raw list-and-read (best, median)."""
    folder.mkdir(parents=True, exist_ok=True)
    url = f"{folder.resolve()}/"
    asyncio.run(filled(url, count))
    results, loop_cpu = asyncio.run(measure(url, count, runs))
    raw = results["raw"]
    print(f"raw list + read: best {min(raw):.3f} s, median {statistics.median(raw):.3f} s ({runs} runs)")
    for name, times in results.items():
        if name == "raw":
            continue
        best, median = min(times) / min(raw), statistics.median(times) / statistics.median(raw)
        cpu = loop_cpu[name]
        print(f"{name:60s} loop CPU {1e3 * min(cpu):.0f} / {1e3 * statistics.median(cpu):.0f} ms; "
              f"best {min(times):.3f} s, median {statistics.median(times):.3f} s: "
              f"ratio {best:.2f} / {median:.2f}")  # fmt: skip


if __name__ == "__main__":
    main()
