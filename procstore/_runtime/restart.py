"""`ProcedureManager.resume` and `rewind`: run an ended or stuck procedure again.

The store's side is `procstore.store.restart`. Here: the checks only a running manager
can make (is it running here? did its rollback already run?), then the order of writes:

0. everything that could refuse the restart is checked first (the state to run from is
   read and loaded), so a refused restart changes nothing;
1. when a copy is to be written, the procedure's operator request (cancel, fail) is
   deleted, or it would fail again at once; a crash after this leaves it ended as it was
   (a request for a latest state resumed as stored came after that state, and stands);
2. the copy of the state to run from is written (`apply_restart`), retried as a step's
   write (a retry that finds our bytes counts them as written); a crash after it leaves an
   unfinished procedure that the next start runs; the runs it supersedes get their end
   records (`record_superseded`);
3. it runs here, as a root resumed at start would, with fresh retries.

Another restart may write its copy between 0 and 2 (a `procstore rewind` while this
manager acts on a nudge, say): 2 then writes nothing (`RestartedMeanwhile`). A restart
for a nudge plans again and runs what the store now holds, the other's copy; one asked for
through the API raises the `ProcedureError`, and the other restart's nudge runs its copy.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from procstore._logs import get_logger, procedure_fields
from procstore._runtime.meta import ProcedureMeta
from procstore._runtime.recovery import resume_root
from procstore._runtime.restart_tree import take_stored_tree
from procstore._runtime.runner import record_superseded
from procstore.errors import LoadFailed, ProcedureError, describe
from procstore.ids import ProcedureId
from procstore.store.history import Action
from procstore.store.message import ProcedureMessage
from procstore.store.requests import OperatorRequest
from procstore.store.restart import RestartedMeanwhile, RestartPlan, apply_restart, check_restart, plan_restart
from procstore.store.run_origin import run_origin

if TYPE_CHECKING:
    from procstore._runtime.context import ManagerContext

logger = get_logger("procstore.runtime")


def runs_here(ctx: ManagerContext, procedure_id: ProcedureId) -> bool:
    """The procedure is running, being submitted (its first write backs off), or waiting for
    its parent, in this term."""
    meta = ctx.metas.get(procedure_id)
    return (
        (meta is not None and not meta.state.is_ended())
        or procedure_id in ctx.recovered.messages
        or ctx.requests.is_submitting(procedure_id)
    )


async def restart(
    ctx: ManagerContext,
    procedure_id: ProcedureId,
    to_step: int | None,
    *,
    nudged: bool = False,
    started: Action | None = None,
) -> ProcedureMeta:
    """Resume (`to_step` None) or rewind `procedure_id` in this term; returns its new metadata.

    `started`: who asked, when and why, kept in the new run's history record.

    Raises `ProcedureError` saying why not: it is running or waiting here, it is a
    subprocedure, it finished successfully, its keys are gone, (resume only) its rollback
    already ran, or another restart wrote its copy first (`RestartedMeanwhile`; `nudged`:
    planned again instead, to run the other's copy).
    """
    meta = ctx.metas.get(procedure_id)
    if runs_here(ctx, procedure_id):
        state = (
            meta.state.kind.name
            if meta is not None
            else "being submitted"
            if ctx.requests.is_submitting(procedure_id)
            else "waiting for its parent"
        )
        raise ProcedureError(
            f"procedure {procedure_id} is running here ({state}): cancel it and wait until it has ended first"
        )
    if meta is not None and meta.state.is_done():
        raise ProcedureError(f"procedure {procedure_id} finished successfully: nothing to restart")
    if meta is not None and not meta.keys.keep and procedure_id not in ctx.recovered.unreadable and not nudged:
        raise ProcedureError(
            f"procedure {procedure_id} ended {meta.state.kind.name} and its keys are deleted (or being deleted): "
            "nothing to restart (managers keep a failed procedure's keys with keep_failed=True)"
        )
    if meta is not None and (child := _unrecorded_descendant(ctx, meta)) is not None:
        # Only the next start knows the subprocedure again (from the store): a new run here
        # would go on past it, or create it anew over its keys.
        raise ProcedureError(
            f"procedure {procedure_id}: its subprocedure {child} ended without its end being stored, so the "
            "store says it has not ended: restart the manager (its next start runs the tree on from the store)"
        )
    if procedure_id in ctx.metas.restarting:
        raise ProcedureError(f"procedure {procedure_id} is being restarted already")
    with ctx.metas.restarting_now(procedure_id):
        tree_stored = meta is None or _children_still_stored(ctx, meta)
        for _ in range(3):
            try:
                meta = await _restart(
                    ctx, procedure_id, to_step, nudged=nudged, started=started, tree_stored=tree_stored
                )
                meta.record.started = started or meta.record.started  # else what the copy says (a rewind's)
                return meta
            except RestartedMeanwhile as e:
                if not nudged:
                    raise
                logger.info(
                    "procedure %s was restarted by another operator first (%s): running from their state",
                    procedure_id,
                    e.key,
                )
        raise ProcedureError(f"procedure {procedure_id} kept being restarted by others while this manager tried")


async def _write_copy(
    ctx: ManagerContext,
    plan: RestartPlan,
    stored: ProcedureMessage,
    started: Action | None,
    stop_request: OperatorRequest | None,
) -> ProcedureMessage:
    """`apply_restart`, retrying store errors as a step's write: a write whose answer was
    lost may have landed, and then the copy is stored and the superseded run must get its
    end record. A retry's create finds our own bytes and counts them as written (the same
    `started`, so the same bytes); another restart's bytes stay `RestartedMeanwhile`, and a
    lost lease `LeaseExpired`, never retried."""

    def on_retry(exc: BaseException, retry: int, delay: float) -> None:
        logger.info(
            "procedure %s: restart's copy retry %d in %.3fs after %s", plan.procedure_id, retry, delay, describe(exc)
        )

    return await ctx.settings.policy.call(
        lambda _attempt: apply_restart(
            ctx.store,
            plan,
            stored,
            retention=ctx.store.history.settings.retention,
            started=started,
            stop_request=stop_request,
        ),
        on_retry=on_retry,
    )


def _origin_kind(message: ProcedureMessage) -> str | None:
    """How the message's run started (`resume`, `rewind`), if its messages say."""
    origin = run_origin(message)
    return None if origin is None else origin.kind


def _children_still_stored(ctx: ManagerContext, root: ProcedureMeta) -> bool:
    """Whether the ended run's tree may still hold its children's keys: its deletion waits
    out the grace after a takeover, or it has none, since the root's end is not stored (the
    next start would have resumed it with them). A root this term does not know (its
    metadata expired, or another process ran it) may hold them too."""
    return (root.keys.inherited and ctx.keeps_inherited_keys()) or (
        not root.keys.end_stored and bool(ctx.metas.descendants(root.id))
    )


def _unrecorded_descendant(ctx: ManagerContext, root: ProcedureMeta) -> ProcedureId | None:
    for pid in ctx.metas.descendants(root.id):
        if (meta := ctx.metas.get(pid)) is not None and meta.state.is_ended() and not meta.state.recorded:
            return pid
    return None


async def _restart(
    ctx: ManagerContext,
    procedure_id: ProcedureId,
    to_step: int | None,
    *,
    nudged: bool,
    started: Action | None,
    tree_stored: bool,
) -> ProcedureMeta:
    plan = await plan_restart(ctx.store, procedure_id, to_step)
    stored = await check_restart(ctx.store, plan)
    if plan.source is None and await ctx.store.history.has_ended(procedure_id, stored.run):
        # Resumed as stored, the same run would go on; but it ended (its record is written
        # before its keys are deleted), so these keys are a former leader's late write
        # (a retried create, say) that re-created its folder, as recovery reads them too.
        raise ProcedureError(
            f"procedure {procedure_id}: its run {stored.run} ended (history holds its end record); {plan.latest} "
            "is a late write that re-created its keys, not a run to resume: rewind it to run it again"
        )
    try:
        procedure, _ = ctx.load_with_lock_key(procedure_id, stored, str(plan.source or plan.latest))
    except LoadFailed as e:
        raise ProcedureError(f"procedure {procedure_id} cannot run: {e.problem}") from e
    if to_step is None and plan.ended and procedure.rollback_supported:
        raise ProcedureError(
            f"procedure {procedure_id} was rolled back: resuming would run its later steps over undone work; "
            "rewind it instead (to step 0 to run it again from the start)"
        )
    # Certain now: the procedure's request goes (it would fail the new run at once), the
    # one this manager saw and the stored one, before any copy. But a nudge to run a latest
    # state as stored (a copy an operator's rewind wrote, having deleted the request it
    # found) writes nothing: a request stored now came after that copy, and stands (the
    # runner reads it from the store before its first attempt).
    ctx.requests.forget(procedure_id)
    stop_request = None
    if plan.source is not None or not nudged:
        # Read first: the ended run's record, if written with the copy, names it.
        stop_request = await ctx.store.requests.get(procedure_id) if plan.ended else None
        await ctx.store.requests.delete([procedure_id])
    message = await _write_copy(ctx, plan, stored, started, stop_request)
    how = "resumed" if to_step is None else f"rewound to step {to_step}"
    if not plan.ended:
        # The copy starts a new run over one whose end is not stored (it ended here
        # unrecorded, or was stuck). Resumed as stored, without a copy, the stored run goes
        # on: a later run than the one that ended here unrecorded, if an earlier restart's
        # copy landed though it raised (its answers lost), which supersedes that one.
        await record_superseded(
            ctx, procedure_id, ctx.metas.get(procedure_id), message, how, copied=plan.source is not None
        )
    if tree_stored:
        # After the copy: a crash before it leaves the ended run and its children as they were.
        await take_stored_tree(ctx, procedure_id, message.run)
    if runs_here(ctx, procedure_id):  # defence: nothing may have started it meanwhile
        raise ProcedureError(f"procedure {procedure_id} was started meanwhile: it runs here already")
    # A copy a nudge finds written is a `procstore rewind`'s (`procstore resume` writes none),
    # unless its run's origin says a resume: a manager's copy for a `procstore resume` nudge,
    # stored though its answers were lost, which the nudge (still there) runs now.
    rewind = to_step is not None or (nudged and plan.copy_pending and _origin_kind(message) != "resume")
    if rewind and (old := ctx.metas.get(procedure_id)) is not None:
        # A rewind's new run sees none of the ended run's subprocedures (`procedure_state`
        # is None, as on a manager that never knew them) and creates those it names anew.
        # A resume goes on from the last step: the children it ran stay known.
        for child in ctx.metas.descendants(old.id):
            if (meta := ctx.metas.get(child)) is not None and meta.state.is_ended():
                ctx.forget(child)
    ctx.forget(procedure_id)
    problems = resume_root(ctx, procedure_id, message, rolling_back=plan.rolling_back)
    if problems:
        raise ProcedureError(f"procedure {procedure_id} cannot run: {problems[0]}")
    about = procedure_fields(procedure_id, message.type_name, message.step)
    logger.warning(
        "procedure %s %s by an operator (running from step %d)", procedure_id, how, message.step, extra=about
    )
    return ctx.metas[procedure_id]
