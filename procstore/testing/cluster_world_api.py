"""What a `ClusterSimulation` needs from a world: the procedures, their fakes, and checks.

A world is the user's part of a simulation: the systems their steps touch (fakes, which
may keep their state in the simulation's store), how to make a new procedure, and the
invariants of those systems. `LedgerWorld` is the simulation's own.
"""

from __future__ import annotations

import random
from typing import Protocol

from procstore._runtime.manager import ProcedureManager
from procstore.procedure import ProcedureWithId
from procstore.store.state_store import StateStore
from procstore.testing.cluster_store import Process
from procstore.testing.cluster_waits import WaitLog
from procstore.testing.cluster_world import SIGNAL_NAMES, Job, Ledger, job_loader, new_job


class World(Protocol):
    """The user's part of a cluster simulation.

    Optional: `signal_names`, the names of the signals its procedures wait for, which the
    schedule sends to procedures not waiting yet (to one that waits: the name it waits
    for); and `waits`, a `cluster_waits.WaitLog` of what its procedures saw after their
    durable waits, which the simulation then checks."""

    async def prepare(self, store: StateStore) -> None:
        """Build the world's initial state (in `store` if it lives there) before any manager starts."""

    def attach(self, manager: ProcedureManager, process: Process, store: StateStore) -> None:
        """Register the procedures' loaders on `manager`, whose steps run in `process` and
        reach the store through `store` (a fake kept in the store should use it, so that
        the process's pauses and faults reach it; a fake kept in memory should
        `await process.wait_running()` before it acts)."""

    async def new_procedure(
        self, rng: random.Random, name: str, process: Process, store: StateStore
    ) -> ProcedureWithId:
        """A new root procedure to submit, drawn from `rng`; it runs first in `process`,
        the submitter's (its view of the store: `store`)."""

    async def check(self, store: StateStore, outcomes: dict[str, str]) -> list[str]:
        """The world's invariants once everything has ended: `outcomes` maps each root
        procedure id to how its last run ended (`done` or `failed`); returns what is wrong."""


class LedgerWorld:
    """The simulation's own world: `Job`s acting on a `Ledger` (see `cluster_world`)."""

    signal_names = SIGNAL_NAMES

    def __init__(self) -> None:
        self.ledger = Ledger()
        self.jobs: dict[str, dict[str, object]] = {}

    @property
    def waits(self) -> WaitLog:
        """What its jobs saw after their durable waits (see `cluster_waits.RecordsWaits`)."""
        return self.ledger.waits

    async def prepare(self, store: StateStore) -> None:
        self.ledger = Ledger()
        self.jobs = {}

    def attach(self, manager: ProcedureManager, process: Process, store: StateStore) -> None:
        manager.register_loader(Job.type_name, job_loader(self.ledger, process))

    async def new_procedure(
        self, rng: random.Random, name: str, process: Process, store: StateStore
    ) -> ProcedureWithId:
        data = new_job(rng, name)
        submitted = ProcedureWithId.new(Job(dict(data), self.ledger, process))
        self.jobs[str(submitted.id)] = dict(data)
        return submitted

    async def check(self, store: StateStore, outcomes: dict[str, str]) -> list[str]:
        problems = []
        for pid, outcome in sorted(outcomes.items()):
            data = self.jobs.get(pid)
            if data is None:
                continue
            effects = self.ledger.effects.get(pid, set())
            if outcome == "done" and effects != set(range(int(str(data["steps"])))):
                problems.append(f"{pid}: committed, but the ledger holds the effects of steps {sorted(effects)}")
            if outcome == "failed" and data.get("rollback") and effects:
                problems.append(f"{pid}: rolled back, but the ledger still holds steps {sorted(effects)}")
        return problems
