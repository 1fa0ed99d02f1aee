"""Recovery at `start()`: load every procedure and resume the unfinished ones.

Order, as in GreptimeDB: rolling-back roots first (they may hold locks the others need),
then unfinished roots. Subprocedures are not resubmitted: they wait in `StoredProcedures`
(`ManagerContext.recovered`) until their parent runs again and claims them. Committed
roots, and committed children whose parent is gone, have their keys deleted, after their
end records (`record_recovered`).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from procstore._aio import gather_settled
from procstore._bulk import collector_paused
from procstore._logs import get_logger
from procstore._runtime.meta import ProcedureMeta
from procstore._runtime.runner import Runner
from procstore.errors import LoadFailed, ProcedureError
from procstore.ids import ProcedureId
from procstore.procedure import Procedure
from procstore.state import ProcedureState, ProcedureStateKind
from procstore.store.history import HistoryRecord, Recorded, RunKey, iso, record_from_keys
from procstore.store.keys import KeysByProcedure, KeyType, procedure_dir
from procstore.store.message import NO_WAIT, ProcedureMessage, StepWait
from procstore.store.procedure_store import LoadProblem, ProcedureMessages
from procstore.store.run_origin import run_origin
from procstore.store.tree import descendants, stuck_chains
from procstore.wake_time import calendar_time

if TYPE_CHECKING:
    from procstore._runtime.context import ManagerContext

logger = get_logger("procstore.recovery")

ORPHAN_HINT = (
    "Nothing will resume it and its keys were kept: delete its folder if its parent finished, "
    "or restore the parent's keys and restart"
)


StartChild = Callable[[ProcedureMeta, Procedure, int, str, StepWait], None]
"""Starts a runner for a claimed child: its metadata, procedure, next step and stored data."""


@dataclass(frozen=True, slots=True)
class FinishedRun:
    """A finished procedure's run as its keys tell it (`StoredProcedures.finished`)."""

    type_name: str
    """"" if unknown."""
    run: int
    """Its history record's run."""
    error: str | None
    """None if it is done; else it failed and rolled back: the parent sees it FAILED, and its
    rollback never runs again."""


@dataclass(slots=True)
class StoredProcedures:
    """Subprocedures found at recovery, kept until their parent claims them.

    Only roots are resubmitted at start; a parent's stored children resume when the parent
    runs again (or when it re-submits their ids). Written by recovery, and emptied by claims
    and by the end of their trees.
    """

    messages: dict[ProcedureId, tuple[ProcedureMessage, bool]] = field(default_factory=dict)
    """Unfinished children: their latest message and whether they were rolling back."""
    finished: dict[ProcedureId, FinishedRun] = field(default_factory=dict)
    """Finished children of unfinished parents, and failed roots kept for an operator."""
    children_of: dict[ProcedureId, list[ProcedureId]] = field(default_factory=dict)
    unreadable: dict[ProcedureId, LoadProblem] = field(default_factory=dict)

    def add_child(self, parent_id: ProcedureId, child_id: ProcedureId) -> None:
        self.children_of.setdefault(parent_id, []).append(child_id)

    def keep_finished(
        self, pid: ProcedureId, message: ProcedureMessage, *, rolled_back: bool, no_error: str = "rolled back"
    ) -> None:
        """A finished procedure (its message below its `.commit`) kept for its parent, or
        for an operator (a failed root): the run and outcome a claim registers (`no_error`:
        the error of a failure whose message says none)."""
        error = (message.error or no_error) if rolled_back else None
        self.finished[pid] = FinishedRun(message.type_name, message.run, error)

    def keep_for_parent(self, pid: ProcedureId, message: ProcedureMessage, loaded: ProcedureMessages) -> None:
        """A stored child (as `loaded` found it), kept for its parent to claim."""
        assert message.parent_id is not None
        if pid in loaded.finished_messages:
            self.keep_finished(pid, message, rolled_back=pid in loaded.rolled_back_ids)
        else:
            self.messages[pid] = (message, pid in loaded.rollback_messages)
        if pid not in self.children_of.get(message.parent_id, ()):
            self.add_child(message.parent_id, pid)

    def keep_unreadable(self, problem: LoadProblem) -> None:
        if problem.procedure_id is not None:
            self.unreadable[problem.procedure_id] = problem

    def descendants(self, procedure_id: ProcedureId) -> list[ProcedureId]:
        """Its descendants found in the store."""
        return descendants(procedure_id, lambda pid: self.children_of.get(pid, ()))

    def __contains__(self, procedure_id: object) -> bool:
        return procedure_id in self.messages or procedure_id in self.finished or procedure_id in self.unreadable

    def forget_ended(self, procedure_id: ProcedureId) -> None:
        """Drop what recovery found of an ended procedure: it is about to run again."""
        for table in (self.unreadable, self.finished):
            table.pop(procedure_id, None)

    def forget_finished(self, procedure_id: ProcedureId) -> None:
        """Drop what recovery found of a procedure whose tree has finished."""
        for table in (self.messages, self.finished, self.children_of):
            table.pop(procedure_id, None)

    def claim(
        self, ctx: ManagerContext, parent_id: ProcedureId, child_id: ProcedureId, start: StartChild, *, roll_back: bool
    ) -> bool:
        """A parent resumed after a restart takes over a child found in the store (finished,
        unfinished or unreadable), so that no child id is ever started twice; False if there
        is none. With `roll_back`, an unfinished child is made to fail and roll back instead
        of resuming."""
        if (finished := self.finished.pop(child_id, None)) is not None:
            final = ProcedureState.done() if finished.error is None else ProcedureState.failed(finished.error)
            meta = ctx.metas.register(child_id, finished.type_name, parent_id, None, final, run=finished.run)
            meta.keys.end_stored = True
            return True
        if child_id in self.unreadable:
            problem = self.unreadable[child_id]
            ctx.metas.register_poisoned(parent_id, child_id, problem.type_name or "", problem.reason)
            return True
        entry = self.messages.pop(child_id, None)
        if entry is None:
            return False
        message, rolling_back = entry
        key = ctx.store.key(child_id, message.step, KeyType.ROLLBACK if rolling_back else KeyType.STEP)
        try:
            procedure, lock_key = ctx.load_with_lock_key(child_id, message, key)
        except LoadFailed as e:
            logger.error("cannot resume subprocedure: %s", e.problem, extra=e.problem.log_fields())
            self.unreadable[child_id] = e.problem
            ctx.metas.register_poisoned(parent_id, child_id, message.type_name, e.problem.reason)
            return True
        if roll_back and not rolling_back:
            state = ProcedureState.with_error(
                ProcedureStateKind.PREPARE_ROLLBACK, f"its parent {parent_id} is rolling back"
            )
        else:
            state = resumed_state(message, rolling_back=rolling_back)
        meta = ctx.metas.register(child_id, message.type_name, parent_id, procedure, state, lock_key, message.run)
        start(meta, procedure, message.step + 1, message.data, resumed_wait(message, rolling_back=rolling_back))
        return True


def resumed_wait(message: ProcedureMessage, *, rolling_back: bool) -> StepWait:
    """The durable wait a stored procedure resumes with. A rolling-back one waits for
    nothing, but the signals its `.rollback` names as consumed (its failed step saw them)
    are still to be deleted: a crash came before, and a subprocedure created again under
    its id by its parent's resume or rewind would get them."""
    if rolling_back:
        return StepWait(consumed=message.consumed) if message.consumed else NO_WAIT
    return StepWait.of(message)


def resumed_state(message: ProcedureMessage, *, rolling_back: bool) -> ProcedureState:
    """The state a stored procedure resumes in: rolling back (from its `.rollback`), or running."""
    if rolling_back:
        return ProcedureState.with_error(ProcedureStateKind.ROLLING_BACK, message.error or "unknown error")
    return ProcedureState.running()


async def recover(ctx: ManagerContext) -> list[LoadProblem]:
    """Resume what the store holds; returns the procedures that could not be resumed."""
    requested = await ctx.store.requests.stored_ids()  # before the procedures: see `_forget_requests`
    loaded = await ctx.store.load_messages()
    # One listing of history/, and only for a store that holds procedures.
    anything = loaded.messages or loaded.rollback_messages or loaded.finished_ids
    recorded = await ctx.store.history.recorded() if anything else Recorded()
    finished_runs = _runs_that_ended(loaded, recorded.runs)
    if finished_runs:
        _warn_deleting(
            finished_runs,
            "of runs that ended already (keys re-created by a late write of a paused former leader "
            "after the run had finished and was deleted)",
        )
        _set_apart(loaded, finished_runs)
    problems = list(loaded.problems)
    for problem in loaded.problems:
        ctx.recovered.keep_unreadable(problem)
    alive = set(loaded.unfinished()) | loaded.unreadable_ids
    nudged = set(await ctx.store.resumes.list_all())  # `procstore resume`: kept, and resumed at the first look

    if loaded.stray_ids:
        _warn_deleting(
            loaded.stray_ids,
            "without a step 0 (keys re-created by a late write of a paused former leader after "
            "the procedure had finished)",
        )
    with collector_paused():
        stranded = _stranded(loaded, alive) | _children_of_ended_runs(loaded)
        ended = _plan_finished(ctx, loaded, alive, nudged)
        to_delete = ended + loaded.stray_ids + finished_runs
        rolling_back_roots = _plan_unfinished(
            ctx, loaded.rollback_messages, stranded, alive, rolling_back=True, problems=problems
        )
        running_roots = _plan_unfinished(ctx, loaded.messages, stranded, alive, rolling_back=False, problems=problems)

    # A failed root kept for an operator ended too: a crash between its `.commit` and its
    # record left it without one, which nothing else would write.
    kept_roots = [
        pid
        for pid, finished in ctx.recovered.finished.items()
        if finished.error is not None and (m := loaded.finished_messages.get(pid)) and not m.parent_id
    ]
    if kept_roots:
        try:
            await ctx.settings.policy.call(lambda _n: record_recovered(ctx, loaded, kept_roots, recorded, kept=True))
        except ProcedureError as e:
            logger.warning("could not record the end of failed procedures kept for an operator (%s)", e)
    if to_delete:
        logger.info("deleting %d finished procedures left by an interrupted cleanup", len(to_delete))
        try:
            await ctx.settings.policy.call(lambda _n: record_recovered(ctx, loaded, to_delete, recorded))
            # With each ended run's `.commit` step: a retry that lists a folder after its
            # keys went, and finds only a copy an operator's restart wrote meanwhile, keeps it.
            through = loaded.commit_steps
            await ctx.settings.policy.call(lambda _n: ctx.store.delete_procedures(to_delete, through=through))
        except ProcedureError as e:
            logger.warning("could not delete finished procedures (%s); the next start tries again", e)
            to_delete = []
        else:
            await _delete_signals(ctx, ended)
    # Those deleted above had all their signals deleted, but the finished children of a
    # parent's earlier run (set apart): its new run creates them again.
    deleted = set(to_delete)
    kept = [pid for pid in loaded.finished_ids if pid not in deleted]
    await delete_consumed_of_ended(ctx, loaded, [*kept, *finished_runs])
    await _forget_requests(ctx, requested, loaded, to_delete)

    with collector_paused():
        runners = _resume_roots(ctx, rolling_back_roots, rolling_back=True, problems=problems)
        runners += _resume_roots(ctx, running_roots, rolling_back=False, problems=problems)
    _start_resumed(ctx, runners)
    logger.info(
        "recovered %d rolling back and %d unfinished procedures; %d could not be loaded",
        len(rolling_back_roots),
        len(running_roots),
        len(problems),
    )
    return problems


def _runs_that_ended(loaded: ProcedureMessages, ended: set[RunKey]) -> list[ProcedureId]:
    """Unfinished-looking procedures whose run has ended already: nothing may run them.

    Deleting a finished run makes a create-only write succeed again, so a paused former
    leader's `0.step` that lands late (a submit's retry, a child it was creating) re-creates
    a procedure that ran to its end. Such a folder is that run's, by its end record (`run`
    in the message, the id's record in history); a child created late is its parent's
    run's, so a child at its step 0 whose parent is gone and whose parent's run (the
    child's run number) has an end record is a leftover too.
    """
    out: list[ProcedureId] = []
    if ended:  # with no end record (a store whose history is empty), no run has ended
        unfinished = loaded.unfinished()
        live = {*unfinished, *loaded.unreadable_ids}
        for pid, message in unfinished.items():
            parent = message.parent_id
            if (str(pid), message.run) in ended or (
                message.step == 0 and parent is not None and parent not in live and (str(parent), message.run) in ended
            ):
                out.append(pid)
    # A finished child of an earlier run of its parent is that ended tree's: the parent's
    # new run must not take its outcome for its own.
    finished_children = [
        (pid, finished)
        for pid in loaded.finished_ids
        if (finished := loaded.finished_messages.get(pid)) is not None and finished.parent_id is not None
    ]
    if finished_children:
        runs = _current_runs(loaded)
        out += [pid for pid, finished in finished_children if runs.get(finished.parent_id, 0) > finished.run]
    return out


def _current_runs(loaded: ProcedureMessages) -> dict[ProcedureId | None, int]:
    """Each unfinished procedure's current run: a child of an earlier run of its parent
    belongs to a tree that ended."""
    return {pid: m.run for pid, m in loaded.unfinished().items()}


def _children_of_ended_runs(loaded: ProcedureMessages) -> dict[ProcedureId, str]:
    """Unfinished children whose parent runs a later run than theirs: nothing will claim them
    (kept and reported, as any subprocedure nothing will resume)."""
    children = [(pid, m) for pid, m in loaded.messages.items() if m.parent_id is not None]
    if not children:
        return {}
    runs = _current_runs(loaded)
    return {
        pid: f"a subprocedure of run {m.run} of {m.parent_id}, which runs run {runs[m.parent_id]} now"
        for pid, m in children
        if runs.get(m.parent_id, 0) > m.run
    }


def _set_apart(loaded: ProcedureMessages, pids: list[ProcedureId]) -> None:
    """Take `pids` out of what is to be resumed or claimed (they are deleted instead; a
    finished one keeps its message, for its end record)."""
    doomed = set(pids)
    for pid in pids:
        loaded.messages.pop(pid, None)
        loaded.rollback_messages.pop(pid, None)
    loaded.finished_ids = [pid for pid in loaded.finished_ids if pid not in doomed]


async def _forget_requests(
    ctx: ManagerContext, requested: set[ProcedureId], loaded: ProcedureMessages, deleted: list[ProcedureId]
) -> None:
    """Delete operator requests after their procedure's keys, as `delete_tree` does: those of
    the trees deleted here, and those whose procedure had no keys left (a crash between the
    two deletions). `requested` was listed before the procedures, and a request is written
    only for a stored procedure, so none of these can be for a procedure stored since."""
    done = set(deleted)
    held = {*loaded.messages, *loaded.rollback_messages, *loaded.finished_ids, *loaded.unreadable_ids}
    try:
        gone = [pid for pid in requested if pid in done]
        for pid in requested - done - held:  # no keys when listed: make sure none came since
            if not await ctx.store.holds_keys(pid):
                gone.append(pid)
        await ctx.store.requests.delete(gone)
    except ProcedureError as e:
        logger.warning("could not delete operator requests of ended procedures (%s); the next start tries again", e)


async def _delete_signals(ctx: ManagerContext, procedure_ids: list[ProcedureId]) -> None:
    """Delete the signals of procedures that ended: a crash between a `.commit` and the
    deletion of the signals its step consumed left those behind, and no signal of an ended
    procedure can be delivered any more. One that fails is left to the request poll's sweep."""
    try:
        await ctx.settings.policy.call(
            lambda _n: gather_settled(*(ctx.store.signals.delete_all(pid) for pid in procedure_ids))
        )
    except ProcedureError as e:
        logger.warning("could not delete the signals of finished procedures (%s); the request poll will", e)


async def delete_consumed_of_ended(ctx: ManagerContext, loaded: ProcedureMessages, ids: Iterable[ProcedureId]) -> None:
    """Delete the signals that the ended procedures `ids` consumed, as their last message
    names them (a failure's `.rollback`): a crash or a failed deletion between the `.commit`
    and theirs left them, and a child its parent's resume or rewind creates again under the
    same id would get them. Those kept here (a child for its parent, a failed root for an
    operator) and the finished children of a parent's earlier run, deleted before its new
    run creates them again. One that fails is logged; the request poll's sweep deletes it
    once the procedure has gone."""
    signals = ctx.store.signals
    consumed = [
        key
        for pid in ids
        if (m := loaded.finished_messages.get(pid)) is not None and m.consumed
        for key in signals.own(pid, frozenset(m.consumed))
    ]
    if not consumed:
        return
    try:
        await ctx.settings.policy.call(lambda _n: signals.delete(consumed))
    except ProcedureError as e:
        logger.warning("could not delete the signals consumed by ended procedures (%s); the request poll will", e)


def _plan_finished(
    ctx: ManagerContext, loaded: ProcedureMessages, alive: set[ProcedureId], nudged: set[ProcedureId]
) -> list[ProcedureId]:
    """Committed children of live parents are kept (the parent will look at them); the rest go."""
    to_delete: list[ProcedureId] = []
    for pid in loaded.finished_ids:
        message = loaded.finished_messages.get(pid)
        if message is not None and message.parent_id in alive:
            ctx.recovered.keep_for_parent(pid, message, loaded)
        elif (
            message is not None
            and message.parent_id is None
            and (ctx.settings.keep_failed or pid in nudged)
            and pid in loaded.rolled_back_ids
        ):
            # A failed root kept for an operator (`keep_failed`): known, so never adopted or swept.
            ctx.recovered.keep_finished(pid, message, rolled_back=True, no_error="failed")
        else:
            to_delete.append(pid)
    return to_delete


def _stranded(loaded: ProcedureMessages, alive: set[ProcedureId]) -> dict[ProcedureId, str]:
    """Unfinished procedures that no resumed root would ever claim, with the reason.

    A subprocedure runs only when its parent claims it, so one whose chain of parents never
    reaches a root would wait forever, unreported: its parent links form a cycle (a corrupt
    or hand-edited store), or an ancestor is an orphan (its own parent has no unfinished
    state). A rolling-back child whose parent is gone is not stranded: it is resumed as a
    root, since finishing a rollback needs no parent.
    """
    unfinished = loaded.unfinished()
    if not _names_a_parent(unfinished):
        return {}  # roots alone: every chain ends where it begins
    parent_of = {pid: m.parent_id for pid, m in unfinished.items()}

    def orphaned(pid: ProcedureId, parent: ProcedureId) -> bool:
        return parent not in alive and pid not in loaded.rollback_messages

    stranded: dict[ProcedureId, str] = {}
    reasons: dict[ProcedureId, str] = {}  # by culprit: a cycle's is logged once
    for pid, stuck in stuck_chains(parent_of, orphaned).items():
        reason = reasons.get(stuck.culprit)
        if reason is None:
            if stuck.cycle:
                reason = _cycle_reason(list(stuck.cycle))
            else:
                reason = f"orphaned subprocedure: its parent {parent_of[stuck.culprit]} has no unfinished state"
            reasons[stuck.culprit] = reason
        stranded[pid] = reason if pid in stuck.blamed else f"its ancestor {stuck.culprit} cannot run: {reason}"
    return stranded


def _cycle_reason(cycle: list[ProcedureId]) -> str:
    """The load problem of each member of a parent cycle, which names the cycle by its first
    id; the whole cycle is logged here, once. Each member's problem naming every member
    would be N ids N times: a log (and `recovery_problems`) quadratic in one hostile write."""
    logger.error(
        "parent links form a cycle of %d procedures, none of which can run: %s",
        len(cycle),
        " -> ".join(map(str, [*cycle, cycle[0]])),
    )
    return f"its parent links form a cycle of {len(cycle)} procedures through {cycle[0]} (logged once, whole)"


def _names_a_parent(messages: dict[ProcedureId, ProcedureMessage]) -> bool:
    """Whether any of `messages` is a subprocedure's."""
    return any(m.parent_id is not None for m in messages.values())


def _plan_unfinished(
    ctx: ManagerContext,
    messages: dict[ProcedureId, ProcedureMessage],
    stranded: dict[ProcedureId, str],
    alive: set[ProcedureId],
    *,
    rolling_back: bool,
    problems: list[LoadProblem],
) -> list[tuple[ProcedureId, ProcedureMessage]]:
    """Split into roots to resume now and children to keep for their parents; report the
    stranded ones (their keys are kept)."""
    if not stranded and not _names_a_parent(messages):
        return list(messages.items())  # roots alone, none stranded
    roots: list[tuple[ProcedureId, ProcedureMessage]] = []
    for pid, message in messages.items():
        parent = message.parent_id
        if pid in stranded:
            key = ctx.store.key(pid, message.step, KeyType.ROLLBACK if rolling_back else KeyType.STEP)
            _skip(ctx, LoadProblem(key, pid, stranded[pid], ORPHAN_HINT, message.type_name), problems)
        elif parent is not None and parent in alive:
            ctx.recovered.messages[pid] = (message, rolling_back)
            ctx.recovered.add_child(parent, pid)
        else:
            # A root, or a rolling-back child whose tree was deleted around it (a rollback
            # that failed is kept on purpose): finishing its rollback needs no parent.
            roots.append((pid, message))
    return roots


def _skip(ctx: ManagerContext, problem: LoadProblem, problems: list[LoadProblem]) -> None:
    """Report a stored procedure that will not run, and keep it as unreadable (a parent
    that claims it fails instead of creating it anew)."""
    logger.error("skipping %s", problem, extra=problem.log_fields())
    problems.append(problem)
    ctx.recovered.keep_unreadable(problem)


def resume_root(
    ctx: ManagerContext, pid: ProcedureId, message: ProcedureMessage, *, rolling_back: bool
) -> list[LoadProblem]:
    """Run a stored root that an operator resumed or rewound in this term, as recovery does
    (but it waits for its concurrency slot: it held none); returns why it could not be loaded."""
    problems: list[LoadProblem] = []
    for runner in _resume_roots(ctx, [(pid, message)], rolling_back=rolling_back, problems=problems, restarted=True):
        runner.start()
    return problems


RESUMED_PER_TURN = 64
"""Runners started per turn of the event loop after a recovery."""


def _start_resumed(ctx: ManagerContext, runners: list[Runner]) -> None:
    """Start the resumed roots' runners: at once those that must queue for a lock, the
    others a batch per turn of the event loop.

    A resumed root with lock keys takes them now if they are free (those that held them
    when their process died took theirs first, in `_resume_roots`), so that nothing submitted
    after `start()` overtakes it; one that must wait starts at once and queues, in
    recovery's order, as every resumed root used to. The others are known (listed,
    watchable, their locks held) before their runners start, so nothing depends on when
    they do; and each first turn reads the store and runs user code: 10,000 of them at
    once would hold the event loop for seconds, and with it a lease's renewals and
    `start()`'s return.
    """
    gradually: list[Runner] = []
    for runner in runners:
        runner.take_slot_if_started()
    for runner in runners:
        keys = runner.meta.lock_key.keys_to_lock()
        if runner.holds_locks or not keys:
            gradually.append(runner)
        elif ctx.locks.take_all_now(runner.meta.id, keys):
            runner.holds_locks = True
            gradually.append(runner)
        else:
            runner.start()
    ctx.term.spawn(_start_gradually(gradually), name="procstore:resuming")


async def _start_gradually(runners: list[Runner]) -> None:
    """Start `runners` in order, a batch per turn of the event loop. A stop cancels this task
    with the term's runners: those not started yet never run, their procedures are left as
    stored."""
    for first in range(0, len(runners), RESUMED_PER_TURN):
        for runner in runners[first : first + RESUMED_PER_TURN]:
            runner.start()
        await asyncio.sleep(0)


def _resume_roots(
    ctx: ManagerContext,
    roots: Iterable[tuple[ProcedureId, ProcedureMessage]],
    *,
    rolling_back: bool,
    problems: list[LoadProblem],
    restarted: bool = False,
) -> list[Runner]:
    """The runners that resume stored roots, not started; none for a root that cannot be
    loaded (its problem is added to `problems`). One call for a recovery's thousands."""
    key_type = KeyType.ROLLBACK if rolling_back else KeyType.STEP
    load, register, take_all_now = ctx.load_with_lock_key, ctx.metas.register, ctx.locks.take_all_now
    running = ProcedureState.running()  # `resumed_state` of every root that resumes running
    runners: list[Runner] = []
    for pid, message in roots:
        try:
            procedure, lock_key = load(pid, message, key_type)
        except LoadFailed as e:
            _skip(ctx, e.problem, problems)
            continue
        state = resumed_state(message, rolling_back=True) if rolling_back else running
        meta = register(pid, message.type_name, message.parent_id, procedure, state, lock_key, message.run)
        meta.is_root = True
        meta.keys.inherited = True
        meta.record.started = run_origin(message) if message.extra else None  # the origin is an unknown field
        # A root past its step 0 (or rolling back) held its locks when its process died, and
        # its last step may be half done: it takes them again now, before any runner starts, so
        # that a procedure queued behind it cannot overtake it and run over that half-done step.
        keys = lock_key.keys_to_lock()
        holds = (message.step > 0 or rolling_back) and (not keys or take_all_now(pid, keys))
        wait = resumed_wait(message, rolling_back=rolling_back)
        runners.append(
            Runner(
                ctx, meta, procedure, message.step + 1, message.data,
                resume_children=True, holds_locks=holds, wait=wait, restarted=restarted,
            )
        )  # fmt: skip
    return runners


async def adopt_unknown(ctx: ManagerContext, seen_before: set[ProcedureId], busy: set[ProcedureId]) -> set[ProcedureId]:
    """Resume unfinished roots the store holds but this manager does not know.

    A leader's recovery cannot see a write that lands after its listing: a submit whose
    answer came back after its manager lost the lease, or a former leader's late write.
    Such a procedure would wait for the next takeover; a leader therefore looks again from
    time to time. A root is adopted only when two looks in a row found it unknown (and not
    being submitted, `busy`), so a procedure this manager is writing right now is never
    taken for a stranger. Folders that nothing will run (no step 0, or committed) and that
    two looks found unknown are deleted, as recovery would: a former leader paused beyond
    `late_write_grace` can re-create a key of a procedure that has finished since.
    Returns the unknown procedures seen this time, for the next look.
    """
    # Listing is cheap; reading every value is not: read only when someone is unknown.
    # Folders that cannot be listed are the next load's problems; the others are looked at.
    listed = KeysByProcedure.group(ctx.store.proc_path, (await ctx.store.list_keys())[0])
    if all(ctx.is_known(pid) or pid in busy for pid in listed.steps):
        return set()
    loaded = await ctx.store.load_messages()
    recorded = await ctx.store.history.recorded()
    finished_runs = _runs_that_ended(loaded, recorded.runs)
    _set_apart(loaded, finished_runs)
    for problem in loaded.problems:
        # Known from now on, as recovery's are: a parent adopted below that claims it fails
        # instead of writing it anew from step 0 (which would run it twice).
        if problem.procedure_id is not None and not ctx.is_known(problem.procedure_id):
            ctx.recovered.unreadable[problem.procedure_id] = problem  # logged by the load
    leftovers = [
        pid
        for pid in [*_leftovers(loaded, keep_failed=ctx.settings.keep_failed), *finished_runs]
        if not ctx.is_known(pid) and pid not in busy
    ]
    unknown_now = set(leftovers)
    # Not during the grace: an inherited procedure's keys wait it out even if forgotten.
    doomed = [pid for pid in leftovers if pid in seen_before and not ctx.keeps_inherited_keys()]
    if doomed:
        _warn_deleting(
            doomed,
            "left over (no step 0, an ended run's, or committed: keys re-created by a late write of "
            "a paused former leader, or a cut-short cleanup)",
        )
        await record_recovered(ctx, loaded, doomed, recorded)  # a committed run's end first
        await ctx.store.delete_procedures(doomed)
        await ctx.store.requests.delete_present(doomed)
    for messages, rolling_back in ((loaded.rollback_messages, True), (loaded.messages, False)):
        for pid, message in messages.items():
            if message.parent_id is not None or ctx.is_known(pid) or pid in busy:
                continue
            unknown_now.add(pid)
            if pid in seen_before:
                about = {"procedure_id": str(pid), "type_name": message.type_name, "step": message.step}
                logger.warning("adopting procedure %s, stored after this manager's recovery", pid, extra=about)
                _adopt_children(ctx, pid, loaded, message.run)
                for runner in _resume_roots(ctx, [(pid, message)], rolling_back=rolling_back, problems=[]):
                    runner.start()
    return unknown_now - seen_before


def _leftovers(loaded: ProcedureMessages, *, keep_failed: bool) -> list[ProcedureId]:
    """Folders nothing will run: strays, and committed roots (or committed keys alone),
    except failed roots kept for an operator."""
    committed = [
        pid
        for pid in loaded.finished_ids
        if ((message := loaded.finished_messages.get(pid)) is None or message.parent_id is None)
        and not (keep_failed and pid in loaded.rolled_back_ids)
    ]
    return loaded.stray_ids + committed


def _adopt_children(ctx: ManagerContext, root: ProcedureId, loaded: ProcedureMessages, run: int) -> None:
    """Keep an adopted root's stored descendants of its run (`run`) for it to claim, as
    recovery does: the unfinished ones to resume, the finished ones as ended (named again,
    a finished child's stored steps would read as the root's own earlier writes, and it would
    run again)."""
    for pid, message in stored_tree(loaded, root).items():
        if message.run == run and not ctx.is_known(pid):
            ctx.recovered.keep_for_parent(pid, message, loaded)


def stored_tree(loaded: ProcedureMessages, root: ProcedureId) -> dict[ProcedureId, ProcedureMessage]:
    """The descendants of `root` that `loaded` holds, each with the message that names its
    parent and run: its latest, or for a finished one the message its `.commit` ends."""
    stored = {pid: m for pid, m in loaded.finished_messages.items() if m is not None}
    stored.update(loaded.unfinished())
    children: dict[ProcedureId, list[ProcedureId]] = {}
    for pid, message in stored.items():
        if message.parent_id is not None:
            children.setdefault(message.parent_id, []).append(pid)
    return {pid: stored[pid] for pid in descendants(root, lambda pid: children.get(pid, ()))}


def _warn_deleting(ids: list[ProcedureId], why: str) -> None:
    """One warning for folders recovery or a leader's look deletes, naming the first ten."""
    logger.warning("deleting %d procedure folders %s: %s", len(ids), why, ", ".join(map(str, ids[:10])))


async def record_recovered(
    ctx: ManagerContext, loaded: ProcedureMessages, ids: list[ProcedureId], recorded: Recorded, *, kept: bool = False
) -> None:
    """End records for the finished runs among `ids` whose end history does not hold
    (`recorded`: a record of another run of the same id says nothing of this one): those
    recovery is about to delete, ending now, or with `kept`, failed roots kept for an
    operator, whose record a crash between their `.commit` and their record left unwritten.

    What the store keeps of them is their last message: no start time, no retry count. A
    kept root's record says when its `.commit` was written (where the store knows), so one
    that retention swept since stays swept instead of coming back, as ending now, at every
    start."""
    now = time.time()
    unrecorded = {
        pid: message
        for pid in ids
        if (message := loaded.finished_messages.get(pid)) is not None and not recorded.has(pid, message.run)
    }
    failed = {pid: m.error for pid, m in unrecorded.items() if kept or pid in loaded.rolled_back_ids}
    requested = await ctx.store.requests.that_ended(failed)
    records: list[HistoryRecord] = []
    for pid, message in unrecorded.items():
        ended = now
        if kept:
            modified = await ctx.store.store.walk_modified(procedure_dir(ctx.store.proc_path, pid))
            ended = max((t for t in modified.values() if t is not None), default=now)
            if now - ended > ctx.store.history.settings.retention:
                continue
        at = iso(calendar_time(ended)) or ""  # a key's modified time is the store's to say
        records.append(
            record_from_keys(
                pid,
                message,
                rolled_back=pid in failed,
                ended_at=at,
                started=run_origin(message),
                ended_by=requested.get(pid),
            )
        )
    await ctx.store.history.put_many(records)
