"""The writes of a term outside a procedure's steps: a submit's first key, a finished tree's deletion."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime

from procstore._aio import gather_settled
from procstore._logs import get_logger, procedure_fields
from procstore._runtime.context import ManagerContext
from procstore._runtime.history import record_tree
from procstore._runtime.meta import ProcedureMeta
from procstore._runtime.request_wakes import first_request_wakes
from procstore.errors import DuplicateProcedure, LeaseExpired, ProcedureError, StoreError, describe
from procstore.ids import ProcedureId
from procstore.state import ProcedureState
from procstore.store.keys import KeyType

logger = get_logger("procstore.runtime")


async def store_submitted(ctx: ManagerContext, pid: ProcedureId, type_name: str, data: str) -> bool:
    """Create a submitted procedure's first key, retrying transient errors as a step's write.

    Repeating the create is safe: it is create-only and recognises our own bytes. Returns
    False if the key holds something else (a duplicate id). Raises `DuplicateProcedure` if
    the id ran and ended already (its first run has an end record): an id is used once, for
    as long as history keeps its records). That look is sent with the create; a key this
    submit created for such an id is deleted again, a key that held these bytes already (a
    kept procedure's) never.
    """
    retried = False
    first = ctx.store.key(pid, 0, KeyType.STEP)

    async def create(attempt: int) -> bool:
        created, ended = await gather_settled(
            ctx.store.create_submitted(pid, type_name, data), ctx.history.has_ended(pid, 1)
        )
        if ended:
            if created:  # by this attempt: nobody else's key (a kept procedure's, say) goes
                await ctx.store.store.batch_delete([first])
            raise DuplicateProcedure(
                pid, f" and has ended: its end record {ctx.history.run_key(pid, 1)} is stored (an id runs once)"
            )
        return created is not False

    def on_retry(exc: BaseException, retry: int, delay: float) -> None:
        nonlocal retried
        retried = True
        about = procedure_fields(pid, type_name, 0)  # key 0: the submitted state
        logger.info("procedure %s: submit retry %d in %.3fs after %s", pid, retry, delay, describe(exc), extra=about)

    # A request for this id (a cancel written once an attempt landed) ends a backoff: the
    # procedure then runs at once, and fails before its first step as the request asks.
    ctx.submit_wakes[pid] = woken = asyncio.Event()
    try:
        return await ctx.policy.call(create, on_retry=on_retry, wake=first_request_wakes(ctx, pid, lambda: woken))
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
        del ctx.submit_wakes[pid]


async def record_now(ctx: ManagerContext, root: ProcedureMeta, ids: list[ProcedureId], state: ProcedureState) -> None:
    """Write a finished tree's end records at once (its deletion waits out a grace): until
    they are stored, `delete_tree_later` writes them before deleting anything. An error is
    logged: the record is then written by the deletion, or by the next start."""
    try:
        await ctx.policy.call(lambda _n: record_tree(ctx, ids, root, state, datetime.now(UTC)))
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

    `metas` are the runs that ended (from `ctx.tree_metas` at the end): what they wrote is
    deleted, and nothing above their highest step, which a later run of the id (a resume
    or rewind since) writes. Kept: unreadable procedures and those whose keys must survive
    (`keep_keys`). A failure is logged, not raised: the next start deletes (and records)
    what is left.
    """
    ended_runs = {meta.id: meta for meta in metas}
    # Restarted meanwhile: the id's keys and request are a later run's from its copy up.
    restarted = {pid for pid, meta in ended_runs.items() if ctx.metas.get(pid) not in (None, meta)}
    # An unreadable procedure is kept, and so is every descendant of it: a procedure whose
    # parent cannot be read is not known to be finished with (its parent may still need it).
    kept = {pid for pid in ids if pid in ctx.stored.unreadable}
    for pid in list(kept):
        kept.update(ctx.stored.descendants(pid))
    # An id restarted meanwhile is the new run's: its folder stays (a root's earlier steps
    # too, which a rewind may copy; a child's keys of the new run, which its key names alone
    # cannot tell from the ended run's). A restart deletes the ended run's children itself
    # before the new run creates its own (`procstore._runtime.restart`).
    kept.update(restarted)
    if keep_root:
        kept.add(root.id)
    doomed = [pid for pid in ids if pid not in kept and not ((m := ended_runs.get(pid)) and m.keep_keys)]
    children = [pid for pid in doomed if pid != root.id]
    # The keys of procedures this term wrote from step 0: deleted without listing their folder.
    known = {pid: keys for pid in doomed if (m := ended_runs.get(pid)) and (keys := m.known_keys(ctx.store.proc_path))}
    through = {
        pid: max(s for s, _ in m.terminal_keys) for pid in doomed if (m := ended_runs.get(pid)) and m.terminal_keys
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
        if root.inherited:
            await ctx.store.requests.delete_present(unrequested)
        else:
            await ctx.store.requests.delete([pid for pid in unrequested if pid in ctx.operator_requests])

    try:
        await ctx.policy.call(delete)
    except ProcedureError as e:
        logger.warning(
            "procedure %s ended but deleting its keys failed (%s); the next start() deletes them",
            root.id,
            e,
            extra=procedure_fields(root.id, root.type_name, root.steps),
        )
