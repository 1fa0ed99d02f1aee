"""`ProcedureStateMachine`: a hypothesis stateful test base for procedures.

Hypothesis draws schedules of these rules: submit a procedure, submit several at once (so
that they overlap), let the procedures run a while, arm a crash a few store operations
ahead, inject transient store faults, restart the manager, and wait until everything has
ended. Rules run while procedures are still running, between their steps. After every rule
and at the end it checks:

- nothing lost: every procedure whose `submit` returned is known to the current manager,
  or has ended (possibly before a crash, with its commit or rollback key written);
- everything ends once faults stop (`wait_for_quiescence`, and the teardown);
- once all have ended, the store holds no procedure keys;
- `check_world(outcomes)`, the subclass's own "effects exactly once" check;
- `invariant(store)`, after every rule too: what must hold at every moment, procedures
  running or not (the same hook as `Scenario.invariant` of the crash explorer).

Subclass it, implement `attach`, `new_procedure` and `check_world`, and expose it to pytest
with `TestX = MyMachine.TestCase`. Each instance runs its own event loop and a fresh
`memory://` store (`MemoryStore`: flat cost per operation, however many keys).

The loop is a `SimulatedLoop` (`simulated_time = True`, the default): backoffs and waits
take no real time, and the order in which concurrent procedures interleave is drawn from a
seed that hypothesis picks (the `schedule` rule), so a failure shrinks and replays with
its interleaving.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Coroutine
from typing import Any, ClassVar, TypeVar

from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, precondition, rule
from hypothesis.stateful import invariant as after_every_rule

from procstore._runtime.manager import ProcedureManager
from procstore.errors import ProcedureError
from procstore.ids import ProcedureId
from procstore.procedure import ProcedureWithId
from procstore.store.open import open_state_store
from procstore.store.state_store import StateStore
from procstore.testing.faults import FaultyStore
from procstore.testing.plan import Fault, FaultPlan, SimulatedCrash, StoreOp
from procstore.testing.simulation import SimulatedLoop

T = TypeVar("T")


class ProcedureStateMachine(RuleBasedStateMachine):
    """Random schedules of submits, crashes, transient faults and restarts."""

    manager_options: ClassVar[dict[str, Any]] = {"retry_delay": 0.001, "max_retry_delay": 0.005, "max_retry_times": 5}
    simulated_time: ClassVar[bool] = True
    """Run on a `SimulatedLoop` (virtual time, seeded schedule); False: a plain event loop."""

    def attach(self, manager: ProcedureManager, store: StateStore) -> None:
        """Register the loaders."""
        raise NotImplementedError

    def new_procedure(self, seed: int, store: StateStore) -> ProcedureWithId:
        """A new procedure to submit, chosen from `seed`."""
        raise NotImplementedError

    def check_world(self, outcomes: dict[ProcedureId, str]) -> None:
        """Assert the world shows every ended procedure's effects exactly once."""

    async def invariant(self, store: StateStore) -> None:
        """Raise `AssertionError` if the world is wrong at this moment (say, two procedures
        hold what only one may). Called after every rule, while procedures run; `store` is
        the plain store (no faults). Default: nothing to check."""

    def __init__(self) -> None:
        super().__init__()
        self.loop = SimulatedLoop() if self.simulated_time else asyncio.new_event_loop()
        self.url = f"memory://stateful-{uuid.uuid4().hex}/"
        self.submitted: dict[ProcedureId, ProcedureWithId] = {}
        self.outcomes: dict[ProcedureId, str] = {}
        self.history: list[StoreOp] = []
        self.manager: ProcedureManager | None = None
        self.store: FaultyStore | None = None
        self._start()

    # -- the manager's lives -------------------------------------------------------------

    def _run(self, coro: Coroutine[Any, Any, T]) -> T:
        return self.loop.run_until_complete(coro)

    def _start(self) -> None:
        self.store = FaultyStore(open_state_store(self.url), plan=FaultPlan())
        self.manager = ProcedureManager(self.store, **self.manager_options)
        self.attach(self.manager, self.store)
        try:
            self._run(self.manager.start())
        except SimulatedCrash:
            self._restart()

    def _stop(self) -> None:
        assert self.manager is not None and self.store is not None
        self._harvest()
        self._run(self.manager.stop())
        self.history += self.store.landed() + self.store.maybe_landed()

    def _restart(self) -> None:
        self._stop()
        self._start()

    def _harvest(self) -> None:
        assert self.manager is not None
        for pid in self.submitted:
            state = self.manager.procedure_state(pid)
            if state is not None and state.is_ended():
                self.outcomes[pid] = "done" if state.is_done() else "failed"

    def _settle(self, seconds: float = 0.02) -> None:
        """Let the runners work for a moment; restart if they crashed meanwhile."""
        assert self.store is not None
        self._run(asyncio.sleep(seconds))
        if self.store.crashed.is_set():
            self._restart()
        self._harvest()

    # -- rules ---------------------------------------------------------------------------

    @initialize(seed=st.integers(min_value=0, max_value=2**32 - 1))
    def schedule(self, seed: int) -> None:
        """The seed of this example's interleaving (with simulated time)."""
        if isinstance(self.loop, SimulatedLoop):
            self.loop.reseed(seed)

    @rule(seed=st.integers(min_value=0, max_value=2**16))
    def submit(self, seed: int) -> None:
        assert self.manager is not None and self.store is not None
        procedure = self.new_procedure(seed, self.store)
        try:
            self._run(self.manager.submit(procedure))
        except SimulatedCrash:
            self._restart()
            return
        except ProcedureError:
            return  # refused (a transient fault on the first write): nothing runs
        self.submitted[procedure.id] = procedure
        self._settle(0.0)

    @rule(seeds=st.lists(st.integers(min_value=0, max_value=2**16), min_size=2, max_size=4))
    def submit_many(self, seeds: list[int]) -> None:
        """Submit several procedures at once: their first steps overlap, and their locks meet."""
        assert self.manager is not None and self.store is not None
        procedures = [self.new_procedure(seed, self.store) for seed in seeds]
        manager = self.manager
        results = self._run(_gather_all([manager.submit(p) for p in procedures]))
        for procedure, result in zip(procedures, results, strict=True):
            if not isinstance(result, BaseException):
                self.submitted[procedure.id] = procedure
        crashed = [r for r in results if isinstance(r, SimulatedCrash)]
        refused = [r for r in results if isinstance(r, BaseException) and not isinstance(r, ProcedureError)]
        if crashed:
            self._restart()
        elif refused:
            raise refused[0]
        else:
            self._settle(0.0)

    @rule(ticks=st.integers(min_value=1, max_value=20))
    def let_run(self, ticks: int) -> None:
        """Let the procedures run a little (a few loop turns, in virtual time), so that the
        next rule lands between their steps."""
        for _ in range(ticks):
            self._settle(0.0)

    @rule(ahead=st.integers(min_value=0, max_value=8))
    def crash_soon(self, ahead: int) -> None:
        assert self.store is not None
        self.store.plan.faults.append(Fault("crash", nth=ahead))
        self._settle()

    @rule(times=st.integers(min_value=1, max_value=3))
    def transient_faults(self, times: int) -> None:
        assert self.store is not None
        self.store.plan.faults.append(Fault("transient", times=times))
        self._settle()

    @rule()
    def restart(self) -> None:
        self._restart()

    @precondition(lambda self: bool(self.submitted))
    @rule()
    def wait_for_quiescence(self) -> None:
        self._quiesce()

    def _quiesce(self) -> None:
        """Stop injecting faults and run until every submitted procedure has ended."""
        for _ in range(200):
            assert self.store is not None
            self.store.plan.faults.clear()
            self._settle(0.01)
            if all(pid in self.outcomes for pid in self.submitted):
                return
            if not self._all_known():
                self._restart()
        raise AssertionError(f"not everything ended: {set(self.submitted) - set(self.outcomes)}")

    # -- invariants ----------------------------------------------------------------------

    def _all_known(self) -> bool:
        assert self.manager is not None
        return all(
            pid in self.outcomes or self.manager.procedure_state(pid) is not None or self._ended_before(pid)
            for pid in self.submitted
        )

    def _ended_before(self, pid: ProcedureId) -> bool:
        ended = any(str(pid) in op.key and op.key.endswith((".commit", ".rollback")) for op in self.history)
        if ended and pid not in self.outcomes:
            # A `.commit` above a `.rollback` ends a rolled-back procedure: the rollback decides.
            rolled_back = any(str(pid) in op.key and op.key.endswith(".rollback") for op in self.history)
            self.outcomes[pid] = "failed" if rolled_back else "done"
        return ended

    @after_every_rule()
    def nothing_lost(self) -> None:
        assert self._all_known(), "a procedure whose submit returned is gone"

    @after_every_rule()
    def world_holds(self) -> None:
        if type(self).invariant is not ProcedureStateMachine.invariant:
            self._run(self.invariant(open_state_store(self.url)))

    def teardown(self) -> None:
        try:
            if self.submitted:
                self._quiesce()
                assert self.manager is not None
                left = self._run(self.manager.store.store.walk("procedure/"))
                assert left == [], f"procedure keys left after everything ended: {left[:3]}"
                self.check_world(self.outcomes)
                self.world_holds()
        finally:
            # Whatever failed above, the manager stops before its loop closes: else asyncio
            # reports its tasks (procstore:gc, procstore:requests) destroyed while pending.
            try:
                self._stop()
            finally:
                self.loop.close()


async def _gather_all(calls: list[Coroutine[Any, Any, T]]) -> list[T | BaseException]:
    """Every call's result or exception (a `SimulatedCrash` included), all run at once."""
    tasks = [asyncio.ensure_future(call) for call in calls]
    await asyncio.wait(tasks)
    return [task.exception() or task.result() for task in tasks]
