"""The cluster simulation's durable waits and signals: what its jobs do, what its schedule
sends, and what `check_waits` reports."""

from __future__ import annotations

import asyncio
import random
import sys
import uuid
from typing import ClassVar

from procstore._cli import common as cli_common
from procstore.testing import ClusterSimulation, LedgerWorld, MemoryStore, Process, ProcessStore, run_simulated
from procstore.testing.cluster_operator import run_cli
from procstore.testing.cluster_waits import SentSignal, WaitLog, Woke, check_waits

PID = str(uuid.UUID(int=1, version=4))


class Kept(LedgerWorld):
    """The ledger world, kept for the test to read after the run."""

    made: ClassVar[list[Kept]] = []

    def __init__(self) -> None:
        super().__init__()
        Kept.made.append(self)


def test_jobs_sleep_and_wait_and_the_schedule_signals_them_through_every_path() -> None:
    simulation = ClusterSimulation(Kept, actions=24)
    results = [simulation.run(seed) for seed in range(8)]
    assert all(r.ok for r in results), [r.report() for r in results if not r.ok]
    woke = [w for world in Kept.made for w in world.waits.woke]
    assert {w.kind for w in woke} == {"sleep", "until", "signal"}
    assert any(w.seen for w in woke) and any(w.kind == "signal" and not w.seen and w.timeout for w in woke)
    lines = [line for r in results for line in r.actions]
    for path in ("manager", "client", "cli"):
        assert any(f"via {path}: accepted" in line for line in lines), path
    assert any("(ended) via" in line and ": refused" in line for line in lines)
    assert any("(unknown) via" in line and ": refused" in line for line in lines)
    # The CLI's resume and rewind take a reason: the simulation's calls must run them.
    assert not any("TypeError" in line for line in lines), [line for line in lines if "TypeError" in line]


def _signal(number: int, *, outcome: str = "accepted", at: float = 1.0) -> SentSignal:
    signal = SentSignal(number, PID, "go", "client", "waiting", at, at)
    signal.returned(outcome, "", at)  # type: ignore[arg-type]
    return signal


def _woke(seen: tuple[int, ...] = (), *, wake_at: float | None = None, wall: float = 100.0) -> Woke:
    return Woke(
        PID,
        "signal" if wake_at is None else "sleep",
        "go" if wake_at is None else None,
        False,
        0.0,
        wake_at,
        tuple(("go", n) for n in seen),
        50.0,
        wall,
        (),
    )


def test_the_wait_checks_report_what_the_guarantees_forbid() -> None:
    first, second = _signal(1), _signal(2, at=2.0)
    twice = WaitLog([_woke((1,)), _woke((2,))], {PID: [1, 2, 1]})
    assert any("more than once" in p for p in check_waits([first, second], [], twice, []))
    reversed_order = WaitLog([_woke((2,)), _woke((1,))], {PID: [2, 1]})
    assert any("before sig#1" in p for p in check_waits([first, second], [], reversed_order, []))
    skipped = WaitLog([_woke((2,))], {PID: [2]})
    assert any("never sig#1" in p for p in check_waits([first, second], [], skipped, []))
    early = WaitLog([_woke(wake_at=200.0, wall=150.0)], {})
    assert any("before its wake-up time" in p for p in check_waits([], [], early, []))
    unsignalled = WaitLog([_woke()], {})
    assert any("no timeout" in p for p in check_waits([], [], unsignalled, []))
    refused = _signal(3, outcome="refused")
    assert any("refused" in p for p in check_waits([refused], [], WaitLog([_woke((3,))], {}), []))
    fine = WaitLog([_woke((1,)), _woke((2,)), _woke(wake_at=200.0, wall=200.0)], {PID: [1, 2]})
    assert check_waits([first, second], [], fine, []) == []


def test_cli_commands_running_at_once_keep_their_own_store_and_output() -> None:
    """Two operators' commands at once (a signal's, a cancel's): each opens its own store
    and prints to its own buffer, and both leave the CLI's opener and stdout as they were."""
    opener, stdout = cli_common.open_state_store, sys.stdout  # type: ignore[attr-defined]

    async def main() -> tuple[str, str]:
        names = [f"cli-at-once-{uuid.uuid4().hex[:8]}" for _ in range(2)]
        processes = [Process(name, [], random.Random(0)) for name in ("a", "b")]
        stores = [ProcessStore(MemoryStore(n), p) for n, p in zip(names, processes, strict=True)]
        gc_args = {"older_than": 0.0, "dry_run": True, "output": None, "as_json": False}
        # The first command starts first and ends first, while the second runs.
        processes[0].pause_for(2.0)
        processes[1].pause_for(5.0)
        first = asyncio.ensure_future(run_cli(stores[0], "gc", **gc_args))
        await asyncio.sleep(1.0)
        second = await run_cli(stores[1], "gc", **gc_args)
        assert first.done()
        for name in names:
            MemoryStore.forget(name)
        return first.result(), second

    first, second = run_simulated(main())
    assert first and second
    assert cli_common.open_state_store is opener and sys.stdout is stdout  # type: ignore[attr-defined]
