"""`Runner`: drives one procedure from its locks to its final state.

The loop, by state:

- RUNNING / RETRYING: call `execute` (retrying `RetryLater` and store errors with backoff),
  persist if asked, then continue, start subprocedures and wait for them, or commit.
- PREPARE_ROLLBACK: write the `.rollback` key, then ROLLING_BACK.
- ROLLING_BACK: call `rollback()` (retried with backoff), then FAILED.

Step numbers: every persisting write uses `self.step` and then increments it; the commit
and rollback keys too. A root that ends deletes its tree's keys before reporting the end,
children first and itself last, so a crash part way still leaves it marked finished.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, Sequence
from functools import partial
from typing import TypeVar

from procstore._aio import gather_settled
from procstore._logs import get_logger, procedure_fields
from procstore._runtime.children import claim_stored_child, poison_child
from procstore._runtime.context import ManagerContext
from procstore._runtime.meta import ProcedureMeta
from procstore._runtime.outcome import (
    IN_EXECUTE,
    IN_ROLLBACK,
    Child,
    as_failure,
    dumped,
    failed_state,
    format_tb,
    is_stop,
    lock_conflict,
    not_recorded,
    unrecorded_end,
    with_error,
    with_kind,
)
from procstore._runtime.request_wakes import first_request_wakes, unless_requested
from procstore._runtime.retry import is_rollback_retryable, is_transient
from procstore._runtime.telemetry import run_traced
from procstore._runtime.writes import delete_tree, delete_tree_later, record_now
from procstore.errors import Fenced, LeaseExpired, LockCycle, ProcedureError, StoreError, describe
from procstore.ids import ProcedureId
from procstore.lock_key import StringKey
from procstore.procedure import Context, Procedure, ProcedureWithId, Status
from procstore.state import ProcedureState, ProcedureStateKind
from procstore.store.keys import KeyType
from procstore.store.message import ProcedureMessage
from procstore.store.requests import OperatorRequested

logger = get_logger("procstore.runtime")

T = TypeVar("T")

_RUNNING_KINDS = (ProcedureStateKind.RUNNING, ProcedureStateKind.RETRYING)


class Runner:
    """Runs one procedure in its own task until it ends or the manager stops."""

    __slots__ = ("_resume_children", "_stored_data", "ctx", "holds_locks", "meta", "procedure", "step")

    def __init__(
        self,
        ctx: ManagerContext,
        meta: ProcedureMeta,
        procedure: Procedure,
        step: int,
        stored_data: str,
        *,
        resume_children: bool = False,
        holds_locks: bool = False,
    ) -> None:
        self.ctx = ctx
        self.meta = meta
        self.procedure = procedure
        self.step = step
        """The step number of the next key this runner writes."""
        self._stored_data = stored_data
        """The last `data` known to be stored: the rollback message's fallback if `dump()` fails."""
        self._resume_children = resume_children
        self.holds_locks = holds_locks
        """Its lock keys were taken for it already (see `KeyRwLock.acquire_all_now`)."""

    def start(self) -> None:
        run = run_traced(self.ctx, self.meta, self, self._run)
        self.ctx.spawn(run, name=f"procstore:{self.meta.type_name}:{self.meta.id}")

    async def _run(self) -> None:
        held: list[StringKey] = []
        try:
            if self.holds_locks:
                held += self.meta.lock_key.keys_to_lock()
            elif not await self._acquire_all(held):
                await self._drive()  # the failure it recorded (a rollback, if supported)
                return
            self.meta.mark_started()
            if self._resume_children:
                await self._resume_stored_children()
            await self._drive()
        except LeaseExpired as e:
            # The lease may be another manager's now: not a failure, the procedure resumes there.
            self.meta.abandon()
            self.ctx.step_down(e)
        except Fenced as e:
            # Another manager wrote this step key: it runs the procedure now. Write nothing more.
            self.meta.keep_keys = True
            self.meta.set_state(ProcedureState.with_error(ProcedureStateKind.POISONED, str(e), e))
            self.ctx.step_down(e)
        except BaseException as e:
            if is_stop(e):
                raise
            await self._crashed(as_failure(e, "a hook of the procedure"))
        finally:
            self._release(held)

    async def _acquire_all(self, held: list[StringKey]) -> bool:
        """Take every lock key, in order, appending each to `held`; False if the procedure
        failed instead (it recorded the failure).

        One that may have run a step already (`_may_have_run`) must roll back holding its
        locks, so an operator's request does not end its wait: it is honoured once the
        procedure holds them (as between steps). Before a wait that would close a cycle, it
        gives back what it holds and waits for all of them again, once: a cycle that
        remains runs through an ancestor (which holds its locks while it waits for this
        one), and no wait can end it. It then fails without a rollback and its keys are
        kept, for an operator to resume or rewind: rolling back without the locks could
        undo work beside their holder.
        """
        may_have_run = self._may_have_run()
        gave_back = False
        keys = self.meta.lock_key.keys_to_lock()
        while len(held) < len(keys):
            key = keys[len(held)]
            if self.ctx.locks.would_block(key) and (cycle := self.ctx.lock_cycle(self.meta.id, key)) is not None:
                if may_have_run and held and not gave_back:
                    self._release(held)
                    gave_back = True
                    if self.ctx.lock_cycle(self.meta.id, keys[0]) is None:
                        continue
                self.meta.keep_keys = self.meta.keep_keys or may_have_run
                await self._fail(LockCycle(self.meta.id, key.key, cycle, kept=may_have_run), roll_back=False)
                return False
            if not await self._wait_for(key, ends_on_request=not may_have_run):
                # An operator's request ends the wait of one that never ran: it fails at once.
                await self._fail(OperatorRequested(self.ctx.operator_requests[self.meta.id]), roll_back=False)
                return False
            held.append(key)
        return True

    async def _wait_for(self, key: StringKey, *, ends_on_request: bool) -> bool:
        """Wait for `key`; False (nothing taken) if an operator's request came first and
        `ends_on_request`. Otherwise the request waits, said once in the log."""
        self.ctx.lock_waits[self.meta.id] = key.key
        try:
            acquired = await self.ctx.locks.acquire_unless(key, self.meta.requested())
            if not acquired and not ends_on_request:
                holders = ", ".join(str(h) for h in sorted(self.ctx.lock_holders.get(key.key, set()), key=str))
                logger.warning(
                    "procedure %s: %s: honoured once it holds its locks (its step may have run, and its "
                    "rollback needs them); it waits for %s, held by %s",
                    self.meta.id,
                    self.ctx.operator_requests[self.meta.id].describe(),
                    key.key,
                    holders or "procedures queued before it",
                    extra=procedure_fields(self.meta.id, self.meta.type_name, self.step),
                )
                await self.ctx.locks.acquire(key)
                acquired = True
        finally:
            del self.ctx.lock_waits[self.meta.id]
        if acquired:
            self.ctx.lock_holders.setdefault(key.key, set()).add(self.meta.id)
        return acquired

    def _release(self, held: list[StringKey]) -> None:
        while held:
            key = held.pop()
            self.ctx.locks.release(key)
            self.ctx.lock_holders.get(key.key, set()).discard(self.meta.id)

    def _may_have_run(self) -> bool:
        """Whether a step may have run already: it stored one past the submitted state, began
        rolling back, or was loaded from the store (an earlier process may have run its step
        0 and died before storing the next state: the store shows only step 0, but the
        step's effects are there) or has stored children. One this term submitted and never
        ran has nothing to undo."""
        return (
            self.step > 1
            or self.meta.state.kind is not ProcedureStateKind.RUNNING
            or not self.meta.wrote_every_key
            or self._resume_children
        )

    async def _drive(self) -> None:
        while True:
            kind = self.meta.state.kind
            if kind in _RUNNING_KINDS:
                await self._execute_step()
            elif kind is ProcedureStateKind.PREPARE_ROLLBACK:
                await self._prepare_rollback()
            elif kind is ProcedureStateKind.ROLLING_BACK:
                await self._rollback()
            else:
                return

    # -- executing -------------------------------------------------------------------

    def _context(self, attempt: int) -> Context:
        ctx = self.ctx
        return Context(
            self.meta.id,
            ctx,
            is_retrying=attempt > 1,
            fencing_token=ctx.fencing_token,
            lease_check=ctx.lease_check,
            crash_hook=self._crash_point,
        )

    def _crash_point(self, name: str) -> Awaitable[None]:
        return self.ctx.store.store.crash_point(f"{self.meta.id}/{self.step}/{name}")

    def _check_lease(self) -> None:
        """With a lease: no attempt at a step or a rollback starts once the lease may have passed
        to another manager (after a pause, or a retry's backoff); `LeaseExpired` ends the term."""
        if self.ctx.lease_check is not None:
            self.ctx.lease_check(f"step {self.step} of procedure {self.meta.id}")

    async def _execute_once(self, attempt: int) -> Status:
        self._check_lease()
        await self.ctx.raise_if_requested(self.meta.id)
        # Where a test's fault plan numbers attempts (a no-op on a production store).
        await self.ctx.store.store.crash_point(f"{self.meta.id}/{self.step}/#attempt")
        with self.ctx.telemetry.step_span(str(self.meta.id), self.meta.type_name, self.step, attempt), IN_EXECUTE:
            status = await self.procedure.execute(self._context(attempt))
        if not isinstance(status, Status):
            raise TypeError(f"execute() returned {status!r}, not a Status")
        return status

    def _on_retry(self, exc: BaseException, retry: int, delay: float) -> None:
        logger.info("procedure %s: retry %d in %.3fs after %s", self.meta.id, retry, delay, describe(exc))
        self.meta.retries += 1
        # A look ahead is as old as the write's first attempt: after a backoff, look again.
        self.ctx.request_looks.forget(self.meta.id)
        self.ctx.telemetry.retried(self.meta.type_name, exc)
        self.meta.set_state(ProcedureState.with_error(ProcedureStateKind.RETRYING, describe(exc), exc))

    async def _execute_step(self) -> None:
        try:
            status = await self.ctx.policy.call(self._execute_once, on_retry=self._on_retry, wake=self.meta.requested)
        except Fenced:
            raise  # from `ctx.check_lease()`: not the procedure's failure, the term's end
        except Exception as e:
            await self._fail(e)
            return
        children: dict[ProcedureId, Child] = {}
        if status.is_suspended():
            try:
                # Everything user code computes for a child, once and before any write: its
                # bytes are the same for every retry, and an error fails the parent cleanly.
                children = {sub.id: Child.of(sub) for sub in status.subprocedures}
            except Exception as e:
                await self._fail(e)
                return
            if (looped := self.ctx.child_cycle(self.meta.id, list(children))) is not None:
                await self._fail(
                    ProcedureError(
                        f"subprocedure {looped} is this procedure or waits for it (an ancestor, say): "
                        "waiting for it would never end"
                    )
                )
                return
            conflict = lock_conflict([self.meta, *self.ctx.ancestors(self.meta)], status.subprocedures, children)
            if conflict is not None:
                await self._fail(conflict)
                return
            # The edges count from now, before the first await: two procedures suspending on
            # each other in one tick must see each other's, or neither would see a cycle.
            for child_id in children:
                self.meta.add_child(child_id)
        if status.need_persist:
            if status.is_executing() and self.ctx.store.store.round_trips:
                self.ctx.request_looks.look_ahead(self.meta.id)  # the next attempt's, during the write
            # Dumped once: every retry of the write sends these same bytes, so a retry that
            # finds its own earlier write (answer lost) recognises it, whatever dump() does.
            try:
                data = dumped(self.procedure)
            except Exception as e:
                await self._fail(e)
                return
            if not await self._with_store_retries(partial(self._persist, data)):
                return
        if status.is_done():
            await self._commit_or_fail(ProcedureState.done(status.output))
            return
        if self.meta.state.kind is not ProcedureStateKind.RUNNING:
            self.meta.set_state(ProcedureState.running())
        if status.is_suspended():
            submit = partial(self._submit_children, status.subprocedures, children)
            if await self._with_store_retries(submit):
                await self._wait_children()

    async def _with_store_retries(self, write: Callable[[], Awaitable[None]]) -> bool:
        """Run a store write with retries; on final failure fail the procedure and return False."""
        try:
            attempt = unless_requested(self.ctx, self.meta, lambda _n: write())
            await self.ctx.policy.call(attempt, on_retry=self._on_retry, wake=self.meta.requested)
        except Fenced:
            raise
        except Exception as e:
            self.meta.wrote_every_key = False  # the last write may have landed unseen
            await self._fail(e)
            return False
        return True

    async def _persist(self, data: str) -> None:
        meta = self.meta
        await self.ctx.store.store_procedure(meta.id, self.step, meta.type_name, data, meta.parent_id, meta.run)
        self.step += 1
        self._stored_data = data

    async def _commit(self) -> None:
        await self.ctx.store.commit_procedure(self.meta.id, self.step)
        self.meta.terminal_keys += ((self.step, KeyType.COMMIT),)
        self.meta.end_stored = True
        self.step += 1

    async def _commit_attempt(self, _attempt: int) -> None:
        await self._commit()

    async def _write_commit(self, *, ends_failure: bool = False) -> bool | None:
        """Write `{step}.commit`: True once stored, False if the store surely lacks it, None if unknown.

        After the retries fail, the commit may still have landed with its answer lost, so the
        store is asked before anything else is written: two terminal keys must never coexist.
        An operator's request stops the retries of a success's commit (`ends_failure` False).
        """
        attempt: Callable[[int], Awaitable[None]]
        if ends_failure:
            attempt, wake = self._commit_attempt, first_request_wakes(self.ctx, self.meta.id, self.meta.requested)
        else:
            attempt, wake = unless_requested(self.ctx, self.meta, self._commit_attempt), self.meta.requested
        try:
            await self.ctx.policy.call(attempt, on_retry=self._on_retry, wake=wake)
        except Fenced:
            raise
        except Exception as e:
            logger.warning("procedure %s: cannot write its commit key: %s", self.meta.id, describe(e))
            self.meta.wrote_every_key = False  # it may land later: the deletion lists the folder
        else:
            return True
        key = self.ctx.store.key(self.meta.id, self.step, KeyType.COMMIT)
        try:
            stored = await self.ctx.policy.call(lambda _n: self.ctx.store.store.get(key))
        except Exception as e:
            logger.error("procedure %s: cannot tell whether %s was written: %s", self.meta.id, key, describe(e))
            return None
        if stored is None:
            return False
        self.meta.terminal_keys += ((self.step, KeyType.COMMIT),)
        self.meta.end_stored = True
        self.step += 1
        return True

    async def _commit_or_fail(self, done: ProcedureState) -> None:
        """Commit and finish; if the commit surely failed, fail; if unknown, touch nothing more."""
        key = self.ctx.store.key(self.meta.id, self.step, KeyType.COMMIT)
        committed = await self._write_commit()
        if committed:
            await self._finish(done)
        elif committed is False:
            # Not stored now, but a delayed request could still land at this step: the
            # failure goes one step above it, so the two can never share a step.
            self.step += 1
            request = self.ctx.operator_requests.get(self.meta.id)
            why = OperatorRequested(request) if request else StoreError("the commit could not be written", key=key)
            await self._fail(why)
        else:
            self._stop_unrecorded(f"its end could not be recorded and the store cannot say whether {key} was written")

    def _stop_unrecorded(self, what: str) -> None:
        """End this run writing nothing more: the next start() decides from what is stored."""
        self.meta.keep_keys = True
        why = f"{what}; nothing more was written, and the next start() resumes it"
        self.meta.set_state(unrecorded_end(why))

    # -- subprocedures ---------------------------------------------------------------

    async def _submit_children(
        self, subprocedures: Sequence[ProcedureWithId], children: dict[ProcedureId, Child]
    ) -> None:
        """Start each child that is not known yet; a known id is never started twice."""
        new: dict[ProcedureId, tuple[ProcedureWithId, Child]] = {}
        run = self.meta.run
        for sub in subprocedures:
            self.meta.add_child(sub.id)
            known = self.ctx.metas.get(sub.id)
            if known is not None and known.run < run and known.state.is_ended():
                # Its outcome is an earlier run's (this one was resumed or rewound): this run
                # creates it anew, as a manager that never knew the old one would.
                self.ctx.forget(sub.id)
                known = None
            if sub.id not in new and known is None and not self._claim_stored(sub.id):
                new[sub.id] = (sub, children[sub.id])
        created = await gather_settled(
            *(
                self.ctx.store.create_procedure(sub.id, child.type_name, child.data, self.meta.id, run)
                for sub, child in new.values()
            )
        )
        for (sub, child), ok in zip(new.values(), created, strict=True):
            if ok:
                state = ProcedureState.running()
                meta = self.ctx.new_meta(
                    sub.id, child.type_name, self.meta.id, sub.procedure, state, child.lock_key, run
                )
                meta.wrote_every_key = True
                self.ctx.telemetry.submitted(child.type_name)
                Runner(self.ctx, meta, sub.procedure, 1, child.data).start()
            else:
                reason = "its id already has stored steps that this manager could not load"
                poison_child(self.ctx, self.meta.id, sub.id, child.type_name, reason)

    async def _resume_stored_children(self) -> None:
        """After a restart, resume the children this procedure had stored, then wait for them.

        A procedure resumed while rolling back rolls back its unfinished children first (those
        that were still running fail, "their parent is rolling back"), so that no child's keys
        are deleted with the tree before its own rollback ran.
        """
        rolling_back = self.meta.state.kind in (ProcedureStateKind.PREPARE_ROLLBACK, ProcedureStateKind.ROLLING_BACK)
        children = self.ctx.stored.children_of.get(self.meta.id, [])
        for child_id in list(children):
            self.meta.add_child(child_id)
            if child_id not in self.ctx.metas:
                self._claim_stored(child_id, roll_back=rolling_back)
        if children:
            await self._wait_children()

    def _claim_stored(self, child_id: ProcedureId, *, roll_back: bool = False) -> bool:
        return claim_stored_child(self.ctx, self.meta.id, child_id, self._start_child, roll_back=roll_back)

    def _start_child(self, meta: ProcedureMeta, procedure: Procedure, step: int, data: str) -> None:
        Runner(self.ctx, meta, procedure, step, data, resume_children=True).start()

    async def _wait_children(self) -> None:
        """Wait until every child has ended. One whose end could not be stored (the store
        refused its failure, or the `.commit` after its rollback) ends this run the same way:
        the store says the child has not ended (the next start resumes the tree), so its
        parent must neither go on as if it had, nor roll back past it."""
        unrecorded: list[ProcedureId] = []
        for child_id in list(self.meta.children):
            child = self.ctx.metas.get(child_id)
            if child is not None:
                await child.wait_ended()
                if not child.state.recorded:
                    unrecorded.append(child_id)
        if unrecorded:
            self._stop_unrecorded(f"the end of its subprocedure {unrecorded[0]} could not be stored")

    # -- failing and rolling back ----------------------------------------------------

    async def _crashed(self, exc: Exception) -> None:
        """A bug in procstore, or an error in a hook outside execute() and rollback() (dump(),
        lock_key(), a property): the procedure fails as it would from execute(), its rollback
        included, so that the outcome watchers see is the one stored. If failing it breaks
        too, the failure is recorded without a rollback (keys kept while this manager runs,
        and for good with `keep_failed`); if the store refuses even that, nothing more is written and the next
        start() resumes it (its error says so)."""
        logger.error(
            "procedure %s (%s) crashed its runner", self.meta.id, self.meta.type_name, exc_info=(type(exc), exc, None)
        )
        failed = failed_state(exc, prefix="internal error: ")
        if self.meta.state.is_ended() or any(kind is KeyType.COMMIT for _, kind in self.meta.terminal_keys):
            self.meta.set_state(failed)  # its end is stored already (the crash came while deleting)
            return
        try:
            await self._fail(exc)
            await self._drive()
            return
        except BaseException as again:
            if is_stop(again):
                raise
            logger.error("procedure %s: failing it failed too: %s", self.meta.id, describe(again))
        self.meta.keep_keys = True
        failed = with_error(failed, f"{failed.error}; recorded as failed without running a rollback")
        try:
            if await self._write_rollback_key(failed.error or ""):
                await self._end_failure(failed)
                return
        except Exception as e:
            logger.error("procedure %s: cannot record its internal error: %s", self.meta.id, describe(e))
        self._stop_unrecorded(f"internal error: {describe(exc)}")

    async def _fail(self, exc: BaseException, *, roll_back: bool = True) -> None:
        """Record the failure: PREPARE_ROLLBACK, or for a procedure without rollback (or told
        not to roll back), FAILED."""
        failed = failed_state(exc, gave_up_after=self.ctx.policy.max_retry_times if is_transient(exc) else None)
        self.meta.cancelled = isinstance(exc, OperatorRequested) and exc.request.kind == "cancel"
        logger.warning("procedure %s (%s) failed: %s", self.meta.id, self.meta.type_name, failed.error)
        if roll_back and self.procedure.rollback_supported:
            self.meta.set_state(with_kind(failed, ProcedureStateKind.PREPARE_ROLLBACK))
            return
        if await self._write_rollback_key(failed.error or ""):
            await self._end_failure(failed)
        else:
            await self._finish(not_recorded(failed, self.step), delete=False)

    async def _prepare_rollback(self) -> None:
        state = self.meta.state
        if await self._write_rollback_key(state.error or ""):
            self.meta.set_state(with_kind(state, ProcedureStateKind.ROLLING_BACK))
        else:
            await self._finish(not_recorded(with_kind(state, ProcedureStateKind.FAILED), self.step), delete=False)

    async def _write_rollback_key(self, error: str) -> bool:
        """Write `{step}.rollback` with the failure; False if the store refused every retry."""

        try:
            data = dumped(self.procedure)
        except BaseException as e:
            if is_stop(e):
                raise
            data = self._stored_data
        message = ProcedureMessage(self.meta.type_name, data, self.meta.parent_id, self.step, error, self.meta.run)

        async def write(_attempt: int) -> None:
            await self.ctx.store.rollback_procedure(self.meta.id, message)
            self.meta.terminal_keys += ((self.step, KeyType.ROLLBACK),)
            self.step += 1

        try:
            await self.ctx.policy.call(write, wake=first_request_wakes(self.ctx, self.meta.id, self.meta.requested))
        except Fenced:
            raise
        except Exception as e:
            logger.error("procedure %s: cannot write its rollback key: %s", self.meta.id, describe(e))
            self.meta.wrote_every_key = False  # it may land later: the deletion lists the folder
            return False
        return True

    async def _rollback(self) -> None:
        state = self.meta.state
        failed = with_kind(state, ProcedureStateKind.FAILED)
        if not self.procedure.rollback_supported:
            await self._end_failure(failed)
            return

        def on_retry(exc: BaseException, retry: int, delay: float) -> None:
            logger.warning(
                "procedure %s: rollback retry %d in %.3fs after %s", self.meta.id, retry, delay, describe(exc)
            )
            self.meta.retries += 1
            self.ctx.telemetry.retried(self.meta.type_name, exc)

        async def attempt(n: int) -> None:
            self._check_lease()
            with IN_ROLLBACK:
                await self.procedure.rollback(self._context(n))

        try:
            wake = first_request_wakes(self.ctx, self.meta.id, self.meta.requested)
            await self.ctx.policy.call(attempt, retry_on=is_rollback_retryable, on_retry=on_retry, wake=wake)
        except Fenced:
            raise
        except Exception as e:
            error = f"{state.error}; then its rollback failed: {describe(e)} (it runs again at the next start)"
            await self._finish(
                ProcedureState.with_error(ProcedureStateKind.FAILED, error, e, format_tb(e)), delete=False
            )
            return
        self.meta.rolled_back = True
        await self._end_failure(failed)

    async def _end_failure(self, failed: ProcedureState) -> None:
        """The failure is recorded (and rolled back, if supported): write `.commit` above the
        `.rollback`, so that no restart, whatever its crash point and whoever the parent, runs
        the rollback again. Readers tell this end from success by the `.rollback` below it."""
        if await self._write_commit(ends_failure=True):
            # Kept (if asked) for an operator to resume or rewind; its children go as usual. A
            # subprocedure resumed as a root (its parent gone) cannot be restarted: it goes too.
            self.meta.keep_keys = self.meta.keep_keys or (self.ctx.keep_failed and self.meta.parent_id is None)
            await self._finish(failed)
            return
        note = "its end could not be recorded, so its rollback runs again at the next start"
        await self._finish(unrecorded_end(f"{failed.error}; {note}", failed), delete=False)

    # -- ending ----------------------------------------------------------------------

    async def _finish(self, state: ProcedureState, *, delete: bool = True) -> None:
        """Set the final state; a root first deletes its tree's keys (if `delete`)."""
        if not delete:
            self.meta.keep_keys = True
        self.meta.steps = max(self.step - 1, 0)
        if self.meta.is_root:
            ids = self.ctx.tree_ids(self.meta)
            metas = self.ctx.tree_metas(ids)
            wait = self.ctx.inherited_deletes_after - time.monotonic() if self.meta.inherited else 0.0
            if wait > 0:
                # A paused former leader's late write could re-create a key deleted now: the
                # end is recorded now, the keys go after the grace.
                await record_now(self.ctx, self.meta, ids, state)
                self.meta.set_state(state)
                later = delete_tree_later(self.ctx, self.meta, ids, metas, wait)
                self.ctx.spawn(later, name=f"procstore:delete-later:{self.meta.id}")
                return
            await delete_tree(self.ctx, self.meta, ids, metas, state)
            self.ctx.on_tree_finished(ids, metas)
        self.meta.set_state(state)
