"""The crash-point explorer: kill a scenario before and after every store operation.

A clean run counts the operations that change the store. Then, for every operation n and
for "before" and "after", a fresh run is killed at n (a `SimulatedCrash`: no cleanup, and
nothing more reaches the store), a new manager starts on the same store, resubmits what was
never stored, and runs everything to its end. Each run is checked:

- every procedure ended (none lost), with the same outcome as in the clean run;
- every procedure wrote exactly one commit or rollback key, and no key was written twice;
- no procedure keys are left in the store;
- the world, as the scenario's `snapshot` sees it, equals the clean run's (on a seeded
  loop: or that of some crash-free schedule, as which of two locked procedures wins
  depends on the schedule);
- `Scenario.invariant`, if the scenario has one, holds: after every run, the clean one too.

`explore(double_execution=True)` adds HBase's mode: one chain of runs, killed before every
store update it has not been killed before, so that every step runs twice; a chain that
outlives `max_lives` (a parent naming new children on every replay) is a failure.

`explore(rollback_from_every_step=True)` adds HBase's `testRollbackAndDoubleExecution`: for
each attempt at a step k of the crash-free run, a run in which that attempt fails (an
injected error, as if `execute()` raised), so that the rollback runs from every position;
and, for each, crashes before and after every operation of the rollback that follows. The
world must then be as `Scenario.rolled_back` says (by default: as before the run).

Crash points that procedures declare (`await ctx.crash_point("after-mkdir")`) are counted
and killed around like store operations. A failure names its crash point in full (the
operation, its key, the procedure and step), the first procedure whose outcome differs
with its error and traceback, the world's difference, and the call that replays it.
Procedures are named by type, children by their parent too; the report prints failures of
the same cause once.
"""

from __future__ import annotations

import abc
import asyncio
import contextlib
import dataclasses
import inspect
import random
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from procstore._runtime.lease import Lease
from procstore._runtime.manager import ProcedureManager
from procstore.errors import ManagerStopped, ProcedureFailed, StoreError
from procstore.procedure import ProcedureWithId
from procstore.store.open import open_state_store
from procstore.store.state_store import StateStore
from procstore.testing.checks import check_writes, ended_before, ever_stored, rebind
from procstore.testing.faults import FaultyStore, SimulatedCrash, StoreOp
from procstore.testing.naming import ProcedureNames, ids_in, without_ids
from procstore.testing.plan import ATTEMPT, Fault, FaultPlan, InjectedFailure
from procstore.testing.report import (
    CLEAN_RUN,
    CrashPoint,
    Failure,
    Outcome,
    RunBroken,
    describe_op,
    describe_point,
    failed_procedures,
    outcome_differences,
    world_difference,
)
from procstore.testing.simulation import SimulatedLoop, derived_seed

__all__ = ["CrashExplorer", "CrashPoint", "ExplorationReport", "InjectedFailure", "Scenario"]


class Scenario(abc.ABC):
    """What the explorer runs. Each run gets a fresh store; the scenario builds its world there."""

    name: str = "scenario"

    async def prepare(self, store: StateStore) -> None:  # noqa: B027 - optional hook
        """Set up the world for a new run (`store` is the run's own, not fault-injected)."""

    @abc.abstractmethod
    def attach(self, manager: ProcedureManager, store: StateStore) -> None:
        """Register loaders on `manager`; `store` is the one this manager uses."""

    @abc.abstractmethod
    async def procedures(self, store: StateStore) -> list[ProcedureWithId]:
        """The procedures to submit, acting through `store`. Called again after a kill to
        rebuild them on the surviving store: return them in the same order."""

    async def snapshot(self, store: StateStore) -> object:
        """The world after the run; compared with the clean run's. Default: nothing."""
        return None

    async def invariant(self, store: StateStore) -> None:  # noqa: B027 - optional hook
        """Raise `AssertionError` if the world after a run is wrong in itself, whatever the
        crash-free run did (a leak there is invisible to the comparison). Called after every
        run, the crash-free one included; `store` is the run's, once everything ended."""

    async def rolled_back(self, store: StateStore, before: object, failed: tuple[int, ...] = ()) -> object:
        """The world the rollback mode expects once a failed run has rolled back.

        `before` is the snapshot taken before the run; `failed`, the indices (in the order
        `procedures()` returns them) of the procedures that ended failed: the one the failure
        was injected into, or the top of its tree. The others ended done. `store` is the run's
        store once the run has ended.

        Default (not overridden): the world of a crash-free run of only the procedures that
        did not fail, as if the failed ones had never run (so `before` when all failed).
        An override taking only `(store, before)` (the older form) is still called, before
        the run, with the store as `prepare` left it.
        """
        return before


@dataclass
class ExplorationReport:
    """How many crash points were explored, and which ones broke what."""

    scenario: str
    operations: int
    explored: int = 0
    failures: list[Failure] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.failures

    def assert_ok(self) -> None:
        """Raise `AssertionError` listing the failed crash points, if any."""
        if self.failures:
            raise AssertionError(str(self))

    @property
    def causes(self) -> list[list[Failure]]:
        """The failures grouped by cause: the same problem, ids aside (they differ from run
        to run), in the order each cause was first found."""
        groups: dict[str, list[Failure]] = {}
        for failure in self.failures:
            groups.setdefault(without_ids(failure.problem), []).append(failure)
        return list(groups.values())

    def __str__(self) -> str:
        causes = self.causes
        head = (
            f"{self.scenario}: {self.explored} crash points explored over {self.operations} store "
            f"operations, {len(self.failures)} failed"
            + (f" ({len(causes)} distinct causes)" if len(causes) > 1 else "")
        )
        lines = [head]
        for group in causes[:20]:
            lines.append(str(group[0]))
            if len(group) > 1:
                also = ", ".join(str(f.point) for f in group[1:11]) + (", ..." if len(group) > 11 else "")
                more = f"{len(group) - 1} more crash point" + ("s" if len(group) > 2 else "")
                lines.append(f"    the same at {more}: {also}")
        return "\n".join(lines)


@dataclass
class _Result:
    ops: list[StoreOp]
    outcomes: dict[str, Outcome]
    snapshot: object
    attempts: list[int] = field(default_factory=list)
    """For each attempt at a step, how many operations came before it."""
    before: object = None
    url: str = ""
    violation: str | None = None
    """What `Scenario.invariant` raised after the run, if it did."""


def _hook(scenario: Scenario) -> str:
    """Which `rolled_back` the scenario has: the default, the older `(store, before)` form,
    or the `(store, before, failed)` one."""
    if type(scenario).rolled_back is Scenario.rolled_back:
        return "default"
    params = inspect.signature(scenario.rolled_back).parameters.values()
    positional = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    many = any(p.kind == p.VAR_POSITIONAL for p in params)
    return "new" if many or len(positional) >= 3 else "old"


class CrashExplorer:
    """Runs a `Scenario` under every crash point (see the module docstring for the checks).

    Args:
        scenario: what to run.
        store_url: the store URL of run n; each run needs its own empty store.
        storage_options: for `open_state_store`.
        manager_options: for every `ProcedureManager` (millisecond retry delays by default).
        timeout: seconds a run may take before it counts as hung.
        max_lives: how many times the double-execution run may be killed and restarted
            before it counts as never ending (a parent that names new children on every
            replay); default: four per operation of the crash-free run, plus 20.
        schedules: on a seeded `SimulatedLoop`, how many more crash-free schedules may be
            tried when a crashed run ends otherwise than the crash-free one: an outcome one
            of them also gives is correct (which of two locked procedures wins, say).
    """

    def __init__(
        self,
        scenario: Scenario,
        store_url: Callable[[int], str],
        storage_options: dict[str, Any] | None = None,
        *,
        manager_options: dict[str, Any] | None = None,
        timeout: float = 30.0,
        max_lives: int | None = None,
        schedules: int = 8,
    ) -> None:
        self.scenario = scenario
        self.store_url = store_url
        self.storage_options = storage_options
        self.manager_options = {"retry_delay": 0.001, "max_retry_delay": 0.01, **(manager_options or {})}
        self.timeout = timeout
        self.max_lives = max_lives
        self.schedules = schedules
        self._lives_budget = max_lives or 20
        self._names = ProcedureNames()
        """Type and parent of the current run's procedures, for its report."""
        self._crash_free: list[_Result] = []
        """The crash-free runs seen (on a seeded loop, one per schedule tried): any of their
        outcomes is a correct one, as which of two locked procedures wins depends on it."""
        self._runs = 0
        self._seed: int | None = None
        self._without: dict[tuple[int, ...], object] = {}
        """The world of a crash-free run without the procedures at these indices."""
        self._submit_order: list[int] | None = None
        """While set, the order in which the first life submits the procedures."""
        self._keep: list[int] | None = None
        """While set, only the scenario's procedures at these indices run."""

    async def explore(
        self,
        *,
        double_execution: bool = False,
        rollback_from_every_step: bool = False,
        only: Iterable[CrashPoint] | None = None,
    ) -> ExplorationReport:
        """The clean run, then every crash point; returns the report (does not raise).

        `only` replays the given points (as a report names them), e.g.
        `only=[CrashPoint(7, "after")]`; `CrashPoint(-1, "before")` is the double-execution run;
        `only=[]`, the crash-free run alone (with `Scenario.invariant`).
        Raises `ValueError` if a run's store is not empty when it starts.
        """
        loop = asyncio.get_running_loop()
        self._seed = loop.seed if isinstance(loop, SimulatedLoop) else None
        try:
            clean = await self._run(self._killed_at(None), FaultPlan(), "clean")
            self._crash_free = [clean]
            self._lives_budget = self.max_lives or 4 * len(clean.ops) + 20
            report = ExplorationReport(self.scenario.name, len(clean.ops))
            if clean.violation is not None:
                point = CrashPoint(CLEAN_RUN, "before")
                broken = Failure(point, "the crash-free run", self._violated(clean.violation))
                report.failures.append(dataclasses.replace(broken, seed=self._seed))
            if only is not None:
                points = [p for p in only if p.index != CLEAN_RUN]  # the clean run, just made
            else:
                points = [CrashPoint(i, w) for i in range(len(clean.ops)) for w in ("before", "after")]
                if double_execution:
                    points.append(CrashPoint(-1, "before"))
                if rollback_from_every_step:
                    points += await self._rollback_points(clean)
            for point in points:
                failure = await self._try(point, clean)
                if failure is not None:
                    report.failures.append(dataclasses.replace(failure, seed=self._seed))
                report.explored += 1
        finally:
            if isinstance(loop, SimulatedLoop):
                loop.reseed(self._seed)
        return report

    async def _try(self, point: CrashPoint, clean: _Result) -> Failure | None:
        plan = FaultPlan()  # the crashed run's: its operations name the crash point, with its ids
        try:
            twice = point.index < 0 and point.fail_at is None
            kill = self._twice_each() if twice else self._killed_at(point)
            result = await self._run(kill, plan, point, rolled_back=point.fail_at is not None)
        except AssertionError as e:
            at = describe_point(point, plan, self._names)
            return Failure(point, at, str(e), e.details if isinstance(e, RunBroken) else [])
        at = describe_point(point, plan, self._names)
        differs = outcome_differences(result.outcomes, clean.outcomes)
        if result.violation is not None:
            # The invariant's message first: it says what is wrong, the difference only where.
            problem = self._violated(result.violation)
            return Failure(point, at, problem, [] if differs is None else [differs[0], *differs[1]])
        if point.fail_at is not None:
            return await self._rollback_problem(point, at, result, clean)
        if differs is None and result.snapshot == clean.snapshot:
            return None
        if await self._some_crash_free_run_alike(point, result):
            return None
        if differs is not None:
            return Failure(point, at, differs[0], differs[1])
        return Failure(point, at, "the world differs from the crash-free run's: "
                       + world_difference(result.snapshot, clean.snapshot))  # fmt: skip

    def _violated(self, message: str) -> str:
        return f"{type(self.scenario).__name__}.invariant failed: {message}"

    async def _some_crash_free_run_alike(self, point: CrashPoint, result: _Result) -> bool:
        """On a seeded loop, whether some crash-free schedule ends as `result` did: one seen
        before, the crashed run's own seed, or new ones up to `schedules` in all. Which of two
        procedures that take the same lock wins depends on the schedule (and a crash changes
        the schedule): either outcome is correct."""
        if self._seed is None:
            return False
        if any(_alike(result, other) for other in self._crash_free):
            return True
        labels: list[CrashPoint | str] = [point]
        labels += [f"crash-free schedule {n}" for n in range(len(self._crash_free), self.schedules + 1)]
        for label in labels:
            if len(self._crash_free) > self.schedules:
                break
            # Submitted in another order too: after a restart, the procedures resume in
            # whatever order the store lists them, not the order the scenario gave.
            order = list(range(len(result.outcomes)))
            if label != point:
                random.Random(derived_seed(self._seed, label)).shuffle(order)
            self._submit_order = order
            try:
                other = await self._run(self._killed_at(None), FaultPlan(), label)
            except AssertionError:
                continue  # broken without a crash under that schedule: nothing to accept
            finally:
                self._submit_order = None
            self._crash_free.append(other)
            if _alike(result, other):
                return True
        return False

    async def _rollback_points(self, clean: _Result) -> list[CrashPoint]:
        """A failure at each attempt of the clean run, alone and with a crash around each
        operation after it (the rollback's own writes)."""
        points: list[CrashPoint] = []
        for k in range(len(clean.attempts)):
            point = CrashPoint(-1, "before", k)
            points.append(point)
            try:
                failed = await self._run(self._killed_at(point), FaultPlan(), point)
            except AssertionError:
                continue  # broken without a crash already: that point reports it
            start = failed.attempts[k] if k < len(failed.attempts) else len(failed.ops)
            points += [CrashPoint(i, w, k) for i in range(start, len(failed.ops)) for w in ("before", "after")]
        return points

    async def _rollback_problem(self, point: CrashPoint, at: str, result: _Result, clean: _Result) -> Failure | None:
        """A failed procedure must have rolled the world back; one that ended done (the crash
        came before its failure was stored, and the step ran again) must match the clean run."""
        if all(o.status == "done" for o in result.outcomes.values()):
            if point.index < 0:
                return Failure(point, at, "no procedure failed although an attempt was made to fail")
            if result.snapshot != clean.snapshot:
                return Failure(point, at, "the world differs from the crash-free run's: "
                               + world_difference(result.snapshot, clean.snapshot))  # fmt: skip
            return None
        try:
            expected = await self._expected_after_rollback(result)
        except AssertionError as e:
            return Failure(point, at, str(e))
        if result.snapshot != expected:
            return Failure(point, at, "the world after the rollback is not as expected: "
                           + world_difference(result.snapshot, expected) + self._expectation(result))  # fmt: skip
        return None

    def _expectation(self, result: _Result) -> str:
        """Where the expected world came from, when procstore chose it."""
        failed = [i for i, outcome in enumerate(result.outcomes.values()) if outcome.status == "failed"]
        if _hook(self.scenario) != "default" or len(failed) == len(result.outcomes):
            return ""
        return (
            f" (expected: the world of a crash-free run without the failed procedures {failed}; if the "
            "procedures share state, a lock or a counter, override Scenario.rolled_back to say what a "
            "rollback must leave)"
        )

    # -- how a run is killed -------------------------------------------------------------

    Kill = Callable[[str, FaultPlan], Awaitable[tuple[list[ProcedureWithId], list[FaultyStore]]]]
    """Runs the first life(s) of a run on the store at the URL; the first records into the plan."""

    def _killed_at(self, point: CrashPoint | None) -> CrashExplorer.Kill:
        async def kill(url: str, plan: FaultPlan) -> tuple[list[ProcedureWithId], list[FaultyStore]]:
            crash_at = None if point is None or point.index < 0 else point.index
            faulty = self._faulty(
                url, crash_at=crash_at, crash_when="before" if point is None else point.when, plan=plan
            )
            if point is not None and point.fail_at is not None:
                faulty.plan.faults.append(Fault("error", kinds=frozenset({ATTEMPT}), nth=point.fail_at))
            # Built on the store they run on, so the world's own writes die with the kill too.
            procedures = await self._procedures(faulty)
            return procedures, [await self._live(faulty, procedures, [])]

        return kill

    def _twice_each(self) -> CrashExplorer.Kill:
        async def kill(url: str, plan: FaultPlan) -> tuple[list[ProcedureWithId], list[FaultyStore]]:
            seen: set[tuple[str, str]] = set()
            faulty = self._faulty(url, crash_before_new=seen, plan=plan)
            procedures = await self._procedures(faulty)
            lives = [await self._live(faulty, procedures, [])]
            while lives[-1].crashed.is_set():
                if len(lives) >= self._lives_budget:
                    raise RunBroken(*self._never_ends(lives))
                faulty = self._faulty(url, crash_before_new=seen)
                lives.append(await self._live(faulty, procedures, lives))
            return procedures, lives

        return kill

    def _never_ends(self, lives: list[FaultyStore]) -> tuple[str, list[str]]:
        """Why a double-execution run was stopped: each life died before a key never written
        before, so some procedure writes new keys on every replay (it names new children)."""
        killed_at = [ids_in(life.ops[-1].key) for life in lives if life.ops]
        pids = [found[0] for found in killed_at if found]
        culprits = Counter(self._names.parent_of(pid) or pid for pid in pids[len(pids) // 2 :])
        details = [f"killed last before: {describe_op(life.ops[-1], self._names)}" for life in lives[-3:] if life.ops]
        if not culprits:
            return f"the run did not end after {len(lives)} lives", details
        culprit = culprits.most_common(1)[0][0]
        problem = (
            f"the run never ends: after {len(lives)} lives, each killed before a store update never made "
            f"before, {self._names.name(culprit)} still writes new keys on every replay (does it name "
            "new children, with new ids, each time it runs?)"
        )
        return problem, details

    # -- one run -------------------------------------------------------------------------

    async def _procedures(self, store: StateStore) -> list[ProcedureWithId]:
        procedures = await self.scenario.procedures(store)
        return procedures if self._keep is None else [procedures[i] for i in self._keep]

    def _store(self, url: str) -> StateStore:
        return open_state_store(url, self.storage_options)

    def _faulty(self, url: str, **options: Any) -> FaultyStore:
        """The store of one life of the current run, naming its procedures for the report."""
        faulty = FaultyStore(self._store(url), **options)
        faulty.names = self._names
        return faulty

    @contextlib.asynccontextmanager
    async def _opened(self, url: str) -> AsyncIterator[StateStore]:
        """A store of the explorer's own, closed after use (an S3 one holds a client session)."""
        store = self._store(url)
        try:
            yield store
        finally:
            await store.close()

    def _manager(self, store: StateStore) -> ProcedureManager:
        manager = ProcedureManager(store, **self.manager_options)
        self.scenario.attach(manager, store)
        return manager

    async def _run(
        self, kill: CrashExplorer.Kill, plan: FaultPlan, point: CrashPoint | str, *, rolled_back: bool = False
    ) -> _Result:
        """One run, killed as `kill` says. On a seeded `SimulatedLoop`, reseeded from the
        explorer's seed and `point` first, so that replaying a point alone replays its run."""
        self._runs += 1
        self._names = ProcedureNames()
        loop = asyncio.get_running_loop()
        if self._seed is not None and isinstance(loop, SimulatedLoop):
            await loop.settle()  # what earlier runs left ready runs out first
            loop.reseed(derived_seed(self._seed, point))
        url = self.store_url(self._runs)
        async with self._opened(url) as store:
            try:
                leftovers = await store.walk("")
            except StoreError:
                leftovers = []  # not there yet (a local folder is made on first write): empty
            if leftovers:
                raise ValueError(
                    f"the store of run {self._runs} ({url}) is not empty ({len(leftovers)} keys, "
                    f"e.g. {leftovers[0]}): store_url must give every run a fresh, empty folder or prefix"
                )
            await self.scenario.prepare(store)
            # Only the rollback mode needs the world as it was (a scenario may not read an empty store).
            before = await self.scenario.snapshot(store) if rolled_back else None
            if rolled_back and _hook(self.scenario) == "old":
                before = await self.scenario.rolled_back(store, before)
        procedures, lives = await kill(url, plan)
        result = await self._finish(url, procedures, lives)
        result.before = before
        result.url = url
        return result

    async def _expected_after_rollback(self, result: _Result) -> object:
        """The world a run whose procedures at `failed` failed must end with (see `rolled_back`)."""
        failed = tuple(i for i, outcome in enumerate(result.outcomes.values()) if outcome.status == "failed")
        hook = _hook(self.scenario)
        if hook == "old":
            return result.before
        if hook == "new":
            async with self._opened(result.url) as store:
                return await self.scenario.rolled_back(store, result.before, failed)
        if len(failed) == len(result.outcomes):
            return result.before
        if failed not in self._without:
            keep = [i for i in range(len(result.outcomes)) if i not in failed]
            self._keep = keep
            try:
                reference = await self._run(self._killed_at(None), FaultPlan(), f"without {list(failed)}")
            finally:
                self._keep = None
            if any(o.status != "done" for o in reference.outcomes.values()):
                raise AssertionError(
                    f"the run without the failed procedures {list(failed)} did not end with all done: "
                    "override Scenario.rolled_back to say what a rollback must leave"
                )
            self._without[failed] = reference.snapshot
        return self._without[failed]

    async def _lead(self, manager: ProcedureManager, crashed: asyncio.Future[Any] | None) -> None:
        """Wait until `manager` leads: with a lease, a manager restarted after a kill is a
        standby until the dead one's lease expires (no time under `run_simulated`; a TTL on
        a real loop). Returns early if the store crashes meanwhile."""
        leading = asyncio.ensure_future(manager.wait_until_leading())
        try:
            waits = [leading] if crashed is None else [leading, crashed]
            done, _ = await asyncio.wait(waits, timeout=self.timeout, return_when="FIRST_COMPLETED")
            if not done:
                raise AssertionError(f"a manager did not lead within {self.timeout}s")
            if leading.done():
                leading.result()
        finally:
            leading.cancel()
            await asyncio.gather(leading, return_exceptions=True)

    async def _live(
        self, faulty: FaultyStore, procedures: list[ProcedureWithId], before: list[FaultyStore]
    ) -> FaultyStore:
        """One manager's life: resume or submit everything, run until all end or the kill."""
        if before:
            procedures = rebind(procedures, await self._procedures(faulty))
        manager = self._manager(faulty)
        waits: list[asyncio.Future[Any]] = []
        crashed: asyncio.Future[Any] = asyncio.ensure_future(faulty.crashed.wait())
        try:
            with contextlib.suppress(SimulatedCrash):
                await manager.start()
                await self._lead(manager, crashed)
                if faulty.crashed.is_set():
                    return faulty
                order = self._submit_order or range(len(procedures))
                for pwid in [procedures[i] for i in order]:
                    watcher = manager.procedure_watcher(pwid.id)
                    if watcher is None and not ever_stored(pwid, before):
                        watcher = await manager.submit(pwid)
                    if watcher is not None:
                        waits.append(asyncio.ensure_future(watcher.wait()))
                while not faulty.crashed.is_set() and not all(w.done() for w in waits):
                    done, _ = await asyncio.wait([*waits, crashed], timeout=self.timeout, return_when="FIRST_COMPLETED")
                    if not done:
                        raise AssertionError(f"a run did not finish within {self.timeout}s")
        finally:
            with contextlib.suppress(SimulatedCrash):  # a lease's release, after the kill
                await manager.stop()
            for w in [*waits, crashed]:
                w.cancel()
            await asyncio.gather(*waits, crashed, return_exceptions=True)
            await faulty.close()
        return faulty

    async def _keys_left(self, store: StateStore, path: str) -> list[str]:
        """The procedure keys left once all ended. With a lease, a manager deletes the keys of
        procedures it inherited only after the lease's `late_write_grace`: wait that long."""
        left = await store.walk(path)
        lease = Lease.from_option(self.manager_options.get("lease"))
        if not left or lease is None:
            return left
        loop = asyncio.get_running_loop()
        deadline = loop.time() + min(lease.late_write_grace + 1.0, self.timeout)
        while left and loop.time() < deadline:
            await asyncio.sleep(max(0.05, lease.late_write_grace / 20))
            left = await store.walk(path)
        return left

    async def _finish(self, url: str, procedures: list[ProcedureWithId], lives: list[FaultyStore]) -> _Result:
        """Restart on the plain store, run everything to its end, and check the store."""
        recorder = self._faulty(url)
        outcomes: dict[str, Outcome] = {}
        try:
            async with self._manager(recorder) as manager:
                await self._lead(manager, None)
                rebuilt = rebind(procedures, await self._procedures(recorder))
                for pwid in rebuilt:
                    watcher = manager.procedure_watcher(pwid.id)
                    if watcher is None and not ever_stored(pwid, lives):
                        watcher = await manager.submit(pwid)
                    if watcher is None:
                        outcomes[str(pwid.id)] = Outcome(ended_before(pwid, lives))
                        continue
                    try:
                        await asyncio.wait_for(watcher.wait(), self.timeout)
                        outcomes[str(pwid.id)] = Outcome("done")
                    except ProcedureFailed as e:
                        state = manager.procedure_state(pwid.id)
                        traceback = state.traceback if state is not None else None
                        outcomes[str(pwid.id)] = Outcome("failed", str(e), traceback)
                    except (TimeoutError, ManagerStopped) as e:
                        raise AssertionError(f"procedure {pwid.id} did not end after the restart: {e!r}") from e
                left = await self._keys_left(recorder.inner, manager.store.proc_path)
        finally:
            await recorder.close()
        try:
            if left:
                raise AssertionError(f"{len(left)} procedure keys left behind, e.g. {left[0]}")
            check_writes(
                [op for life in lives for op in life.landed()] + recorder.landed(),
                [op for life in lives for op in life.maybe_landed()],
            )
        except AssertionError as e:
            raise RunBroken(str(e), failed_procedures(outcomes)) from e
        async with self._opened(url) as store:
            snapshot = await self.scenario.snapshot(store)
            violation = await self._check_invariant(store)
        result = _Result(list(lives[0].ops), outcomes, snapshot, list(lives[0].plan.attempts))
        result.violation = violation
        return result

    async def _check_invariant(self, store: StateStore) -> str | None:
        try:
            await self.scenario.invariant(store)
        except AssertionError as e:
            return str(e) or repr(e)
        return None


def _alike(result: _Result, other: _Result) -> bool:
    """Same outcomes, in the scenario's order, and the same world."""
    return outcome_differences(result.outcomes, other.outcomes) is None and result.snapshot == other.snapshot
