"""How operator requests reach running procedures (see `procstore.store.requests`).

A runner reads its procedure's request key before every attempt at a step. What that read
cannot reach is a procedure that is not attempting anything: one waiting for its children,
for a lock or for a retry's backoff. `watch_operator_requests` polls the `requests/`
folder for those, and passes each request down to the procedure's unfinished descendants,
so that the children end first and the parent sees the request at its next attempt.
"""

from __future__ import annotations

import asyncio
import time

from procstore._logs import get_logger, procedure_fields
from procstore._runtime.context import ManagerContext
from procstore._runtime.restart import restart, runs_here
from procstore.errors import ProcedureError, StoreError, describe
from procstore.ids import ProcedureId
from procstore.store.folder import latest_key
from procstore.store.keys import KeyType, ParsedKey
from procstore.store.requests import OperatorRequest, RequestKind
from procstore.store.state_store import walk_readable

logger = get_logger("procstore.runtime")

STALE_REQUEST_AGE = 600.0
"""Seconds after which a request for a procedure the store no longer holds is deleted."""


async def watch_operator_requests(ctx: ManagerContext, interval: float) -> None:
    """Every `interval` seconds, apply new requests to the procedures of this term.

    Survives any error: a store outage must not end the watch for the whole term. A failure
    is logged when it begins or changes, not at every look (one a second, for as long as it
    lasts), and its end is logged too.
    """
    failing: str | None = None
    while True:
        await asyncio.sleep(interval)
        try:
            await _look_once(ctx)
        except asyncio.CancelledError:
            raise
        except Exception as e:
            if describe(e) != failing:
                logger.exception("looking for operator requests failed; trying again every %.1fs", interval)
            failing = describe(e)
        else:
            if failing is not None:
                logger.warning("looking for operator requests works again (it failed with %s)", failing)
            failing = None


async def _look_once(ctx: ManagerContext) -> None:
    # One listing for requests and resume nudges alike: `requests/resume/` is inside
    # `requests/`, and each look is a request to an object store for as long as the term lasts.
    listed = await walk_readable(ctx.store.store, ctx.store.requests.prefix)
    found = await ctx.store.requests.list_all(listed)
    stale: list[ProcedureId] = []
    for pid, request in found.items():
        meta = ctx.metas.get(pid)
        if meta is None and pid in ctx.submit_wakes and pid not in ctx.operator_requests:
            ctx.note_request(pid, request)  # a submit whose write backs off: it wakes
        elif meta is not None:
            if not meta.state.is_ended() and pid not in ctx.operator_requests:
                logger.warning("procedure %s: %s", pid, request.describe(), extra=procedure_fields(pid, meta.type_name))
                ctx.note_request(pid, request)
        elif (
            not ctx.is_known(pid)
            and time.time() - request.requested_at > STALE_REQUEST_AGE
            and not await ctx.store.holds_keys(pid)
        ):
            # Its procedure ended (and its keys went) before the request was seen, or never existed.
            stale.append(pid)
    if stale:
        logger.info("deleting %d operator requests for procedures the store no longer holds", len(stale))
        await ctx.store.requests.delete(stale)
    for pid, nudge in (await ctx.store.resumes.list_all(listed)).items():
        try:
            await _load_again(ctx, pid, nudge)
        except StoreError as e:  # this procedure's folder, say: the other nudges go on
            logger.warning("procedure %s: acting on its resume nudge failed (%s); trying again", pid, e)


async def _load_again(ctx: ManagerContext, procedure_id: ProcedureId, nudge: OperatorRequest) -> None:
    """Apply a resume nudge: run the procedure from what the store now holds, unless it runs
    here already, or the nudge is stale (see `_stale`). Deleted once acted on (a refusal is
    logged); left for the next look while an API restart of the procedure is under way.

    Nudges cannot be deleted only if unchanged, so one written while this one was handled
    (another operator's `rewind`, which finds this one in place) is covered by reading the
    store again after the deletion: a newer key that nothing here runs is run.
    """
    if procedure_id in ctx.restarting:
        return
    if runs_here(ctx, procedure_id):
        await ctx.store.resumes.delete([procedure_id])  # it runs what the store holds
        return
    latest = await _latest_key(ctx, procedure_id)
    if latest is None:
        logger.info("procedure %s: nothing to resume, its keys are gone (it ended and was deleted)", procedure_id)
    elif stale := _stale(ctx, procedure_id, nudge, latest):
        logger.warning(
            "ignoring the resume nudge of procedure %s (%s): %s",
            procedure_id,
            nudge.describe(),
            stale,
            extra=procedure_fields(procedure_id),
        )
    else:
        await _run_again(ctx, procedure_id)
    await ctx.store.resumes.delete([procedure_id])
    if runs_here(ctx, procedure_id) or procedure_id in ctx.restarting:
        return
    if latest is not None and latest.key_type is KeyType.COMMIT:
        await _delete_if_kept_for_the_nudge(ctx, procedure_id)
    now = await _latest_key(ctx, procedure_id)
    if now is not None and now.key_type is not KeyType.COMMIT and str(now) != str(latest):
        logger.info("procedure %s: %s was written while its resume nudge was handled; running it", procedure_id, now)
        await _run_again(ctx, procedure_id)


async def _delete_if_kept_for_the_nudge(ctx: ManagerContext, procedure_id: ProcedureId) -> None:
    """A failed root that recovery kept only because a nudge asked to resume it (without
    `keep_failed`) goes once the nudge was refused or stale, as it would have without the
    nudge: its end record first (recovery wrote it; if it is missing, the next start decides)."""
    if ctx.keep_failed or procedure_id in ctx.metas or procedure_id not in ctx.stored.rolled_back:
        return
    if await ctx.store.holds_keys(procedure_id) and await ctx.history.has_ended(
        procedure_id, ctx.stored.committed_runs.get(procedure_id, 1)
    ):
        logger.info("procedure %s: deleting it, kept only for the resume nudge", procedure_id)
        await ctx.store.delete_procedure(procedure_id)
        ctx.forget(procedure_id)


async def _run_again(ctx: ManagerContext, procedure_id: ProcedureId) -> None:
    try:
        await restart(ctx, procedure_id, None, nudged=True)
    except ProcedureError as e:
        if isinstance(e, StoreError):
            raise  # not acted on (the store failed, or this manager no longer leads): the nudge stays
        logger.error(
            "cannot resume procedure %s as an operator asked: %s", procedure_id, e, extra=procedure_fields(procedure_id)
        )


async def _latest_key(ctx: ManagerContext, procedure_id: ProcedureId) -> ParsedKey | None:
    keys = await ctx.store.procedure_keys(procedure_id)
    return latest_key(keys) if keys else None


def _stale(ctx: ManagerContext, procedure_id: ProcedureId, nudge: OperatorRequest, latest: ParsedKey) -> str:
    """Why the nudge is for an earlier state (acting on it could undo, say, a cancel); ''
    to act on it. Told by store facts: the nudge names the latest step key its operator saw
    or wrote, and an ended procedure whose latest key is another has run since. An
    unfinished one that does not run here is always run: that is what the nudge is for."""
    if latest.key_type is not KeyType.COMMIT:
        return ""
    if nudge.step is not None:
        if latest.step != nudge.step:
            return f"it was for step {nudge.step}, and the procedure has run since (it ended at {latest})"
        return ""
    # A nudge written by an older release carries no step: compared by the clocks, as it was.
    meta = ctx.metas.get(procedure_id)
    if meta is not None and meta.end_time is not None and nudge.requested_at < meta.end_time.timestamp():
        return "it was written before the procedure ended here"
    return ""


async def request(ctx: ManagerContext, procedure_id: ProcedureId, kind: RequestKind, reason: str) -> OperatorRequest:
    """Write a request for `procedure_id` and apply it here at once.

    Raises `ProcedureError` if the procedure has ended, or is neither known here nor stored.
    Returns the request in force (an earlier one, if the procedure already had one).
    """
    meta = ctx.metas.get(procedure_id)
    if meta is not None and meta.state.is_ended():
        raise ProcedureError(f"procedure {procedure_id} has already ended ({meta.state.kind.name}): nothing to {kind}")
    if meta is None:
        # Not run here: a kept FAILED root, a finished child, or one another manager runs.
        keys = await ctx.store.procedure_keys(procedure_id)
        if not keys:
            raise ProcedureError(
                f"procedure {procedure_id} is not in the store (finished and deleted, or never submitted)"
            )
        if (latest := latest_key(keys)).key_type is KeyType.COMMIT:
            raise ProcedureError(
                f"procedure {procedure_id} has already ended (its latest key is {latest.step}.commit): "
                f"nothing to {kind}"
            )
    wanted = OperatorRequest.new(kind, reason)
    if not await ctx.store.requests.put(procedure_id, wanted):
        existing = await ctx.store.requests.get(procedure_id)
        if existing is None:  # deleted (or torn again) since: nothing of ours is stored
            raise ProcedureError(
                f"the request for {procedure_id} at {ctx.store.requests.key(procedure_id)} changed while it was "
                "written; try again"
            )
        wanted = existing
    ctx.note_request(procedure_id, wanted)
    return wanted
