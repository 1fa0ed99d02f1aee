"""`ClusterSimulation`: several managers, operators, pauses, faults and time in one seeded run.

Each run, on a `SimulatedLoop` (virtual time: no real sleeps) and one in-memory store:

- 2-3 `ProcedureManager`s under a `Lease`, each reaching the store through its own
  `ProcessStore` (see `cluster_store`), with history on;
- a schedule drawn from the seed: submits (several at once, trees, lock keys), a manager
  killed (now, or at one of its next store operations) and restarted, paused past its TTL
  and resumed (a zombie whose in-flight writes land late), store faults (errors, answers
  lost after the write landed, slow writes, writes that land after their caller gave up,
  write outages), operator requests through the public API and the CLI's code (cancel,
  fail, resume, rewind, delete, gc), signals (see `cluster_signals`) to waiting, unfinished,
  ended and unknown procedures, expiry of finished metadata, the wall clock moved forward,
  and lulls of minutes, so that a run covers its procedures' long durable sleeps;
- then every process is healed (resumed, faults off, the dead restarted), each procedure
  still waiting for a signal is sent one, and the cluster is given a virtual deadline to
  finish everything;
- and the invariants are checked (see `cluster_checks`, and `cluster_waits` for durable
  waits and signals), with the world's own.

The same seed replays the same run. A failing run's `report()` names the seed, the
schedule (actions and the store's changes, in order) and the command that replays it.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import random
import uuid
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any

import click

from procstore._client.inventory import status_of_keys
from procstore._runtime.lease import Lease
from procstore._runtime.manager import ProcedureManager
from procstore.errors import ProcedureError, ProcedureFailed
from procstore.ids import ProcedureId
from procstore.store.folder import ProcedureKeys, StoredStatus, decode_or_problem, latest_key
from procstore.store.history import HISTORY_PATH, History
from procstore.store.keys import PROC_PATH, ParsedKey
from procstore.store.memory import MemoryStore
from procstore.store.message import ProcedureMessage
from procstore.store.requests import REQUESTS_PATH, RESUME_PATH
from procstore.store.signals import SIGNALS_PATH
from procstore.testing.cluster_checks import Model, OperatorAction, check_requests, check_runs, runs_from_log
from procstore.testing.cluster_clock import VirtualClocks
from procstore.testing.cluster_history import records_by_procedure
from procstore.testing.cluster_operator import run_cli
from procstore.testing.cluster_signals import PATHS, choose_target, send, waiting_for
from procstore.testing.cluster_store import Armed, Effect, LoggedOp, Process, ProcessStore
from procstore.testing.cluster_waits import RecordsWaits, SentSignal, Target, check_waits
from procstore.testing.cluster_world_api import LedgerWorld, World
from procstore.testing.kill import kill_manager
from procstore.testing.simulation import derived_seed, run_simulated

TTL = 10.0
"""The lease's TTL in the simulation (virtual seconds): pauses are drawn around it."""

RECORDED = (PROC_PATH, REQUESTS_PATH, HISTORY_PATH)
"""The store's folders whose changes a schedule shows (not the lease's renewals, nor the world's)."""


@dataclass
class SimulationResult:
    """One seeded run: what went wrong (nothing if `ok`), and what happened."""

    seed: int
    problems: list[str]
    actions: list[str]
    log: list[LoggedOp]
    replay: str

    @property
    def ok(self) -> bool:
        return not self.problems

    def schedule(self, limit: int = 80) -> list[str]:
        """The actions and the store's changes, in order, shortened to the procedures
        the problems name (all of them if none is named)."""
        named = {w for p in self.problems for w in p.replace(":", " ").split() if len(w) == 36}
        ops = [
            (op.at, op.line())
            for op in self.log
            if op.key.startswith(RECORDED)
            and (not named or any(n in op.key for n in named) or op.key.startswith(REQUESTS_PATH))
        ]
        acts = [(float(a.split()[0]), a) for a in self.actions]
        lines = [line for _, line in sorted(acts + ops, key=lambda x: x[0])]
        if len(lines) > limit:
            lines = [*lines[: limit // 2], f"   ... {len(lines) - limit} more ...", *lines[-limit // 2 :]]
        return lines

    def report(self, *, full: bool = False) -> str:
        """The seed and its problems, the schedule and the replay command; for a run that
        found nothing, one line unless `full`."""
        if self.ok and not full:
            return f"seed {self.seed}: ok"
        return "\n".join(
            [
                f"seed {self.seed}: {len(self.problems)} problem(s)" if self.problems else f"seed {self.seed}: ok",
                *(f"  - {p}" for p in self.problems),
                "  schedule (virtual seconds; actions, and the store's changes):",
                *(f"    {line}" for line in self.schedule()),
                f"  replay: {self.replay}",
            ]
        )


@dataclass
class _Slot:
    """One manager's place in the cluster: its current process and manager."""

    index: int
    manager: ProcedureManager
    process: Process
    generation: int = 0


@dataclass
class _Run:
    """The state of one seeded run."""

    seed: int
    rng: random.Random
    store: MemoryStore
    clocks: VirtualClocks
    world: World
    keep_failed: bool
    metadata_ttl: float
    log: list[LoggedOp] = field(default_factory=list)
    actions: list[str] = field(default_factory=list)
    slots: list[_Slot] = field(default_factory=list)
    model: Model = field(default_factory=Model)
    tasks: list[asyncio.Task[Any]] = field(default_factory=list)
    names: int = 0
    sent: list[SentSignal] = field(default_factory=list)
    healed: set[tuple[str, str]] = field(default_factory=set)
    """The (procedure, latest key) the heal has seen to: no wait, or a signal sent to it."""

    def note(self, text: str) -> None:
        self.actions.append(f"{asyncio.get_running_loop().time():9.2f}  {text}")

    def spawn(self, coro: Coroutine[Any, Any, Any], name: str) -> None:
        self.tasks.append(asyncio.get_running_loop().create_task(coro, name=name))


class ClusterSimulation:
    """Seeded whole-cluster runs of a world's procedures (see the module's docstring).

    Args:
        world: a factory of the `World` to run (`LedgerWorld` by default); one per run.
        actions: how many scheduled actions a run draws.
        deadline: virtual seconds the healed cluster has to end everything.
        replay: the command line that replays a seed, with `{seed}` in it.
    """

    def __init__(
        self,
        world: Callable[[], World] = LedgerWorld,
        *,
        actions: int = 24,
        deadline: float = 1200.0,
        replay: str = "python -m procstore.testing.simulate --world ledger --seed {seed}",
    ) -> None:
        self.world = world
        self.actions = actions
        self.deadline = deadline
        self.replay = replay

    def run(self, seed: int) -> SimulationResult:
        """One seeded run (its own event loop: call it from synchronous code)."""
        # The garbage collector finalizes async generators by scheduling callbacks, at
        # moments that depend on everything else the process allocated: off during a run,
        # so that the seed alone decides the order of what runs.
        gc.collect()
        gc.disable()
        try:
            return run_simulated(self._run(seed), seed=seed)
        finally:
            gc.enable()

    async def _run(self, seed: int) -> SimulationResult:
        loop = asyncio.get_running_loop()
        loop.set_exception_handler(lambda _loop, _context: None)  # killed processes' tasks
        rng = random.Random(derived_seed(seed, "cluster"))
        store = MemoryStore(f"cluster-sim-{seed}-{uuid.uuid4().hex[:8]}")
        run = _Run(
            seed,
            rng,
            store,
            VirtualClocks(loop),
            self.world(),
            keep_failed=rng.random() < 0.7,
            metadata_ttl=rng.choice([5.0, 60.0, 600.0]),
        )
        run.model.keep_failed = run.keep_failed
        quiet = logging.getLogger("procstore")
        level, quiet.level = quiet.level, logging.CRITICAL + 1
        try:
            with run.clocks.installed():
                problems = await self._simulate(run)
        finally:
            quiet.setLevel(level)
            MemoryStore.forget(store.name)
        return SimulationResult(seed, problems, run.actions, run.log, self.replay.format(seed=seed))

    async def _simulate(self, run: _Run) -> list[str]:
        await run.world.prepare(run.store)
        for index in range(run.rng.choice([2, 2, 3])):
            slot = _Slot(index, *self._new_manager(run, index, 0))
            run.slots.append(slot)
            await slot.manager.start()
        run.note(f"{len(run.slots)} managers, keep_failed={run.keep_failed}, metadata_ttl={run.metadata_ttl:.0f}s")
        lull = 0.0
        for _ in range(self.actions):
            await asyncio.sleep(run.rng.expovariate(1 / 4.0) + lull)
            lull = self._act(run)
        await self._heal(run)
        problems = await self._check(run)
        for slot in run.slots:
            with contextlib.suppress(BaseException):
                await asyncio.wait_for(slot.manager.stop(), 60)
        for task in run.tasks:
            task.cancel()
        return problems

    # -- the cluster ---------------------------------------------------------------------

    def _new_manager(self, run: _Run, index: int, generation: int) -> tuple[ProcedureManager, Process]:
        name = f"m{index}" + (f".{generation}" if generation else "")
        seed = run.rng.getrandbits(32)
        process = Process(name, run.log, random.Random(seed))
        store = ProcessStore(run.store, process)
        # Half the managers send what the rules let overlap at once, as on S3 and GCS (a
        # step's look for a request with its write, a submit's with its create); drawn
        # from the seed's bits, so that no other draw of the schedule moves.
        store.round_trips = bool(seed & 1)
        manager = ProcedureManager(
            store,
            lease=Lease(ttl=TTL, holder=name),
            history=History(),
            keep_failed=run.keep_failed,
            max_retry_times=3,
            retry_delay=0.2,
            max_retry_delay=2.0,
            metadata_ttl=run.metadata_ttl,
            request_poll_interval=1.0,
            telemetry=False,
        )
        run.world.attach(manager, process, store)
        process.on_crash = lambda _p: run.spawn(self._killed(run, index), f"sim:kill:{name}")
        return manager, process

    async def _killed(self, run: _Run, index: int) -> None:
        slot = run.slots[index]
        if slot.manager.is_running:
            run.note(f"{slot.process.name} died")
            await kill_manager(slot.manager)
        await asyncio.sleep(run.rng.uniform(0, 3 * TTL))
        await self._restart(run, slot)

    async def _restart(self, run: _Run, slot: _Slot) -> None:
        if slot.manager.is_running and not slot.process.dead:
            return
        slot.process.die()
        with contextlib.suppress(BaseException):
            await slot.manager.stop()
        slot.generation += 1
        slot.manager, slot.process = self._new_manager(run, slot.index, slot.generation)
        run.note(f"{slot.process.name} started")
        try:
            await slot.manager.start()
        except BaseException as e:
            run.note(f"{slot.process.name} failed to start: {e!r}"[:160])

    def _leader(self, run: _Run) -> _Slot | None:
        leaders = [s for s in run.slots if s.manager.is_leader and not s.process.dead]
        return run.rng.choice(leaders) if leaders else None

    # -- the schedule --------------------------------------------------------------------

    def _act(self, run: _Run) -> float:
        """Start one action drawn from the seed; returns the virtual seconds of a lull it
        draws (the schedule then waits that much longer before the next)."""
        rng = run.rng
        slot = rng.choice(run.slots)
        choice = rng.choices(
            ["submit", "arm", "pause", "crash", "outage", "operator", "expire", "clock", "signal", "lull"],
            [30, 22, 8, 6, 6, 22, 3, 3, 14, 2],
        )[0]
        if choice == "lull":
            seconds = rng.uniform(30, 300)
            run.note(f"a lull of {seconds:.0f}s")
            return seconds
        if choice == "signal":
            run.spawn(self._signal(run), "sim:signal")
        elif choice == "submit":
            run.spawn(self._submit(run, rng.randint(1, 3)), "sim:submit")
        elif choice == "arm":
            self._arm(run, slot)
        elif choice == "pause":
            seconds = rng.uniform(0.5, 9) * TTL
            run.note(f"{slot.process.name} paused for {seconds:.1f}s")
            slot.process.pause_for(seconds)
        elif choice == "crash":
            run.note(f"{slot.process.name} killed")
            slot.process.die()
        elif choice == "outage":
            seconds = rng.uniform(1, 15)
            slot.process.write_outage_until = asyncio.get_running_loop().time() + seconds
            run.note(f"{slot.process.name}: every write fails for {seconds:.1f}s")
        elif choice == "operator":
            run.spawn(self._operate(run), "sim:operator")
        elif choice == "expire":
            run.note(
                f"{slot.process.name}: remove_outdated_metadata() forgot {slot.manager.remove_outdated_metadata()}"
            )
        else:
            seconds = rng.uniform(60, 3600)
            run.clocks.move_wall_forward(seconds)
            run.note(f"wall clock moved forward {seconds:.0f}s")
        return 0.0

    def _arm(self, run: _Run, slot: _Slot) -> None:
        rng = run.rng
        ahead = rng.randint(1, 6)
        effects: list[tuple[Effect, float]] = [
            ("error", 0),
            ("lost", 0),
            ("slow", rng.uniform(0.5, 5)),
            ("late", rng.uniform(2, 30)),
            ("crash_before", 0),
            ("crash_after", 0),
            ("pause_before", rng.uniform(1, 9) * TTL),
            ("pause_after", rng.uniform(1, 9) * TTL),
        ]
        chosen = [rng.choice(effects) for _ in range(rng.choice([1, 1, 2]))]
        # Half the time, aim at one kind of key: a submit's first step, a commit, a record.
        match = rng.choice(["", "", "", "0000000000.step", ".commit", HISTORY_PATH])
        if rng.random() < 0.4:
            # A zombie at a write whose late landing matters: sent (its answer lost, or not)
            # and caught by a pause long past the lease; it lands after the new leader has
            # ended the procedure, and waited out `late_write_grace`, or not.
            match = rng.choice(["0000000000.step", ".commit", HISTORY_PATH])
            pause: tuple[Effect, float] = ("pause_before", rng.uniform(3, 15) * TTL)
            chosen = [("lost", 0), pause] if rng.random() < 0.5 else [pause]
        for i, (effect, seconds) in enumerate(chosen):
            slot.process.armed.append(Armed(effect, ahead + i, seconds, match))
            aim = f" on {match}" if match else ""
            run.note(f"{slot.process.name}: {effect} {seconds:.1f}s armed at its write +{ahead + i}{aim}")
        if match == ".commit" and any(effect == "late" for effect, _ in chosen):
            # A commit in flight, its retries failing for a moment: the failure is recorded
            # above it, and then it lands.
            seconds = rng.uniform(0.8, 2.5)
            slot.process.write_outage_until = asyncio.get_running_loop().time() + seconds
            run.note(f"{slot.process.name}: then every write fails for {seconds:.1f}s")
        elif rng.random() < 0.3:
            seconds = rng.uniform(1, 10)
            slot.process.write_outage_until = asyncio.get_running_loop().time() + seconds
            run.note(f"{slot.process.name}: then every write fails for {seconds:.1f}s")

    async def _submit(self, run: _Run, count: int) -> None:
        slot = self._leader(run)
        if slot is None:
            run.note("submit: no leader")
            return
        submitted = []
        for _ in range(count):
            run.names += 1
            submitted.append(
                await run.world.new_procedure(run.rng, f"p{run.names}", slot.process, slot.manager.store.store)
            )
        for p in submitted:
            run.model.roots.add(str(p.id))
        run.note(f"{slot.process.name}: submit {', '.join(str(p.id) for p in submitted)}")
        results = await asyncio.gather(*(slot.manager.submit(p) for p in submitted), return_exceptions=True)
        for p, result in zip(submitted, results, strict=True):
            if isinstance(result, BaseException):
                run.note(f"{slot.process.name}: submit {p.id} raised {type(result).__name__}")

    # -- signals -------------------------------------------------------------------------

    async def _signal(self, run: _Run, pid: str | None = None) -> None:
        """Send 1-3 signals in a row (each once the one before returned) to one procedure
        (`pid`, or one drawn: see `choose_target`), through one path, from one process."""
        rng = run.rng
        looked_at = asyncio.get_running_loop().time()
        stored = await _stored(run.store)
        names = tuple(getattr(run.world, "signal_names", ())) or ("go",)
        target: Target
        if pid is None:
            target, pid, name = await choose_target(rng, run.store, stored, names)
        else:
            keys = stored.get(pid)
            waited = None if keys is None else await waiting_for(run.store, keys)
            if keys is None:
                target = "unknown"
            elif latest_key(keys).key_type.value == "commit":
                target = "ended"
            else:
                target = "waiting" if waited is not None else "unfinished"
            name = waited or rng.choice(names)
        via = rng.choice(PATHS)
        slot = self._leader(run) if rng.random() < 0.7 else rng.choice(run.slots)
        slot = slot or rng.choice(run.slots)
        process = Process("sig", run.log, random.Random(rng.getrandbits(32)))
        if via != "manager" and rng.random() < 0.3:
            # The sender's own store faults: an error, a lost answer, a slow or late write.
            effect: Effect = rng.choice(["error", "lost", "slow", "late"])
            process.armed.append(Armed(effect, 1, rng.uniform(0.5, 10), SIGNALS_PATH))
            run.note(f"sig: {effect} armed at its first signal's write")
        for _ in range(rng.choice([1, 1, 2, 3])):
            await self._send(run, target, pid, name, via, slot, ProcessStore(run.store, process), looked_at)

    async def _send(
        self,
        run: _Run,
        target: Target,
        pid: str,
        name: str,
        via: str,
        slot: _Slot,
        store: ProcessStore,
        looked_at: float | None = None,
    ) -> SentSignal:
        now = asyncio.get_running_loop().time()
        signal = SentSignal(len(run.sent) + 1, pid, name, via, target, now, now if looked_at is None else looked_at)
        run.sent.append(signal)
        await send(signal, manager=slot.manager, store=store, payload={"sig": signal.number})
        run.actions.append(signal.line())
        return signal

    async def _signal_the_waiting(self, run: _Run, stored: dict[str, list[ParsedKey]]) -> None:
        """Heal: send each procedure whose latest step waits for a signal one of that name
        (once per step), so that a wait without a timeout ends too."""
        slot = self._leader(run)
        if slot is None:
            return
        for pid, keys in sorted(stored.items()):
            latest = latest_key(keys)
            if latest.key_type.value == "commit" or (pid, str(latest)) in run.healed:
                continue
            name = await waiting_for(run.store, keys)
            if name is not None:
                view = ProcessStore(run.store, slot.process)
                if (await self._send(run, "heal", pid, name, "manager", slot, view)).outcome != "accepted":
                    continue  # sent again at the next look
            run.healed.add((pid, str(latest)))

    # -- operators -----------------------------------------------------------------------

    async def _operate(self, run: _Run) -> None:
        rng = run.rng
        stored = await _stored(run.store)
        if not stored:
            return
        kind = rng.choices(["cancel", "fail", "resume", "rewind", "delete", "gc"], [25, 15, 15, 25, 8, 12])[0]
        # As an operator would: stop what runs, restart or delete what has ended; roots first.
        ended = [pid for pid, keys in stored.items() if latest_key(keys).key_type.value == "commit"]
        running = [pid for pid, keys in stored.items() if latest_key(keys).key_type.value == "step"]
        pool = ended if kind in ("resume", "rewind", "delete") else running
        pid = rng.choice([p for p in pool if p in run.model.roots] or pool or list(stored))
        via = "api" if kind in ("cancel", "resume", "rewind") and rng.random() < 0.5 else "cli"
        number = len(run.model.operator) + 1
        action = OperatorAction(number, kind, pid, via, asyncio.get_running_loop().time())
        run.model.operator.append(action)
        if kind == "delete":
            run.model.deleted.add(pid)
        if rng.random() < 0.3:  # a signal to the same procedure, meanwhile
            run.spawn(self._signal(run, pid), "sim:signal")
        reason = f"op#{number}"
        try:
            # A rewind goes back to a step in the middle, mostly: the first is rarely the point.
            latest = latest_key(stored[pid]).step
            low, high = min(1, latest), max(latest - 2, 0)
            step = rng.randint(0, latest) if rng.random() < 0.3 else (rng.randint(low, high) if low <= high else low)
            said = await self._request(run, action, reason, step)
            action.result = said[:160]
            if kind in ("cancel", "fail"):
                action.stored_at = asyncio.get_running_loop().time()
        except (ProcedureError, click.ClickException) as e:
            action.result = f"refused: {e}"[:200]
        except BaseException as e:
            action.result = f"unknown: {e!r}"[:200]
        run.actions.append(action.line())

    async def _request(self, run: _Run, action: OperatorAction, reason: str, step: int) -> str:
        pid = action.procedure_id
        if action.via == "cli":
            store = ProcessStore(run.store, Process("op", run.log, random.Random(0)))
            arguments: dict[str, Any] = {"procedure_id": pid}
            if action.kind in ("cancel", "fail"):
                arguments |= {"reason": reason, "yes": True}
            elif action.kind == "resume":
                arguments |= {"force": False, "reason": None}
            elif action.kind == "rewind":
                arguments |= {"to_step": step, "force": False, "reason": None, "yes": True}
            elif action.kind == "delete":
                arguments |= {"yes": True, "force": False}
            else:
                arguments = {"older_than": 0.0, "dry_run": False, "output": None, "as_json": False}
            return await run_cli(store, action.kind, **arguments)
        slot = self._leader(run) or run.rng.choice(run.slots)
        manager = slot.manager
        if action.kind == "cancel":
            await manager.cancel(ProcedureId.parse(pid), reason)
            return f"stored through {slot.process.name}"
        watcher = await (
            manager.resume(ProcedureId.parse(pid))
            if action.kind == "resume"
            else manager.rewind(ProcedureId.parse(pid), step)
        )
        run.spawn(_watch(action, watcher.wait()), "sim:watch")
        return f"restarted by {slot.process.name}" + (f" from step {step}" if action.kind == "rewind" else "")

    # -- the end -------------------------------------------------------------------------

    async def _heal(self, run: _Run) -> None:
        """Resume every process, end outages, restart the dead; wait for the cluster to end
        everything, up to the deadline (restarting every manager half way)."""
        loop = asyncio.get_running_loop()
        run.note("heal: faults off, every process resumed, the dead restarted")
        deadline = loop.time() + self.deadline
        restarted = False
        for slot in run.slots:
            slot.process.write_outage_until = 0.0
            slot.process.resume()
        while loop.time() < deadline:
            for slot in run.slots:
                # Faults already armed stay: each fires once, and a zombie made now is one too.
                slot.process.write_outage_until = 0.0
                if slot.process.dead or not slot.manager.is_running:
                    await self._restart(run, slot)
            stored = await _stored(run.store)
            await self._signal_the_waiting(run, stored)
            if not await _busy(run.store, run.model, stored) and all(t.done() for t in run.tasks):
                # Quiet: wait out the deletions and records a takeover postpones, then look again.
                await asyncio.sleep(Lease(ttl=TTL).late_write_grace + 2 * TTL)
                if not await _busy(run.store, run.model):
                    return
            if not restarted and loop.time() > deadline - self.deadline / 2:
                restarted = True
                run.note("heal: every manager restarted")
                for slot in run.slots:
                    slot.process.die()
            await asyncio.sleep(5.0)

    async def _check(self, run: _Run) -> list[str]:
        procedures = runs_from_log(run.log, run.model.roots)
        history = await records_by_procedure(run.store)
        stored = await _stored(run.store)
        left = [k for k in await _requests(run.store) if _requested_id(k) not in stored]
        problems = check_runs(procedures, history, stored, run.model)
        problems += check_requests(procedures, history, run.model, left)
        outcomes = {
            pid: str(proc.runs[-1].outcome)
            for pid, proc in procedures.items()
            if pid in run.model.roots and len(proc.runs) == 1 and proc.runs[0].outcome is not None
        }
        waits = run.world.waits if isinstance(run.world, RecordsWaits) else None
        problems += check_waits(run.sent, run.log, waits, run.model.operator)
        problems += await run.world.check(run.store, outcomes)
        return problems


async def _watch(action: OperatorAction, wait: Coroutine[Any, Any, object]) -> None:
    """Wait for the end of the run `action` began, and keep its error."""
    try:
        await wait
    except ProcedureFailed as e:
        action.ended_with = str(e)
    except ProcedureError:
        pass


async def _stored(store: MemoryStore) -> dict[str, list[ParsedKey]]:
    """The procedure keys `store` holds, by procedure id."""
    found: dict[str, list[ParsedKey]] = {}
    for key in await store.walk(PROC_PATH):
        parsed = ParsedKey.parse(PROC_PATH, key)
        if parsed is not None:
            found.setdefault(str(parsed.procedure_id), []).append(parsed)
    return found


async def _requests(store: MemoryStore) -> list[str]:
    """The operator requests `store` holds: not its signals, which a procedure that ended
    without reading them leaves until the request poll deletes them (ten minutes later)."""
    return [k for k in await store.walk(REQUESTS_PATH) if not k.startswith(SIGNALS_PATH)]


def _requested_id(key: str) -> str:
    """The procedure id a request's key names (`requests/ID.json`, `requests/resume/ID.json`)."""
    return key.rsplit("/", 1)[-1].removesuffix(".json")


async def _busy(store: MemoryStore, model: Model, stored: dict[str, list[ParsedKey]] | None = None) -> bool:
    """Whether some procedure is unfinished, or some request waits, or a finished folder
    that is no failed root kept for an operator (`keep_failed`, as `check_runs` reads it)
    waits for a manager's clean-up (a late `.commit` alone, say: the leader deletes it once
    it has forgotten the procedure, or at its next start; or an inherited tree's keys, kept
    through the late-write grace by a leader paused meanwhile)."""
    stored = await _stored(store) if stored is None else stored
    if any(latest_key(keys).key_type.value != "commit" for keys in stored.values()):
        return True

    def kept(pid: str, keys: list[ParsedKey]) -> bool:
        return model.keep_failed and pid in model.roots and status_of_keys(keys) is StoredStatus.FAILED

    if not all(kept(pid, keys) for pid, keys in stored.items()):
        return True
    # A kept root whose end record the store refused past its retries: the next start
    # records it (docs/guarantees.md, "Finishing"), which the heal's restart stands for.
    records = await records_by_procedure(store) if stored else {}
    for pid, keys in stored.items():
        ended = ProcedureKeys.of((k.step, k.key_type) for k in keys).newest_message
        raw = None if ended is None else await store.get(str(next(k for k in keys if (k.step, k.key_type) == ended)))
        message = decode_or_problem(raw)
        if isinstance(message, ProcedureMessage) and all(r.run != message.run for r in records.get(pid, [])):
            return True
    # Any request: one whose procedure is gone is deleted by the leader's watch once it is
    # `STALE_REQUEST_AGE` old (it may be a cancel written just before its submit landed).
    # But a cancel's or fail's request beside the failed root it ended, kept for an
    # operator: it stays until that root is resumed or deleted, and no work waits on it.
    return any(k.startswith(RESUME_PATH) or _requested_id(k) not in stored for k in await _requests(store))
