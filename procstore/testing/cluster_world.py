"""The world a `ClusterSimulation` runs its own procedures against, and those procedures.

`Ledger` is a fake of the systems steps touch: each step of a `Job` sets one effect, and
a rollback removes every effect of its procedure. A step acts only in a running process
that still holds its lease (it calls `ctx.check_lease()` first, as a step with side
effects should), so a zombie cannot act until it is resumed and finds its lease gone.

A `Job` has a few steps, may fail at a planned step, may run children (ids chosen and
stored before they are named, so a replay names the same ones), and may hold lock keys
from a small set, so that concurrent jobs contend.
"""

from __future__ import annotations

import asyncio
import random
from dataclasses import dataclass, field
from typing import Any

import orjson

from procstore.ids import ProcedureId
from procstore.lock_key import LockKey, StringKey
from procstore.procedure import Context, Procedure, ProcedureWithId, Status
from procstore.testing.cluster_store import Process

RESOURCES = ("table/1", "table/2", "table/3")
"""The lock keys jobs contend for."""


@dataclass
class Ledger:
    """Effects of steps, per procedure, and the order in which they were applied."""

    effects: dict[str, set[int]] = field(default_factory=dict)
    events: list[str] = field(default_factory=list)

    async def apply(self, process: Process, ctx: Context, step: int, work: float = 0.0) -> None:
        """Do step `step`'s work (`work` virtual seconds), then set its effect."""
        await asyncio.sleep(work)
        await process.wait_running()
        ctx.check_lease()
        self.effects.setdefault(str(ctx.procedure_id), set()).add(step)
        self.events.append(f"{process.name} applied {ctx.procedure_id} step {step}")

    async def undo(self, process: Process, ctx: Context) -> None:
        await process.wait_running()
        ctx.check_lease()
        self.effects.pop(str(ctx.procedure_id), None)
        self.events.append(f"{process.name} undid {ctx.procedure_id}")


class Job(Procedure):
    """A procedure of the simulation's own world (see the module's docstring)."""

    type_name = "sim.job"

    def __init__(self, data: dict[str, Any], ledger: Ledger | None = None, process: Process | None = None) -> None:
        self.data = data
        self.ledger = ledger
        self.process = process

    @property
    def rollback_supported(self) -> bool:  # type: ignore[override]
        return bool(self.data.get("rollback", False))

    def dump(self) -> str:
        return orjson.dumps(self.data).decode()

    def lock_key(self) -> LockKey:
        keys = [StringKey.exclusive(k) for k in self.data.get("locks", [])]
        return LockKey(keys)

    def _acting(self) -> tuple[Ledger, Process]:
        assert self.ledger is not None and self.process is not None, "a Job runs with its world attached"
        return self.ledger, self.process

    async def execute(self, ctx: Context) -> Status:
        ledger, process = self._acting()
        d = self.data
        at = int(d["at"])
        if d.get("kids") and d.get("waited"):
            states = [ctx.provider.procedure_state(ProcedureId.parse(k)) for k in d["kids"]]
            failed = [s for s in states if s is not None and s.is_failed()]
            if failed:
                raise RuntimeError(f"{len(failed)} child(ren) failed: " + "; ".join(str(s.error) for s in failed))
        await ledger.apply(process, ctx, at, float(d.get("work", 0.0)))
        if at == d.get("fail_at", -1):
            raise RuntimeError(f"planned failure at step {at}")
        if d.get("children", 0) and at == 0 and not d.get("kids"):
            d["kids"] = [str(ProcedureId.random()) for _ in range(int(d["children"]))]
            return Status.executing(persist=True)
        if d.get("kids") and not d.get("waited"):
            d["waited"] = True
            kids = [
                ProcedureWithId(ProcedureId.parse(k), Job(child_data(d, i), ledger, process))
                for i, k in enumerate(d["kids"])
            ]
            return Status.suspended(kids, persist=True)
        d["at"] = at + 1
        if d["at"] >= int(d["steps"]):
            return Status.done()
        return Status.executing(persist=True)

    async def rollback(self, ctx: Context) -> None:
        ledger, process = self._acting()
        await ledger.undo(process, ctx)


def child_data(parent: dict[str, Any], index: int) -> dict[str, Any]:
    return {
        "steps": 2,
        "at": 0,
        "rollback": parent.get("rollback", False),
        "name": f"{parent.get('name')}.{index}",
        "work": parent.get("work", 0.0),
    }


def new_job(rng: random.Random, name: str) -> dict[str, Any]:
    """A job's submitted state, drawn from `rng`."""
    return {
        "name": name,
        "steps": rng.randint(1, 4),
        "at": 0,
        "fail_at": rng.choice([-1, -1, -1, 0, 1]),
        "children": rng.choice([0, 0, 1, 2]),
        "rollback": rng.random() < 0.5,
        "locks": sorted(set(rng.sample(RESOURCES, rng.randint(0, 2)))),
        "work": round(rng.uniform(0.5, 8), 2),
    }


def job_loader(ledger: Ledger, process: Process) -> Any:
    """The loader a manager of `process` registers for `Job`."""
    return lambda data: Job(orjson.loads(data), ledger, process)
