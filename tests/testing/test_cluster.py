"""The cluster simulation: seeded whole-cluster runs, replayable, checked against a model."""

from __future__ import annotations

import asyncio
import io
import os
import random
import re
import subprocess
import sys

import pytest

from procstore import ProcedureManager, ProcedureWithId
from procstore.store import StateStore
from procstore.testing import (
    ClusterSimulation,
    LedgerWorld,
    MemoryStore,
    Process,
    ProcessStore,
    run_simulated,
)
from procstore.testing.simulate import main, run_seeds, simulation_for

SEEDS = int(os.environ.get("PROCSTORE_SIM_SEEDS", "200"))
"""Seeds of the ledger world for the many-seeds test (about 7 seeds/s; the machines world
runs 70% as many, at about 15 seeds/s): a few hundred in all, well within CI's 3 minutes."""

KNOWN_FINDINGS: dict[str, list[int]] = {
    "ledger": [],
    "machines": [],
}
"""Seeds where the simulation still reports a problem on this code: replay one with `python
-m procstore.testing.simulate --world W --seed S`. Each is an open finding to fix."""

FIRST_SEED = {"ledger": 100, "machines": 0}

FIXED_FINDINGS = {
    "ledger": [
        *[68, 536, 894, 954, 1030, 1031, 1065, 1350, 1839, 1967, 2249, 3063, 3409, 3555],
        *[14188, 31084, 52723, 53863],
        *[4, 5, 60, 19, 95, 326, 192, 600609, 601827, 601995],
        6000266,
        7320600,
    ],
    "machines": [283, 626, 5613, 6152, 6584, 36408, 80963, 5100407],
}
"""Seeds outside the many-seeds range where the simulation found a break that is fixed now:
a loaded procedure ended at its lock wait (68, 536), a deletion of an ended run taking a
later run's keys (894, 954, 1839), a parent going on past a child whose end was not stored
(1031, 1350), a restart superseding a run that ended unrecorded (1967), a recovered end's
record lost to one store error (1065), a rewind beside a submit still backing off (machines
283), a failed root kept only for a refused resume nudge (1030), a deletion of a rewound
procedure cut short (3063), a resume as stored given an end record (3555), a rewind of a
stuck run (machines 6152), recovery's deletion given up after one store error (machines
36408), a migration resumed from its stored state after another one moved its region
(machines 6584: its run's end was refused by the store, which let go of its lock), a
deposed leader's late `.rollback` beside the new leader's step read as the end of the run
it committed (14188), an operator's resume running again an ended run whose `0.step` a
late write re-created (52723), a root whose failure the store refused deleting the child
its step had just created, which the next leader created again (machines 80963: a child
that had ended would have run twice); and false reports of the model or a world (2249,
3409, 31084, 626, 5613; 53863: the run ended while a leader paused by a fault armed before
the heal still held an inherited failed tree's deletion, and a failed folder counted as
kept though `keep_failed` was off). Signals (issue 38): `Client.signal` calling a lost
answer a refusal though the signal was stored and delivered (4, 5, 60), back-to-back
signals of one sender delivered out of order when its clock read the same twice (19, 95,
326); and false reports of the model or world, found with the draws of the simulator
before commit c9c5e1d (those seeds now draw other runs): a burst's later signals judged by
a target's state read before the first one's send blocked (192), a failure recorded right
above a `.commit` that landed late read as a finished run coming back (600609), two sends
at one virtual instant taken as ordered (601827), a chain of lock holders each sleeping
minutes outlasting the heal's deadline (601995). A deletion's failed request landing after the
child it deleted was created again by its parent's next run, taking the new run's `0.step`
(6000266). An operator's rewind whose copy landed with its answer lost, raising before it
recorded the run it superseded, which so never got its end record (7320600). A false report of the heal (machines
5100407): a kept failed root whose end record the store refused past its retries is recorded
by the next start, as documented, and the heal took the cluster for settled before its
restart. Since half the managers send what the rules let overlap at once (as on S3), the
seeds found before that draw the same schedules, but their requests interleave otherwise."""


class Complaining(LedgerWorld):
    """A world whose invariant always fails: what a user's failing check looks like."""

    async def check(self, store: StateStore, outcomes: dict[str, str]) -> list[str]:
        return [*await super().check(store, outcomes), "the world is upside down"]


def _replayed(seed: int) -> str:
    """What the replay command prints for `seed` (a fresh process, as a user replays it),
    without what no seed decides: a store probe's random name, and the real wall clock
    that history records' and signals' names carry (and a signal's random token, which
    orders nothing: one process's signals carry distinct times)."""
    command = [sys.executable, "-m", "procstore.testing.simulate", "--world", "ledger", "--seed", str(seed)]
    printed = subprocess.run(command, capture_output=True, text=True, check=False, timeout=120).stdout
    return re.sub(
        r"probe-[0-9a-f]+|history/[0-9]+-|/[0-9]{20}-[0-9a-f]{8}\.json|[0-9.]+ seeds/s|in [0-9.]+s", "", printed
    )


def test_a_seed_replays_the_same_run() -> None:
    first = _replayed(5)
    assert "schedule" in first and " landed" in first and "replay: python -m procstore.testing.simulate" in first
    assert _replayed(5) == first


_EVERY_STEP = """
import hashlib, re, sys
from procstore.testing.simulate import simulation_for
for seed in range(1, 21):
    result = simulation_for("ledger").run(seed)
    ops = (f"{op.at:.6f} {op.process} {op.kind} {op.key} {op.landed} {op.created}" for op in result.log)
    steps = re.sub(sys.argv[1], "", "\\n".join([*result.actions, *ops]))
    print(seed, len(result.log), hashlib.sha256(steps.encode()).hexdigest())
"""


def test_twenty_seeds_in_two_processes_take_the_same_steps() -> None:
    """Every action and store operation of twenty seeds, run one after another in each of two
    processes at once, is the same in both: nothing a seed does depends on where objects sit
    in memory (a set of tasks cancelled in its order), on the real clock's fraction of a
    second at its start, or on the seeds run before it in the process."""
    unseeded = r"probe-[0-9a-f]+|[0-9]{20}-[0-9a-f]{8}|history/[0-9]+-|[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9:.]+Z?"
    command = [sys.executable, "-c", _EVERY_STEP, unseeded]
    runs = [subprocess.Popen(command, stdout=subprocess.PIPE, text=True) for _ in range(2)]
    first, second = (run.communicate(timeout=300)[0].splitlines() for run in runs)
    assert len(first) == 20 and all(int(line.split()[1]) > 50 for line in first), first
    assert first == second, [a.split()[0] for a, b in zip(first, second, strict=True) if a != b]


def test_a_failure_names_the_seed_the_schedule_and_the_replay() -> None:
    result = ClusterSimulation(Complaining, actions=8, replay="replay {seed}").run(3)
    assert not result.ok
    report = result.report()
    assert report.startswith("seed 3: ")
    assert "the world is upside down" in report
    assert "schedule" in report and "managers" in report
    assert report.rstrip().endswith("replay: replay 3")


def test_a_paused_process_lands_its_write_only_once_resumed() -> None:
    async def main() -> None:
        name = f"pause-{random.getrandbits(32)}"
        store = MemoryStore(name)
        process = Process("m0", [], random.Random(0))
        view = ProcessStore(store, process)
        process.pause_for(30.0)
        write = asyncio.ensure_future(view.put_if_absent("k", b"v"))
        await asyncio.sleep(29.0)
        assert await store.get("k") is None and not write.done()
        await asyncio.sleep(2.0)
        assert await write and await store.get("k") == b"v"
        assert [op.process for op in process.log] == ["m0"]
        MemoryStore.forget(name)

    run_simulated(main(), seed=1)


def test_a_world_reaches_the_process_and_its_store() -> None:
    attached: list[str] = []
    made: list[str] = []

    class Watching(LedgerWorld):
        def attach(self, manager: ProcedureManager, process: Process, store: StateStore) -> None:
            attached.append(process.name)
            super().attach(manager, process, store)

        async def new_procedure(
            self, rng: random.Random, name: str, process: Process, store: StateStore
        ) -> ProcedureWithId:
            submitted = await super().new_procedure(rng, name, process, store)
            made.append(process.name)
            return submitted

    ClusterSimulation(Watching, actions=6).run(11)
    assert attached[:2] == ["m0", "m1"]
    assert made and set(made) <= set(attached)


@pytest.mark.parametrize("world", sorted(FIXED_FINDINGS))
def test_the_fixed_findings_stay_fixed(world: str) -> None:
    command = [sys.executable, "-m", "procstore.testing.simulate", "--world", world, "--seed"]
    result = subprocess.run(
        command + [str(s) for s in FIXED_FINDINGS[world]], capture_output=True, text=True, timeout=600
    )
    assert result.returncode == 0, result.stdout[-20000:] + result.stderr[-5000:]


def test_the_command_runs_seeds_and_prints_the_rate() -> None:
    out = io.StringIO()
    failed = run_seeds(simulation_for("ledger"), iter(range(2)), out)
    assert "2 seeds in " in out.getvalue() and "seeds/s" in out.getvalue()
    assert failed == out.getvalue().count(" problem(s)")
    assert main(["--world", "ledger", "--seed", "0"]) in (0, 1)


@pytest.mark.parametrize(("world", "seeds"), [("ledger", SEEDS), ("machines", SEEDS * 7 // 10)])
def test_many_seeds_find_nothing(world: str, seeds: int) -> None:
    """The command users run, in a fresh process (a replay is exact there).
    Seeds it still fails on are listed in KNOWN_FINDINGS, for the next change to fix."""
    command = [sys.executable, "-m", "procstore.testing.simulate", "--world", world, "--seeds", str(seeds)]
    command += ["--first", str(FIRST_SEED[world])]
    result = subprocess.run(command, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stdout[-20000:] + result.stderr[-5000:]
