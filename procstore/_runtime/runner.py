"""A procedure's run, from its first write to its tree's deletion.

- `submit_and_run`: a submit's part inside its term: store the first step, answer the
  caller, then run the procedure, all in one task that the term owns: stop() waits for it,
  and a caller that gives up meanwhile cannot leave a stored procedure unrun.
- `Runner`: drives one procedure from its locks to its final state. The loop, by state:
  - RUNNING / RETRYING: call `execute` (retrying `RetryLater` and store errors with
    backoff), persist if asked, then continue, start subprocedures and wait for them, or
    commit.
  - PREPARE_ROLLBACK: write the `.rollback` key, then ROLLING_BACK.
  - ROLLING_BACK: call `rollback()` (retried with backoff), then FAILED.
- `delete_tree`: a root that ends writes its tree's end records, then deletes its tree's
  keys before reporting the end, children first and itself last, so a crash part way still
  leaves it marked finished.

Step numbers: every persisting write uses `Runner.step` and then increments it; the commit
and rollback keys too. What a runner makes of user code's outcomes (failure texts, the
guard that tells a stray `CancelledError` from a stop) comes first.
"""

from __future__ import annotations

import asyncio
import contextvars
import time
import traceback
from collections.abc import Awaitable, Callable, Coroutine, Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from functools import partial
from types import MappingProxyType, TracebackType
from typing import TYPE_CHECKING, Any, TypeVar

from procstore._aio import gather_settled
from procstore._logs import get_logger, procedure_fields
from procstore._runtime.flow_control import Admission
from procstore._runtime.interrupt import RunningStep
from procstore._runtime.meta import ProcedureMeta
from procstore._runtime.retry import is_rollback_retryable, is_transient
from procstore._runtime.telemetry import run_traced
from procstore._runtime.waits import wall_clock
from procstore._text import valid_unicode
from procstore.errors import (
    DuplicateProcedure,
    EscapedBaseException,
    Fenced,
    LeaseExpired,
    LockConflict,
    LockCycle,
    ManagerStopped,
    ProcedureError,
    ProcessKill,
    StoreError,
    StrayCancellation,
    describe,
)
from procstore.flow import Concurrency, RateLimit
from procstore.ids import ProcedureId
from procstore.lock_key import LockKey, StringKey
from procstore.procedure import Context, Procedure, ProcedureWithId, Status, StatusKind
from procstore.state import ProcedureState, ProcedureStateKind
from procstore.store.history import Action, HistoryRecord, iso, kept_output
from procstore.store.keys import MAX_STEP, KeyType
from procstore.store.message import NO_WAIT, ProcedureMessage, StepWait
from procstore.store.requests import OperatorRequested
from procstore.store.signals import Signal
from procstore.wake_time import clamped_wake_at

if TYPE_CHECKING:
    from procstore._runtime.context import ManagerContext

logger = get_logger("procstore.runtime")

T = TypeVar("T")

_RUNNING_KINDS = (ProcedureStateKind.RUNNING, ProcedureStateKind.RETRYING)

NO_SIGNALS: Mapping[str, object] = MappingProxyType({})
"""`ctx.signals` of a step no signal woke: one for all, read-only (a run's first attempts
share their context)."""


# -- outcomes of user code -----------------------------------------------------------


def type_name_of(procedure: Procedure) -> str:
    name = getattr(procedure, "type_name", None)
    if not isinstance(name, str) or not name:
        raise TypeError(
            f"{type(procedure).__qualname__} has no `type_name`: set the class attribute "
            '`type_name = "app::Name"` (the key its loader is registered under)'
        )
    return name


def dumped(procedure: Procedure) -> str:
    """`procedure.dump()`, checked: the stored message's `data` is text, and any other value
    (a dict, bytes, None) would be stored as something no reader can load again; so would
    text that is not valid Unicode (a lone surrogate), which no store can even write."""
    data = procedure.dump()
    if not isinstance(data, str):
        raise TypeError(
            f"{type(procedure).__qualname__}.dump() returned {type(data).__name__} {_short(data)}, not a str: "
            "return the state as text (json.dumps(...), say); load() receives that same text"
        )
    if not data.isascii():  # the common case costs one scan, not an encoding
        try:
            data.encode()
        except UnicodeEncodeError as e:
            raise ValueError(
                f"{type(procedure).__qualname__}.dump() returned text that is not valid Unicode ({e.reason} at "
                f"index {e.start}): it cannot be stored"
            ) from None
    return data


def checked_lock_key(procedure: Procedure) -> LockKey:
    """`procedure.lock_key()`, checked before anything is written: any other value would
    fail the procedure only once stored, with an error far from its cause."""
    lock_key = procedure.lock_key()
    if not isinstance(lock_key, LockKey):
        raise TypeError(
            f"{type(procedure).__qualname__}.lock_key() returned {type(lock_key).__name__} {_short(lock_key)}, "
            'not a LockKey: return LockKey([StringKey.exclusive("table/42"), ...]), or LockKey() for none'
        )
    return lock_key


def admission_of(procedure: Procedure, type_name: str) -> Admission:
    """What the procedure asks of flow control, checked: another value than documented is
    the procedure's error."""
    concurrency = procedure.concurrency()
    if concurrency is not None and not isinstance(concurrency, Concurrency):
        raise TypeError(
            f"{type(procedure).__qualname__}.concurrency() returned {_short(concurrency)}, not a Concurrency"
        )
    rate = type(procedure).rate_limit
    if rate is not None and not isinstance(rate, RateLimit):
        raise TypeError(f"{type(procedure).__qualname__}.rate_limit is {_short(rate)}, not a RateLimit")
    if concurrency is None and rate is None:
        return Admission(type_name, None, None)
    priority = procedure.priority()
    if isinstance(priority, bool) or not isinstance(priority, int):
        raise TypeError(f"{type(procedure).__qualname__}.priority() returned {_short(priority)}, not an int")
    return Admission(type_name, concurrency, rate, priority)


def _short(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 80 else f"{text[:77]}..."


@dataclass(frozen=True, slots=True)
class Child:
    """What a parent computes for a subprocedure before it is written."""

    type_name: str
    data: str
    lock_key: LockKey

    @classmethod
    def of(cls, sub: ProcedureWithId) -> Child:
        return cls(type_name_of(sub.procedure), dumped(sub.procedure), checked_lock_key(sub.procedure))


def children_problem(
    ctx: ManagerContext, parent: ProcedureMeta, children: dict[ProcedureId, Child]
) -> ProcedureError | None:
    """What fails a parent before it waits for these children (a cycle, a lock conflict), or
    None. Returned, never raised: the failure is the parent's use of procstore, not a place in
    its code or procstore's, so its traceback is the error's one line, without frames."""
    if (looped := ctx.metas.child_cycle(parent.id, list(children))) is not None:
        return ProcedureError(
            f"subprocedure {looped} is this procedure or waits for it (an ancestor, say): "
            "waiting for it would never end"
        )
    # The parent and its ancestors hold their locks while the child runs: waiting would deadlock.
    holders = [parent, *ctx.metas.ancestors(parent)]
    for child_id, child in children.items():
        for holder in holders:
            if keys := holder.lock_key.conflicts_with(child.lock_key):
                return LockConflict(holder.id, child_id, keys)
    return None


PROCESS_EXITS = (KeyboardInterrupt, SystemExit, ProcessKill)
"""What user code may raise to end the process, not its procedure."""


def is_stop(exc: BaseException) -> bool:
    """Whether `exc` ends this task as a stop, a cancel or a process exit would, rather
    than failing its procedure: a `CancelledError` counts only while the task is being
    cancelled (user code that cancelled and awaited its own helper raises a stray one)."""
    if isinstance(exc, asyncio.CancelledError):
        task = asyncio.current_task()
        return task is not None and task.cancelling() > 0
    return isinstance(exc, PROCESS_EXITS)


def as_failure(exc: BaseException, what: str) -> Exception:
    """The failure to record for `exc`, which escaped user code and `is_stop` refused."""
    if isinstance(exc, Exception):
        return exc
    if isinstance(exc, asyncio.CancelledError):
        return StrayCancellation(f"{what} raised CancelledError, but nothing cancelled the procedure")
    return EscapedBaseException(f"{what} raised {type(exc).__name__}: {exc}")


class NotCancelledByItself:
    """`with IN_EXECUTE: await ...`: a `BaseException` the block raises that is not a stop (a
    stray `CancelledError`, a `GeneratorExit`, a user's own subclass) is that code's failure:
    taken for a stop, it would leave the procedure RUNNING and its watchers waiting forever.

    A context manager, one for all, not a coroutine around the call: a procedure waiting in
    its step would hold that coroutine for as long as it waits."""

    __slots__ = ("what",)

    def __init__(self, what: str) -> None:
        self.what = what

    def __enter__(self) -> None:
        pass

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        if exc is not None and not isinstance(exc, Exception) and not is_stop(exc):
            raise as_failure(exc, self.what) from exc


IN_EXECUTE = NotCancelledByItself("execute()")
IN_ROLLBACK = NotCancelledByItself("rollback()")


def format_tb(exc: BaseException) -> str:
    return "".join(traceback.format_exception(exc))


def failed_state(exc: BaseException, *, gave_up_after: int | None = None, prefix: str = "") -> ProcedureState:
    # An operator's request says itself what happened; its class name would only be noise.
    # Stored in the `.rollback` and the history record: text that cannot be encoded (a
    # lone surrogate from an undecodable file name, say) would make the failure unstorable.
    error = valid_unicode(prefix + (str(exc) if isinstance(exc, OperatorRequested) else describe(exc)))
    if gave_up_after is not None:
        error = f"gave up after {gave_up_after} retries: {error}"
    return ProcedureState.with_error(ProcedureStateKind.FAILED, error, exc, format_tb(exc))


# -- submitting ----------------------------------------------------------------------


def submit_and_run(
    ctx: ManagerContext,
    procedure: ProcedureWithId,
    type_name: str,
    lock_key: LockKey,
    data: str,
    on_stored: Callable[[], None],
) -> asyncio.Future[ProcedureMeta | None]:
    """Start a submitted procedure's one task, which the term owns: it stores the first step,
    answers the future returned, then runs the procedure itself (one task per procedure, not
    a task for the write and another for the run). `lock_key` and `data` were computed by
    the caller. See `Submission` for the answers."""
    submission = Submission(asyncio.get_running_loop().create_future(), on_stored)
    run = submission.run(ctx, procedure, type_name, lock_key, data)
    task = ctx.term.spawn(run, name=f"procstore:{type_name}:{procedure.id}")
    task.add_done_callback(submission.task_ended)
    return submission.answer


class Submission:
    """A submit's answer: the procedure's meta once its first step is stored (None for a
    duplicate: the key holds another value), the write's error, or `ManagerStopped` if the
    term ended the task first (the write may have landed). `on_stored` is called once, before
    the answer, however the task ends. Awaiting the answer does not await the task: a caller
    that gives up leaves it to finish, so a stored procedure never stays unrun, and stop()
    waits for it (no write lands after it returned)."""

    __slots__ = ("_on_stored", "answer")

    def __init__(self, answer: asyncio.Future[ProcedureMeta | None], on_stored: Callable[[], None]) -> None:
        self.answer = answer
        self._on_stored: Callable[[], None] | None = on_stored

    def settle(self, meta: ProcedureMeta | None, error: BaseException | None = None) -> None:
        if self._on_stored is not None:
            on_stored, self._on_stored = self._on_stored, None
            on_stored()
        if not self.answer.done():  # else its caller gave up (it was cancelled)
            if error is not None:
                self.answer.set_exception(error)
            else:
                self.answer.set_result(meta)

    def task_ended(self, task: asyncio.Task[None]) -> None:
        """Settle a submit whose task ended before its write's outcome was known (cancelled
        before it began, say)."""
        if self._on_stored is not None:
            error = None if task.cancelled() else task.exception()
            self.settle(None, error or ManagerStopped(what="submitting"))

    async def run(
        self, ctx: ManagerContext, procedure: ProcedureWithId, type_name: str, lock_key: LockKey, data: str
    ) -> None:
        pid = procedure.id
        try:
            if not await store_submitted(ctx, pid, type_name, data):
                self.settle(None)  # a duplicate: the key holds another value
                return
            ctx.settings.telemetry.submitted(type_name)
            meta = ctx.metas.register(pid, type_name, None, procedure.procedure, ProcedureState.running(), lock_key)
        except asyncio.CancelledError:
            self.settle(None, ManagerStopped(what="submitting"))  # only the term cancels this task
            raise
        except BaseException as e:
            self.settle(None, e)
            if isinstance(e, Exception):
                return  # the caller's error: nothing was stored, or it may have landed
            raise  # a process exit, a simulated crash: it ends the task as it would the process
        meta.keys.every = True
        if not (ctx.term.running and (ctx.lease is None or ctx.lease.is_holding())):
            # Stored, but the term ended as the write landed: the next term (this manager's next
            # start, or the leader's recovery or look for procedures stored after it) runs it.
            # Its watcher here raises `ManagerStopped`.
            meta.abandon()
        self.settle(meta)
        if not meta.abandoned:
            await Runner(ctx, meta, procedure.procedure, 1, data).traced_run()


async def store_submitted(ctx: ManagerContext, pid: ProcedureId, type_name: str, data: str) -> bool:
    """Create a submitted procedure's first key, retrying transient errors as a step's write.

    Repeating the create is safe: it is create-only and recognises our own bytes. Returns
    False if the key holds something else (a duplicate id). Raises `DuplicateProcedure` if
    the id ran and ended already (its first run has an end record): an id is used once, for
    as long as history keeps its records). That look is sent with the create; a key this
    submit created for such an id is deleted again, a key that held these bytes already (a
    kept procedure's) never.
    """
    retried = stored = False
    first = ctx.store.key(pid, 0, KeyType.STEP)
    looks = ctx.requests.looks

    async def create(attempt: int) -> bool:
        if ctx.store.store.round_trips:  # one round trip for the three, not three
            # The first attempt's look for an operator request goes with the create, as a
            # step's look goes with its write (`RequestLooks.look_ahead`): a request for the
            # id can only be stored once this key is, so it moves no boundary of the promise.
            looks.look_ahead(pid)
            created, ended = await gather_settled(
                ctx.store.create_submitted(pid, type_name, data), ctx.store.history.has_ended(pid, 1)
            )
            if created is None:
                # The key was stored before this attempt (a submit whose answer was lost): a
                # request may have been stored while it ran, after the look began.
                looks.forget(pid)
        else:  # nothing to overlap: no task and future for each
            created = await ctx.store.create_submitted(pid, type_name, data)
            ended = await ctx.store.history.has_ended(pid, 1)
        if ended:
            if created:  # by this attempt: nobody else's key (a kept procedure's, say) goes
                await ctx.store.store.batch_delete([first])
            raise DuplicateProcedure(
                pid, f" and has ended: its end record {ctx.store.history.run_key(pid, 1)} is stored (an id runs once)"
            )
        return created is not False

    def on_retry(exc: BaseException, retry: int, delay: float) -> None:
        nonlocal retried
        retried = True
        looks.forget(pid)  # as old as the attempt that failed: the next one looks again
        about = procedure_fields(pid, type_name, 0)  # key 0: the submitted state
        logger.info("procedure %s: submit retry %d in %.3fs after %s", pid, retry, delay, describe(exc), extra=about)

    # A request for this id (a cancel written once an attempt landed) ends a backoff: the
    # procedure then runs at once, and fails before its first step as the request asks.
    try:
        with ctx.requests.submit_wake(pid) as wake:
            stored = await ctx.settings.policy.call(create, on_retry=on_retry, wake=wake)
            return stored
    except LeaseExpired as e:
        if not retried:
            raise  # refused before anything was sent: nothing is stored
        # An earlier attempt may have landed with its answer lost: the outcome is unknown.
        raise StoreError(
            f"submitting procedure {pid}: {e}, while retrying a write that may have landed. "
            "Submit it again on the leader: DuplicateProcedure then means it is stored and runs there",
            key=e.key,
        ) from e
    finally:
        if not stored:
            looks.forget(pid)  # no run of this submit takes it


# -- running -------------------------------------------------------------------------


class Runner:
    """Runs one procedure in its own task until it ends or the manager stops."""

    __slots__ = (
        "_attempt", "_consuming", "_first_context", "_message_skips_a_step", "_parked", "_resume_children",
        "_signal_names", "_signals", "_signals_seen", "_skip_signals", "_stored_data", "_submitted", "_trace_parent",
        "_wait", "ctx", "holds_locks", "meta",
        "procedure", "restarted", "step",
    )  # fmt: skip

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
        wait: StepWait | None = None,
        restarted: bool = False,
    ) -> None:
        self.ctx = ctx
        self.meta = meta
        self.procedure = procedure
        self.step = step
        """The step number of the next key this runner writes."""
        self._stored_data = stored_data
        """The last `data` known to be stored: the rollback message's fallback if `dump()` fails."""
        self._resume_children = resume_children
        self._message_skips_a_step = resume_children and ctx.lease is not None
        """See `_message_step`: a procedure resumed from the store under a lease."""
        self.holds_locks = holds_locks
        """Its lock keys were taken for it already (see `KeyRwLock.acquire_all_now`)."""
        self._wait = wait if wait is not None and wait.waits else None
        """The durable wait its last stored step ended with, until it is over (see `waits.py`)."""
        self._skip_signals: tuple[str, ...] = (
            () if wait is None or not wait.consumed else ctx.store.signals.own(meta.id, wait.consumed)
        )
        """Signal keys consumed by a stored step and not known to be deleted yet: never
        delivered again, and named in every message it stores until they are deleted."""
        self._signals: dict[str, object] = {}
        """`ctx.signals` for the next call of `execute`: the signal that ended its wait."""
        self._consuming: tuple[str, ...] = ()
        """Keys of the signals delivered to a step whose outcome is not stored yet: named in
        its next stored message, and deleted once that is stored."""
        self._signals_seen = False
        """A call of `execute` got `_signals`: a failure of that step consumes them too. One
        that fails before the call (an operator's request met first) leaves them unread."""
        self._parked = False
        """Parked in `ctx.waits`: its task has ended, and its locks stay held for it."""
        self.restarted = restarted
        """Resumed or rewound by an operator: it ran no step since it ended (or stopped), so it
        held no concurrency slot, and waits for one as a new procedure does."""
        self._signal_names: dict[str, str] = {}
        """The names of the signals it read and did not take (of another name than its wait's;
        "" for an unreadable value): a later wait reads a signal again only if it may be the one."""
        self._submitted = not resume_children
        """Its first run here began at `submit()` (not a recovery's or a resume's)."""
        self._trace_parent: object = None
        """What its first run's span is a child of (or linked to): each run after a durable
        wait is too, so that a wait never cuts a procedure tree into two traces."""
        self._attempt: RunningStep | None = None
        """Its attempts at steps inside `execute()`: one object, begun again at each."""
        self._first_context: Context | None = None
        """The `Context` of every first attempt that no signal woke (the context an attempt
        gets is the same for all of them in a term): made once per run, not per step."""

    def start(self) -> None:
        self.ctx.term.spawn(self.traced_run(), name=f"procstore:{self.meta.type_name}:{self.meta.id}")

    def traced_run(self) -> Coroutine[Any, Any, None]:
        """Its run inside its procedure's span: awaited by its own task. What the span is a
        child of is kept for each run after a durable wait (`_run_again`), which starts in a
        context of its own."""
        self._trace_parent = self.ctx.settings.telemetry.trace_parent()
        return run_traced(self.ctx, self.meta, self, self._run, submitted=self._submitted)

    async def _run(self) -> None:
        held: list[StringKey] = []
        try:
            # Refused by flow control or its locks, it has recorded its failure: the drive
            # finishes it (with a rollback, if supported).
            if await self._admitted() and await self._acquire_all(held):
                if self.meta.record.start_time is None:
                    self.meta.mark_started()
                if self._resume_children:
                    await self._resume_stored_children()
                if self._skip_signals:
                    await self._delete_consumed()  # its stored step consumed them: a crash came before their deletion
                if self._wait is not None and await self._waits_on():
                    return
            await self._drive()
        except LeaseExpired as e:
            # The lease may be another manager's now: not a failure, the procedure resumes there.
            self.meta.abandon()
            self.ctx.term.step_down(e)
        except Fenced as e:
            # Another manager wrote this step key: it runs the procedure now. Write nothing more.
            self.meta.keys.keep = True
            self.meta.set_state(ProcedureState.with_error(ProcedureStateKind.POISONED, str(e), e))
            self.ctx.term.step_down(e)
        except BaseException as e:
            if is_stop(e):
                raise
            await self._crashed(as_failure(e, "a hook of the procedure"))
        finally:
            if not self._parked:
                self._release(held)
                self.ctx.waits.flow.release(self.meta.id)

    def _has_started(self) -> bool:
        """Whether it was running when this term took it over (stored past its first state,
        or failing, and not restarted by an operator): flow control counts it as running,
        and never makes it wait."""
        if self.restarted:
            return False
        return self.step > 1 or self.meta.state.kind is not ProcedureStateKind.RUNNING

    def take_slot_if_started(self) -> None:
        """A resumed procedure that had started takes its concurrency slot now, before any
        runner starts: a new one must not take it first (it would run above the limit).
        One whose `concurrency()` fails takes none: its runner fails it."""
        if not self._has_started():
            return
        try:
            admission = admission_of(self.procedure, self.meta.type_name)
        except Exception:
            return
        self.ctx.waits.flow.take_started(self.meta.id, admission)

    async def _admitted(self) -> bool:
        """Wait for flow control (`Procedure.concurrency()`, `rate_limit`); False if the
        procedure failed instead (an operator's request came first: it had not started)."""
        admission = admission_of(self.procedure, self.meta.type_name)
        if self.restarted:
            admission = replace(admission, rate=None)  # no first start: the rate counts those
        if not admission.limited:
            return True
        started = self._has_started()
        if admission.rate is not None and not started:
            # Its start is stored before its first attempt (a round trip, and the type's recent
            # starts read first once a term): a look ahead would be as old as those.
            self.ctx.requests.looks.forget(self.meta.id)

        def report(why: str | None) -> None:
            if why is not None and why != self.meta.record.waiting:
                self.ctx.activity.waiting_to_start(self.meta, self.step, why)
                self.ctx.requests.looks.forget(self.meta.id)  # a look ahead would be as old as the wait
            self.meta.record.waiting = why

        flow = self.ctx.waits.flow
        if await flow.admit(self.meta.id, admission, started=started, unless=self.meta.requested(), report=report):
            return True
        await self._fail(OperatorRequested(self.ctx.requests[self.meta.id]), roll_back=False)
        return False

    async def _acquire_all(self, held: list[StringKey]) -> bool:
        """Take every lock key, in order, appending each to `held` (all at once if it holds
        them already); False if the procedure failed instead (it recorded the failure).

        One that may have run a step already (`_may_have_run`) must roll back holding its
        locks, so an operator's request does not end its wait: it is honoured once the
        procedure holds them (as between steps). Before a wait that would close a cycle, it
        gives back what it holds and waits for all of them again, once: a cycle that
        remains runs through an ancestor (which holds its locks while it waits for this
        one), and no wait can end it. It then fails without a rollback and its keys are
        kept, for an operator to resume or rewind: rolling back without the locks could
        undo work beside their holder.
        """
        keys = self.meta.lock_key.keys_to_lock()
        if self.holds_locks:
            held += keys
            return True
        may_have_run = self._may_have_run()
        gave_back = False
        locks, waits_for = self.ctx.locks, self.ctx.metas.unfinished_children
        while len(held) < len(keys):
            key = keys[len(held)]
            if locks.would_block(key) and (cycle := locks.cycle(self.meta.id, key, waits_for)) is not None:
                if may_have_run and held and not gave_back:
                    self._release(held)
                    gave_back = True
                    if locks.cycle(self.meta.id, keys[0], waits_for) is None:
                        continue
                self.meta.keys.keep = self.meta.keys.keep or may_have_run
                await self._fail(LockCycle(self.meta.id, key.key, cycle, kept=may_have_run), roll_back=False)
                return False
            if not await self._wait_for(key, ends_on_request=not may_have_run):
                # An operator's request ends the wait of one that never ran: it fails at once.
                await self._fail(OperatorRequested(self.ctx.requests[self.meta.id]), roll_back=False)
                return False
            held.append(key)
        return True

    async def _wait_for(self, key: StringKey, *, ends_on_request: bool) -> bool:
        """Wait for `key`; False (nothing taken) if an operator's request came first and
        `ends_on_request`. Otherwise the request waits, said once in the log."""
        locks = self.ctx.locks
        if locks.would_block(key):
            self.ctx.requests.looks.forget(self.meta.id)  # a look ahead would be as old as the wait
            held_by = sorted(str(h) for h in locks.holders_of(key))
            self.ctx.activity.waiting_on_lock(self.meta, self.step, key.key, held_by)
        if await locks.acquire(self.meta.id, key, self.meta.requested()):
            return True
        if ends_on_request:
            return False
        holders = ", ".join(str(h) for h in sorted(locks.holders_of(key), key=str))
        logger.warning(
            "procedure %s: %s: honoured once it holds its locks (its step may have run, and its "
            "rollback needs them); it waits for %s, held by %s",
            self.meta.id,
            self.ctx.requests[self.meta.id].describe(),
            key.key,
            holders or "procedures queued before it",
            extra=procedure_fields(self.meta.id, self.meta.type_name, self.step),
        )
        return await locks.acquire(self.meta.id, key, None)

    def _release(self, held: list[StringKey]) -> None:
        while held:
            self.ctx.locks.release(self.meta.id, held.pop())

    def _may_have_run(self) -> bool:
        """Whether a step may have run already: it stored one past the submitted state, began
        rolling back, or was loaded from the store (an earlier process may have run its step
        0 and died before storing the next state: the store shows only step 0, but the
        step's effects are there) or has stored children. One this term submitted and never
        ran has nothing to undo."""
        return (
            self.step > 1
            or self.meta.state.kind is not ProcedureStateKind.RUNNING
            or not self.meta.keys.every
            or self._resume_children
        )

    async def _drive(self) -> None:
        while not self._parked:
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

    def _context(self, attempt: int, step: RunningStep | None = None) -> Context:
        ctx, lease = self.ctx, self.ctx.lease
        return Context(
            self.meta.id,
            ctx,
            is_retrying=attempt > 1,
            fencing_token=None if lease is None else lease.fencing_token,
            lease_check=None if lease is None else lease.check_writable,
            crash_hook=self._crash_point if ctx.store.store.observes_crash_points else None,
            hold_interrupts=None if step is None else step.uninterruptible,
            signals=MappingProxyType(self._signals) if self._signals else NO_SIGNALS,
        )

    def _attempt_context(self, attempt: int, step: RunningStep) -> Context:
        """`_context` for an attempt at a step: the run's one context for a first attempt that
        no signal woke (`step` is the same object at every attempt of a run)."""
        if attempt > 1 or self._signals:
            return self._context(attempt, step)
        if self._first_context is None:
            self._first_context = self._context(attempt, step)
        return self._first_context

    def _crash_point(self, name: str) -> Awaitable[None]:
        return self.ctx.store.store.crash_point(f"{self.meta.id}/{self.step}/{name}")

    def _check_lease(self) -> None:
        """With a lease: no attempt at a step or a rollback starts once the lease may have passed
        to another manager (after a pause, or a retry's backoff); `LeaseExpired` ends the term."""
        if self.ctx.lease is not None:
            self.ctx.lease.check_writable(f"step {self.step} of procedure {self.meta.id}")

    async def _execute_once(self, attempt: int) -> Status:
        self._check_lease()
        if self.step + self._message_skips_a_step > MAX_STEP:
            # Whatever the step returns could not be stored (a hand-written folder near the
            # largest step): it would run again at every start. Failing writes nothing either.
            raise ProcedureError(
                f"procedure {self.meta.id}: its next state would be stored above step {MAX_STEP}, the largest a "
                "key can carry, so its step is not run"
            )
        self.ctx.activity.running(self.meta, self.step)
        # An operator's request (`cancel`, `fail`) ends the execution: read from the store
        # when not known here, so that one written since is seen in time.
        requests, pid = self.ctx.requests, self.meta.id
        request = requests.get(pid)
        if request is None:
            request = requests.noted(pid, await requests.looks.get(pid))
        if request is not None:
            raise OperatorRequested(request)
        store = self.ctx.store.store
        if store.observes_crash_points:  # where a test's fault plan numbers attempts
            await store.crash_point(f"{self.meta.id}/{self.step}/#attempt")
        with (
            requests.running_step(pid, self._attempt) as step,
            self.ctx.settings.telemetry.step_span(str(pid), self.meta.type_name, self.step, attempt),
            IN_EXECUTE,
        ):
            self._attempt = step
            self._signals_seen = True
            status = await self.procedure.execute(self._attempt_context(attempt, step))
        if not isinstance(status, Status):
            raise TypeError(f"execute() returned {status!r}, not a Status")
        return status

    def _on_retry(self, exc: BaseException, retry: int, delay: float) -> None:
        logger.info("procedure %s: retry %d in %.3fs after %s", self.meta.id, retry, delay, describe(exc))
        self.meta.record.retries += 1
        self.ctx.activity.backing_off(self.meta, self.step, retry, exc, delay)
        # A look ahead is as old as the write's first attempt: after a backoff, look again.
        self.ctx.requests.looks.forget(self.meta.id)
        self.ctx.settings.telemetry.retried(self.meta.type_name, exc)
        self.meta.set_state(ProcedureState.with_error(ProcedureStateKind.RETRYING, describe(exc), exc))

    async def _execute_step(self) -> None:
        try:
            # The first attempt without `policy.call` (two coroutines fewer); the retries
            # outside the `except`, so that their errors do not chain to the first one's.
            policy, first = self.ctx.settings.policy, None
            try:
                status = await self._execute_once(1)
            except Exception as e:
                if not policy.retries(e):
                    raise
                first = e
            if first is not None:
                status = await policy.retry_after(
                    self._execute_once, first, on_retry=self._on_retry, wake=self.meta.requested
                )
        except Fenced:
            raise  # from `_check_lease()`: not the procedure's failure, the term's end
        except Exception as e:
            await self._fail(e)
            return
        # The kind compared here, not asked of `status` at each turn: a step makes no call for it.
        kind = status.kind
        children: dict[ProcedureId, Child] = {}
        if kind is StatusKind.SUSPENDED:
            try:
                # Everything user code computes for a child, once and before any write: its
                # bytes are the same for every retry, and an error fails the parent cleanly.
                children = {sub.id: Child.of(sub) for sub in status.subprocedures}
            except Exception as e:
                await self._fail(e)
                return
            if (problem := children_problem(self.ctx, self.meta, children)) is not None:
                await self._fail(problem)
                return
            # The edges count from now, before the first await: two procedures suspending on
            # each other in one tick must see each other's, or neither would see a cycle.
            for child_id in children:
                self.meta.add_child(child_id)
            # Before the step that records them is stored: a stop while a child waits out a
            # failed deletion of its folder would leave that step stored and the child never
            # created, and the parent's next start would go on without it.
            if in_doubt := self.ctx.store.deletes_in_doubt:
                for child_id in children:  # one after another: the whole wait is the longest one's
                    await in_doubt.settled(child_id)
        if self._signals:
            self._signals = {}  # delivered to this step, consumed with what it stores next
        if kind is StatusKind.DONE:
            await self._commit_or_fail(ProcedureState.done(status.output))
            return
        wait = self._wait_of(status) if kind is StatusKind.WAITING or self._consuming or self._skip_signals else NO_WAIT
        if status.persist:
            if kind is StatusKind.EXECUTING and self.ctx.store.store.round_trips:
                self.ctx.requests.looks.look_ahead(self.meta.id)  # the next attempt's, during the write
            # Dumped once: every retry of the write sends these same bytes, so a retry that
            # finds its own earlier write (answer lost) recognises it, whatever dump() does.
            try:
                data = dumped(self.procedure)
            except Exception as e:
                await self._fail(e)
                return
            if not await self._with_store_retries(partial(self._persist, data, wait)):
                return
            self.step += 1
            self._stored_data = data
            if self._consuming or self._skip_signals:
                await self._delete_consumed()
        else:
            # Nothing stored, so nothing awaited may have yielded (the look for a request
            # reads a missing key at once on memory:// and local; a sleep already over
            # does not park): a run of such steps would hold the event loop, and no lease
            # renewal nor cancel could run.
            await asyncio.sleep(0)
        if self.meta.state.kind is not ProcedureStateKind.RUNNING:
            self.meta.set_state(ProcedureState.running())
        if kind is StatusKind.WAITING:
            self._wait = wait
            await self._waits_on()
            return
        if kind is StatusKind.SUSPENDED:
            submit = partial(self._submit_children, status.subprocedures, children)
            if await self._with_store_retries(submit):
                await self._wait_children()

    async def _with_store_retries(self, write: Callable[[], Awaitable[None]]) -> bool:
        """Run a store write with retries; on final failure fail the procedure and return False."""
        try:
            policy, first = self.ctx.settings.policy, None  # as in `_execute_step`
            try:
                await write()  # the first attempt always goes: see `unless_requested`
            except Exception as e:
                if not policy.retries(e):
                    raise
                first = e
            if first is not None:
                attempt = self.ctx.requests.unless_requested(self.meta.id, lambda _n: write())
                await policy.retry_after(attempt, first, on_retry=self._on_retry, wake=self.meta.requested)
        except Fenced:
            raise
        except Exception as e:
            self.meta.keys.every = False  # the last write may have landed unseen
            await self._fail(e)
            return False
        return True

    def _message_step(self) -> int:
        """The step of the next `.step` or `.rollback` this runner writes.

        Under a lease, the first one of a procedure resumed from the store leaves a step
        number free (its latest key's + 1) for a former leader's late write: one paused with
        a write of this procedure in flight can land it after this manager listed the
        folder, and only at that step (a runner writes one key at a time, each numbered one
        above the last one stored). Create-only writes stop it only where it has the same
        name as this manager's key: a `.rollback` landing beside this manager's `.step` at
        one step outranks it, and below this manager's `.commit` reads as the end (failed,
        though the run committed done). Above that step, nothing a former leader can still
        write is the latest key or the message a commit ends. A `.commit` needs no free
        step: the message it ends is the highest one below its own step
        (`procstore.store.folder`). This holds on every store, as it needs no clock (listing
        times are absent on some stores, and on others a request's start or a temporary
        file's, not when the key became visible)."""
        if self._message_skips_a_step:
            self._message_skips_a_step = False
            self.step += 1
        return self.step

    def _persist(self, data: str, wait: StepWait) -> Awaitable[None]:
        """One attempt at a step's write. Not a coroutine (one frame fewer in the chain of
        every write): the caller counts the step once the write is stored."""
        meta = self.meta
        step = self._message_step()
        return self.ctx.store.store_procedure(meta.id, step, meta.type_name, data, meta.parent_id, meta.run, wait)

    # -- durable waits ---------------------------------------------------------------

    def _wait_of(self, status: Status) -> StepWait:
        """What the message stored for `status` says of waits: its wake-up time (a delay
        counts from now, by the manager's clock), the signal it waits for, and the signals
        this step consumed."""
        if not status.is_waiting():
            consumed = self._consuming + self._skip_signals
            return StepWait(consumed=consumed) if consumed else NO_WAIT
        wake_at = status.wake_at
        if wake_at is None and status.delay is not None:
            wake_at = clamped_wake_at(wall_clock() + status.delay)
        return StepWait(wake_at, status.signal, self._consuming + self._skip_signals)

    async def _delete_consumed(self, *, named: bool = True) -> None:
        """The step that read `_consuming` is stored: delete those signals. A deletion that
        fails is logged; the stored message names them (`named`), so they are never
        delivered again. An operator's request then ends its retries: they are left to a
        later deletion (the next stored message's, the end's, or the request poll's), not
        waited for. At a child's `.commit` they are not `named`: its messages go with its
        tree, and its parent's resume or rewind creates it again under the same id, which
        would get them; so their retries run in full, as the commit's own do. A root's
        outlive its end: kept, its `.rollback` names them for the copy of a resume or
        rewind; else its id never runs again. Awaited only when there are some: a step
        that consumed none starts no coroutine."""
        keys = self._skip_signals = self._consuming + self._skip_signals
        self._consuming = ()
        if not keys:
            return
        # Deleted after the step's write and before the next attempt: a look ahead sent with
        # the write would be older than a request stored while they go.
        self.ctx.requests.looks.forget(self.meta.id)
        requests, pid, signals = self.ctx.requests, self.meta.id, self.ctx.store.signals

        def delete(_n: int) -> Awaitable[None]:
            return signals.delete(keys)

        attempt = requests.unless_requested(pid, delete) if named else delete
        wake = self.meta.requested if named else requests.first_wakes(pid, self.meta.requested)
        try:
            await self.ctx.settings.policy.call(attempt, wake=wake)
        except Exception as e:
            logger.warning("procedure %s: cannot delete its consumed signals yet: %s", self.meta.id, describe(e))
        else:
            self._skip_signals = ()

    async def _waits_on(self) -> bool:
        """Whether its wait goes on: if so it is parked (True), and its task may end. Else
        the wait is over (False): by time, by a signal it waits for (`ctx.signals` holds it
        for the next call), or by an operator's request (the next attempt honours it)."""
        wait = self._wait
        assert wait is not None
        if self.meta.id in self.ctx.requests:
            self._wait = None
            return False
        waits, pid = self.ctx.waits, self.meta.id
        while wait.signal is not None:
            waits.begin_reading(pid)
            # An operator's request ends the read's backoff, and is what ends the procedure:
            # its next attempt honours it (as a step's retries do), not the store's error.
            read = self.ctx.requests.unless_requested(pid, lambda _n: self._read_signals(wait.signal or ""))
            try:
                found = await self.ctx.settings.policy.call(read, wake=self.meta.requested)
            except Fenced:
                raise
            except Exception as e:
                self._wait = None
                if pid not in self.ctx.requests:
                    await self._fail(e)
                return False
            finally:
                signalled = waits.end_reading(pid)
            if found:
                self._wait = None
                self._signals = {found.name: found.payload}
                self._consuming = (found.key,)
                self._signals_seen = False
                return False
            if not signalled:
                break  # else a signal sent during the read may not be in it: read again
        # A request noted during the read found it not parked (`Waits.wake` did nothing):
        # parked now, nothing would wake it.
        if (wait.wake_at is not None and wall_clock() >= wait.wake_at) or self.meta.id in self.ctx.requests:
            self._wait = None
            return False
        self._parked = True
        self.meta.record.waiting = wait.describe()
        self.ctx.activity.waiting(self.meta, self.step, self.meta.record.waiting)
        not_for_it = frozenset(self._signal_names).union(self._skip_signals)
        waits.park(pid, wait.wake_at, wait.signal, self._woken, not_for_it)
        return True

    async def _read_signals(self, name: str) -> Signal | None:
        """The first signal `name` sent to it that no stored step consumed: one listing, then
        a read of each signal in order that is not known to be of another name, until one
        is `name`'s. Delivering n signals so costs n listings and about n reads, not n^2."""
        signals = self.ctx.store.signals
        keys = await signals.keys(self.meta.id, skip=self._skip_signals)
        known = self._signal_names
        self._signal_names = names = {key: known[key] for key in keys if key in known}  # deleted ones go
        for key in keys:
            if names.get(key, name) != name:
                continue
            signal = await signals.read(key)
            if signal is not None and signal.name == name:
                return signal
            names[key] = "" if signal is None else signal.name
        return None

    def _woken(self) -> None:
        """Called by `ctx.waits`: run again, in a new task, with the locks it kept."""
        self._parked = False
        self.meta.record.waiting = None
        self.holds_locks = True
        self._resume_children = False
        if self.ctx.term.running:
            # In a context of its own, not the waker's (a cancel's or a signal's caller, the
            # timer task): its spans and log fields are this procedure's alone.
            contextvars.Context().run(self._run_again)

    def _run_again(self) -> None:
        """Its next run after a durable wait, in the new context `_woken` made for it."""
        self.ctx.settings.telemetry.under_trace_parent(self._trace_parent)
        self.start()

    async def _commit_attempt(self, _attempt: int) -> None:
        await self.ctx.store.commit_procedure(self.meta.id, self.step)
        self._committed()
        if self._consuming or self._skip_signals:
            await self._delete_consumed(named=self.meta.parent_id is None)

    def _committed(self) -> None:
        self.meta.keys.terminal += ((self.step, KeyType.COMMIT),)
        self.meta.keys.end_stored = True
        self.step += 1

    async def _write_commit(self, *, ends_failure: bool = False) -> bool | None:
        """Write `{step}.commit`: True once stored, False if the store surely lacks it, None if unknown.

        After the retries fail, the commit may still have landed with its answer lost, so the
        store is asked before anything else is written: two terminal keys must never coexist.
        An operator's request stops the retries of a success's commit (`ends_failure` False).
        """
        attempt: Callable[[int], Awaitable[None]]
        if ends_failure:
            attempt, wake = self._commit_attempt, self.ctx.requests.first_wakes(self.meta.id, self.meta.requested)
        else:
            attempt, wake = self.ctx.requests.unless_requested(self.meta.id, self._commit_attempt), self.meta.requested
        try:
            await self.ctx.settings.policy.call(attempt, on_retry=self._on_retry, wake=wake)
        except Fenced:
            raise
        except Exception as e:
            logger.warning("procedure %s: cannot write its commit key: %s", self.meta.id, describe(e))
            self.meta.keys.every = False  # it may land later: the deletion lists the folder
        else:
            return True
        key = self.ctx.store.key(self.meta.id, self.step, KeyType.COMMIT)
        try:
            stored = await self.ctx.settings.policy.call(lambda _n: self.ctx.store.store.get(key))
        except Exception as e:
            logger.error("procedure %s: cannot tell whether %s was written: %s", self.meta.id, key, describe(e))
            return None
        if stored is None:
            return False
        self._committed()
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
            request = self.ctx.requests.get(self.meta.id)
            why = OperatorRequested(request) if request else StoreError("the commit could not be written", key=key)
            await self._fail(why)
        else:
            self._stop_unrecorded(f"its end could not be recorded and the store cannot say whether {key} was written")

    def _stop_unrecorded(self, what: str) -> None:
        """End this run writing nothing more: the next start() decides from what is stored."""
        self.meta.keys.keep = True
        why = f"{what}; nothing more was written, and the next start() resumes it"
        self.meta.set_state(ProcedureState.unrecorded_end(why))

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
                meta = self.ctx.metas.register(
                    sub.id, child.type_name, self.meta.id, sub.procedure, state, child.lock_key, run
                )
                meta.keys.every = True
                self.ctx.settings.telemetry.submitted(child.type_name)
                Runner(self.ctx, meta, sub.procedure, 1, child.data).start()
            else:
                reason = "its id already has stored steps that this manager could not load"
                self.ctx.metas.register_poisoned(self.meta.id, sub.id, child.type_name, reason)
        if (request := self.ctx.requests.get(self.meta.id)) is not None:
            # Noted during the step that returned them, or while they were written: the
            # children it reached then were not registered (or not yet its children), so
            # they would run on, and this procedure would wait for them to end.
            self.ctx.requests.note(self.meta.id, request)

    async def _resume_stored_children(self) -> None:
        """After a restart, resume the children this procedure had stored, then wait for them.

        A procedure resumed while rolling back rolls back its unfinished children first (those
        that were still running fail, "their parent is rolling back"), so that no child's keys
        are deleted with the tree before its own rollback ran.
        """
        rolling_back = self.meta.state.kind in (ProcedureStateKind.PREPARE_ROLLBACK, ProcedureStateKind.ROLLING_BACK)
        children = self.ctx.recovered.children_of.get(self.meta.id, [])
        for child_id in list(children):
            self.meta.add_child(child_id)
            if child_id not in self.ctx.metas:
                self._claim_stored(child_id, roll_back=rolling_back)
        if children:
            await self._wait_children()

    def _claim_stored(self, child_id: ProcedureId, *, roll_back: bool = False) -> bool:
        return self.ctx.recovered.claim(self.ctx, self.meta.id, child_id, self._start_child, roll_back=roll_back)

    def _start_child(self, meta: ProcedureMeta, procedure: Procedure, step: int, data: str, wait: StepWait) -> None:
        Runner(self.ctx, meta, procedure, step, data, resume_children=True, wait=wait).start()

    async def _wait_children(self) -> None:
        """Wait until every child has ended. One whose end could not be stored (the store
        refused its failure, or the `.commit` after its rollback) ends this run the same way:
        the store says the child has not ended (the next start resumes the tree), so its
        parent must neither go on as if it had, nor roll back past it."""
        unrecorded: list[ProcedureId] = []
        waiting = [c for c in self.meta.children if (m := self.ctx.metas.get(c)) is not None and not m.state.is_ended()]
        if waiting:
            self.ctx.activity.waiting_on_children(self.meta, self.step, len(waiting))
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
        if self.meta.state.is_ended() or any(kind is KeyType.COMMIT for _, kind in self.meta.keys.terminal):
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
        self.meta.keys.keep = True
        failed = failed.with_error_text(f"{failed.error}; recorded as failed without running a rollback")
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
        failed = failed_state(
            exc, gave_up_after=self.ctx.settings.policy.max_retry_times if is_transient(exc) else None
        )
        if not self._signals_seen:
            # No step saw them: they stay in the store for the run an operator's resume or
            # rewind starts, not deleted with this failure's `.commit`.
            self._signals, self._consuming = {}, ()
        self.meta.record.cancelled = isinstance(exc, OperatorRequested) and exc.request.kind == "cancel"
        if isinstance(exc, OperatorRequested):
            self.meta.record.ended_by = exc.request.action()
        logger.warning("procedure %s (%s) failed: %s", self.meta.id, self.meta.type_name, failed.error)
        if roll_back and self.procedure.rollback_supported:
            self.meta.set_state(failed.with_kind(ProcedureStateKind.PREPARE_ROLLBACK))
            return
        if await self._write_rollback_key(failed.error or ""):
            await self._end_failure(failed)
        else:
            await self._finish(failed.not_recorded(self.step), delete=False)

    async def _prepare_rollback(self) -> None:
        state = self.meta.state
        if await self._write_rollback_key(state.error or ""):
            self.meta.set_state(state.with_kind(ProcedureStateKind.ROLLING_BACK))
        else:
            await self._finish(state.with_kind(ProcedureStateKind.FAILED).not_recorded(self.step), delete=False)

    async def _write_rollback_key(self, error: str) -> bool:
        """Write `{step}.rollback` with the failure; False if the store refused every retry."""

        try:
            data = dumped(self.procedure)
        except BaseException as e:
            if is_stop(e):
                raise
            data = self._stored_data
        step = self._message_step()
        # It names the signals its run consumed and has not deleted (those of the step that
        # failed too, if that step saw them): a deletion cut short leaves them, and the copy
        # of an operator's resume or rewind keeps them consumed (`apply_restart`).
        consumed = self._consuming + self._skip_signals
        message = ProcedureMessage(
            self.meta.type_name, data, self.meta.parent_id, step, error, self.meta.run, consumed=consumed
        )

        async def write(_attempt: int) -> None:
            await self.ctx.store.rollback_procedure(self.meta.id, message)
            self.meta.keys.terminal += ((self.step, KeyType.ROLLBACK),)
            self.step += 1

        try:
            await self.ctx.settings.policy.call(
                write, wake=self.ctx.requests.first_wakes(self.meta.id, self.meta.requested)
            )
        except Fenced:
            raise
        except Exception as e:
            logger.error("procedure %s: cannot write its rollback key: %s", self.meta.id, describe(e))
            self.meta.keys.every = False  # it may land later: the deletion lists the folder
            return False
        return True

    async def _rollback(self) -> None:
        state = self.meta.state
        failed = state.with_kind(ProcedureStateKind.FAILED)
        if not self.procedure.rollback_supported:
            await self._end_failure(failed)
            return

        def on_retry(exc: BaseException, retry: int, delay: float) -> None:
            logger.warning(
                "procedure %s: rollback retry %d in %.3fs after %s", self.meta.id, retry, delay, describe(exc)
            )
            self.meta.record.retries += 1
            self.ctx.settings.telemetry.retried(self.meta.type_name, exc)

        async def attempt(n: int) -> None:
            self._check_lease()
            with IN_ROLLBACK:
                await self.procedure.rollback(self._context(n))

        try:
            wake = self.ctx.requests.first_wakes(self.meta.id, self.meta.requested)
            with self.ctx.settings.telemetry.rollback_span(str(self.meta.id), self.meta.type_name, self.step):
                await self.ctx.settings.policy.call(
                    attempt, retry_on=is_rollback_retryable, on_retry=on_retry, wake=wake
                )
        except Fenced:
            raise
        except Exception as e:
            error = f"{state.error}; then its rollback failed: {describe(e)} (it runs again at the next start)"
            await self._finish(
                ProcedureState.with_error(ProcedureStateKind.FAILED, error, e, format_tb(e)), delete=False
            )
            return
        self.meta.record.rolled_back = True
        await self._end_failure(failed)

    async def _end_failure(self, failed: ProcedureState) -> None:
        """The failure is recorded (and rolled back, if supported): write `.commit` above the
        `.rollback`, so that no restart, whatever its crash point and whoever the parent, runs
        the rollback again. Readers tell this end from success by the `.rollback` below it."""
        if await self._write_commit(ends_failure=True):
            # Kept (if asked) for an operator to resume or rewind; its children go as usual. A
            # subprocedure resumed as a root (its parent gone) cannot be restarted: it goes too.
            self.meta.keys.keep = self.meta.keys.keep or (self.ctx.settings.keep_failed and self.meta.parent_id is None)
            await self._finish(failed)
            return
        note = "its end could not be recorded, so its rollback runs again at the next start"
        await self._finish(ProcedureState.unrecorded_end(f"{failed.error}; {note}", failed), delete=False)

    # -- ending ----------------------------------------------------------------------

    async def _finish(self, state: ProcedureState, *, delete: bool = True) -> None:
        """Set the final state; a root first deletes its tree's keys (if `delete`: without
        it, its end is not stored, and the whole tree stays as stored for the next start)."""
        if not delete:
            self.meta.keys.keep = True
        self.meta.record.steps = max(self.step - 1, 0)
        if self.meta.is_root:
            ids = self.ctx.metas.tree_ids(self.meta.id)
            metas = self.ctx.metas.tree_metas(ids)
            lease = self.ctx.lease
            wait = lease.keep_inherited_until - time.monotonic() if lease and self.meta.keys.inherited else 0.0
            if not delete:
                # The next start resumes this run from what is stored: a child it created
                # must be there for it to claim, never created again (a child whose
                # create landed with its answer lost ran nowhere yet, and one that ended
                # is not to run twice).
                self.ctx.on_tree_finished(ids, metas)
            elif wait > 0:
                # A paused former leader's late write could re-create a key deleted now: the
                # end is recorded now, the keys go after the grace (the task begins once the
                # state below is set).
                await record_now(self.ctx, self.meta, ids, state)
                later = delete_tree_later(self.ctx, self.meta, ids, metas, wait)
                self.ctx.term.spawn(later, name=f"procstore:delete-later:{self.meta.id}")
            else:
                await delete_tree(self.ctx, self.meta, ids, metas, state)
                self.ctx.on_tree_finished(ids, metas)
        self.meta.set_state(state)


# -- ending a tree -------------------------------------------------------------------


async def record_now(ctx: ManagerContext, root: ProcedureMeta, ids: list[ProcedureId], state: ProcedureState) -> None:
    """Write a finished tree's end records at once (its deletion waits out a grace): until
    they are stored, `delete_tree_later` writes them before deleting anything. An error is
    logged: the record is then written by the deletion, or by the next start."""
    try:
        await ctx.settings.policy.call(lambda _n: record_tree(ctx, ids, root, state, datetime.now(UTC)))
    except ProcedureError as e:
        logger.warning("procedure %s ended but its end record could not be written yet: %s", root.id, e)


async def delete_tree_later(
    ctx: ManagerContext,
    root: ProcedureMeta,
    ids: list[ProcedureId],
    metas: list[ProcedureMeta],
    delay: float,
) -> None:
    """`delete_tree` after `delay` seconds: a paused former leader's late write could
    re-create a key deleted now. It deletes the runs that ended (`metas`), never a later run
    of the same ids that an operator started meanwhile."""
    await asyncio.sleep(delay)
    # An operator's `procstore resume` meanwhile (a nudge the watch has not acted on yet)
    # keeps the root for it, as recovery keeps a nudged root.
    try:
        nudged = await ctx.store.resumes.get(root.id) is not None
    except ProcedureError:
        nudged = True  # cannot tell: keep it; the next start decides
    await delete_tree(ctx, root, ids, metas, root.state, keep_root=nudged)
    ctx.on_tree_finished(ids, metas)


async def delete_tree(
    ctx: ManagerContext,
    root: ProcedureMeta,
    ids: list[ProcedureId],
    metas: list[ProcedureMeta],
    state: ProcedureState,
    *,
    keep_root: bool = False,
) -> None:
    """Write a finished tree's end records, then delete the keys that may go (the root's
    too, unless `keep_root`: it is about to run again).

    `metas` are the runs that ended (from `Registry.tree_metas` at the end): what they wrote is
    deleted, and nothing above their highest step, which a later run of the id (a resume
    or rewind since) writes. Kept: unreadable procedures and those whose keys must survive
    (`WrittenKeys.keep`). A failure is logged, not raised: the next start deletes (and records)
    what is left.
    """
    ended_runs = {meta.id: meta for meta in metas}
    # Restarted meanwhile: the id's keys and request are a later run's from its copy up.
    restarted = {pid for pid, meta in ended_runs.items() if ctx.metas.get(pid) not in (None, meta)}
    # An unreadable procedure is kept, and so is every descendant of it: a procedure whose
    # parent cannot be read is not known to be finished with (its parent may still need it).
    kept = {pid for pid in ids if pid in ctx.recovered.unreadable}
    for pid in list(kept):
        kept.update(ctx.recovered.descendants(pid))
    # An id restarted meanwhile is the new run's: its folder stays (a root's earlier steps
    # too, which a rewind may copy; a child's keys of the new run, which its key names alone
    # cannot tell from the ended run's). A restart deletes the ended run's children itself
    # before the new run creates its own (`procstore._runtime.restart`).
    kept.update(restarted)
    if keep_root:
        kept.add(root.id)
    doomed = [pid for pid in ids if pid not in kept and not ((m := ended_runs.get(pid)) and m.keys.keep)]
    children = [pid for pid in doomed if pid != root.id]
    # The keys of procedures this term wrote from step 0: deleted without listing their folder.
    known = {
        pid: keys for pid in doomed if (m := ended_runs.get(pid)) and (keys := m.keys.known(ctx.store.proc_path, pid))
    }
    through = {
        pid: max(s for s, _ in m.keys.terminal) for pid in doomed if (m := ended_runs.get(pid)) and m.keys.terminal
    }
    ended = datetime.now(UTC)  # one end time for every attempt: one record, not one per retry
    unrequested = [pid for pid in doomed if pid not in restarted]

    async def delete(_attempt: int) -> None:
        # The record first: keys deleted unrecorded would be history lost for good, and a
        # late write re-creating one could run the procedure again (see `procstore.store.history`).
        await record_tree(ctx, ids, root, state, ended)
        # Children first, the root last: a crash part way leaves the root marked finished.
        await ctx.store.delete_procedures(children, known, through)
        if doomed and doomed[0] == root.id:
            await ctx.store.delete_procedure(root.id, known.get(root.id), through_step=through.get(root.id))
        # Requests go last: until the keys are gone, a restart must honour them again. A tree
        # recovered from the store may have requests this term never read (a rollback reads none).
        if root.keys.inherited:
            await ctx.store.requests.delete_present(unrequested)
        else:
            await ctx.store.requests.delete([pid for pid in unrequested if pid in ctx.requests])

    try:
        await ctx.settings.policy.call(delete)
    except ProcedureError as e:
        logger.warning(
            "procedure %s ended but deleting its keys failed (%s); the next start() deletes them",
            root.id,
            e,
            extra=procedure_fields(root.id, root.type_name, root.record.steps),
        )


async def record_tree(
    ctx: ManagerContext, ids: list[ProcedureId], root: ProcedureMeta, root_state: ProcedureState, ended: datetime
) -> None:
    """Write the end record of each run of a finished tree whose end is stored (its
    `.commit`), before its keys go; a run whose end is not stored gets none (it runs again).

    Raises the store's error: the caller then keeps the keys, and the next start records
    and deletes them.
    """
    records: list[HistoryRecord] = []
    for pid in ids:
        meta = ctx.metas.get(pid)
        if meta is not None:
            state = root_state if meta is root else meta.state
            if meta.keys.end_stored and state.is_ended():
                records.append(_record(meta, state, ended, ctx.store.history.settings.output_limit))
        elif (finished := ctx.recovered.finished.get(pid)) is not None:
            # A child that ended in an earlier term: the store kept only its last message, which
            # does not say whether it rolled back or had no rollback (`StoredStatus.FAILED`).
            parent = next((p for p, kids in ctx.recovered.children_of.items() if pid in kids), None)
            records.append(_stored_run_record(pid, finished.type_name, parent, finished.error, ended, finished.run))
    await ctx.store.history.put_many(records)


async def record_known_ends(ctx: ManagerContext, metas: Sequence[ProcedureMeta]) -> None:
    """The end records of the runs in `metas` that ended here with their end stored, written
    now from what this term knows of them (start, steps, retries, a rollback), before it
    forgets them. Raises the store's error."""
    ended, limit = datetime.now(UTC), ctx.store.history.settings.output_limit
    records = [_record(m, m.state, ended, limit) for m in metas if m.keys.end_stored and m.state.is_ended()]
    await ctx.store.history.put_many(records)


async def record_superseded(
    ctx: ManagerContext,
    procedure_id: ProcedureId,
    old: ProcedureMeta | None,
    new_run: ProcedureMessage,
    how: str,
    *,
    copied: bool = True,
) -> None:
    """The end records of the runs an operator's restart (`how`) has just superseded before
    their end was stored. `new_run`: the first message of the run that goes on: the copy
    the restart wrote (`copied`), or a stored run resumed as stored. These runs need one:

    - `old`, this term's metadata of the id, if that run ended here unrecorded: the run right
      below the copy, or an earlier one when copies whose outcome stayed unknown (their
      answers lost past the retries) started runs in between. Only this term ran it, so a
      record of it can only be one an earlier restart here has just written (create-only:
      it stands), never one that retention swept;
    - every run between a run that ended here (`old`) and `new_run`: each is such a copy in
      doubt, stuck (nothing ran it: it would be `old` if this term had), one record each,
      or history skips a run number (`HistoryStore.find_newest_run` reads them in turn);
    - with `copied` and no run of the id ended here, the run right below the copy: stuck
      (nothing here ran it).

    Written after the copy, so that a crash between the two leaves the run to the new one,
    never an unfinished run marked ended. An error is logged: the new run goes on, and those
    records are missing."""
    ended = datetime.now(UTC)
    records = []
    here = old if old is not None and old.state.is_ended() and old.run < new_run.run else None
    if here is not None and (not here.state.recorded or (copied and here.run == new_run.run - 1)):
        state = here.state
        error = f"{state.error}; {how} before this end was stored" if state.error else how
        records.append(_record(here, state.with_error_text(error), ended, ctx.store.history.settings.output_limit))
    first_stuck = here.run + 1 if here is not None else new_run.run - 1 if copied else new_run.run
    records += [
        _stored_run_record(procedure_id, new_run.type_name, new_run.parent_id, f"{how} before it ended", ended, run)
        for run in range(first_stuck, new_run.run)
    ]
    if not records:
        return
    try:
        await ctx.settings.policy.call(lambda _n: ctx.store.history.put_many(records))
    except ProcedureError as e:
        logger.warning(
            "run %s of procedure %s was superseded, but its end record could not be written: %s",
            " and ".join(str(r.run) for r in records),
            procedure_id,
            e,
        )


def _stored_run_record(
    pid: ProcedureId, type_name: str, parent_id: ProcedureId | None, error: str | None, ended: datetime, run: int
) -> HistoryRecord:
    """The end record of a run this term knows only from the store: done unless `error`."""
    return HistoryRecord(
        id=str(pid),
        type_name=type_name,
        parent_id=None if parent_id is None else str(parent_id),
        outcome="done" if error is None else "failed",
        error=error,
        ended_at=iso(ended) or "",
        run=run,
    )


def _record(meta: ProcedureMeta, state: ProcedureState, ended: datetime, output_limit: int) -> HistoryRecord:
    output, not_kept = kept_output(state.output, output_limit) if state.is_done() else (None, None)
    started = meta.record.started
    if started is None and meta.run == 1:
        started = Action(kind="submit", at=iso(meta.record.start_time))
    return HistoryRecord(
        id=str(meta.id),
        type_name=meta.type_name,
        parent_id=None if meta.parent_id is None else str(meta.parent_id),
        outcome=meta.outcome(state),
        error=state.error,
        started_at=iso(meta.record.start_time),
        ended_at=iso(meta.record.end_time or ended) or "",
        steps=meta.record.steps,
        retries=meta.record.retries,
        run=meta.run,
        output=output,
        output_not_kept=not_kept,
        started=started,
        ended_by=meta.record.ended_by,
        rolled_back=meta.record.rolled_back,
    )
