"""The world a `ClusterSimulation` runs its own procedures against, and those procedures.

`Ledger` is a fake of the systems steps touch: each step of a `Job` sets one effect, and
a rollback removes every effect of its procedure. A step acts only in a running process
that still holds its lease (it calls `ctx.check_lease()` first, as a step with side
effects should), so a zombie cannot act until it is resumed and finds its lease gone.

A `Job` has a few steps, may fail at a planned step, may run children (ids chosen and
stored before they are named, so a replay names the same ones), and may hold lock keys
from a small set, so that concurrent jobs contend. Between two steps it may wait durably:
sleep (`Status.sleep`, seconds to minutes, stored or not; `Status.sleep_until`) or wait for
a signal (`Status.wait_for_signal`, with or without a timeout). The call of `execute` after
a wait records what it saw in the ledger's `WaitLog` (see `cluster_waits`), and the
signals it consumed stay in the job's state.
"""

from __future__ import annotations

import asyncio
import random
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import orjson

from procstore.ids import ProcedureId
from procstore.lock_key import LockKey, StringKey
from procstore.procedure import Context, Procedure, ProcedureWithId, Status
from procstore.testing.cluster_store import Process
from procstore.testing.cluster_waits import WaitLog, Woke, payload_number

RESOURCES = ("table/1", "table/2", "table/3")
"""The lock keys jobs contend for."""

SIGNAL_NAMES = ("go", "stop")
"""The signals jobs wait for: two, so that one of another name waits for its own wait."""


@dataclass
class Ledger:
    """Effects of steps, per procedure, and the order in which they were applied."""

    effects: dict[str, set[int]] = field(default_factory=dict)
    events: list[str] = field(default_factory=list)
    waits: WaitLog = field(default_factory=WaitLog)

    async def apply(self, process: Process, ctx: Context, step: int, work: float = 0.0) -> None:
        """Do step `step`'s work (`work` virtual seconds), then set its effect."""
        await asyncio.sleep(work)
        await process.wait_running()
        ctx.check_lease()
        self.effects.setdefault(str(ctx.procedure_id), set()).add(step)
        self.events.append(f"{process.name} applied {ctx.procedure_id} step {step}")

    async def woke(self, process: Process, ctx: Context, wait: dict[str, Any], consumed: list[int]) -> None:
        """Record what the call of `execute` after `wait` sees, once it may act."""
        await process.wait_running()
        ctx.check_lease()
        loop = asyncio.get_running_loop()
        seen = tuple((name, payload_number(payload)) for name, payload in sorted(ctx.signals.items()))
        self.waits.woke.append(
            Woke(
                str(ctx.procedure_id),
                str(wait["kind"]),
                wait.get("name"),
                bool(wait.get("timeout")),
                float(wait["began"]),
                wait.get("wake"),
                seen,
                loop.time(),
                time.time(),
                tuple(consumed),
            )
        )

    def ended(self, ctx: Context, consumed: list[int]) -> None:
        self.waits.consumed[str(ctx.procedure_id)] = list(consumed)

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
        if d.get("pending") is not None:
            await self._woke(ctx, d)
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
            ledger.ended(ctx, d.get("got", []))
            return Status.done()
        wait = d.get("waits", {}).get(str(d["at"]))
        if wait is not None:
            return _wait(d, wait)
        return Status.executing(persist=True)

    async def _woke(self, ctx: Context, d: dict[str, Any]) -> None:
        """The call after a wait: record what it saw, and keep the signal it consumed."""
        ledger, process = self._acting()
        await ledger.woke(process, ctx, d["pending"], d.get("got", []))
        d["got"] = [*d.get("got", []), *(n for n in map(payload_number, ctx.signals.values()) if n is not None)]
        d["pending"] = None

    async def rollback(self, ctx: Context) -> None:
        ledger, process = self._acting()
        await ledger.undo(process, ctx)


def _wait(d: dict[str, Any], plan: list[Any]) -> Status:
    """The durable wait `plan` (drawn by `new_wait`) as a status, with what the call after it
    checks (when it began, and when it ends by itself by this clock) kept in the state."""
    kind = str(plan[0])
    now = time.time()
    pending: dict[str, Any] = {"kind": kind, "began": asyncio.get_running_loop().time()}
    if kind == "sleep":
        seconds, persist = float(plan[1]), bool(plan[2])
        d["pending"] = pending | {"wake": now + seconds}
        return Status.sleep(seconds, persist=persist)
    if kind == "until":
        when = now + float(plan[1])
        d["pending"] = pending | {"wake": when}
        return Status.sleep_until(datetime.fromtimestamp(when, UTC) if plan[2] else when)
    name, timeout = str(plan[1]), plan[2]
    wake = None if timeout is None else now + float(timeout)
    d["pending"] = pending | {"name": name, "timeout": timeout is not None, "wake": wake}
    return Status.wait_for_signal(name, timeout=timeout)


def new_wait(rng: random.Random, *, long: bool) -> list[Any]:
    """A durable wait between two steps: a sleep of seconds (or, if `long`, up to minutes;
    stored, mostly), a sleep until a time (as seconds or an aware datetime), or a signal's
    wait (a timeout or not)."""
    weights = [60, 30, 10] if long else [1, 0, 0]
    seconds = rng.choices([rng.uniform(0.5, 20), rng.uniform(20, 120), rng.uniform(120, 420)], weights)[0]
    kind = rng.choices(["sleep", "until", "signal"], [35, 15, 50])[0]
    if kind == "sleep":
        return ["sleep", round(seconds, 2), rng.random() < 0.85]
    if kind == "until":
        return ["until", round(seconds, 2), rng.random() < 0.5]
    timeout = None if rng.random() < 0.5 else round(seconds, 2)
    return ["signal", rng.choice(SIGNAL_NAMES), timeout]


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
    data: dict[str, Any] = {
        "name": name,
        "steps": rng.randint(1, 4),
        "at": 0,
        "fail_at": rng.choice([-1, -1, -1, 0, 1]),
        "children": rng.choice([0, 0, 1, 2]),
        "rollback": rng.random() < 0.5,
        "locks": sorted(set(rng.sample(RESOURCES, rng.randint(0, 2)))),
        "work": round(rng.uniform(0.5, 8), 2),
    }
    # A sleeper keeps its locks: jobs that contend sleep seconds, so that a chain of them
    # ends within the heal's deadline.
    long = not data["locks"]
    waits = {str(k): new_wait(rng, long=long) for k in range(1, int(data["steps"])) if rng.random() < 0.35}
    if waits:
        data["waits"] = waits
    return data


def job_loader(ledger: Ledger, process: Process) -> Any:
    """The loader a manager of `process` registers for `Job`."""
    return lambda data: Job(orjson.loads(data), ledger, process)
