"""The writes of a term outside a procedure's steps: a submit's first key, a finished tree's deletion."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime

from procstore._logs import get_logger, procedure_fields
from procstore._runtime.context import ManagerContext
from procstore._runtime.history import record_tree
from procstore._runtime.meta import ProcedureMeta
from procstore._runtime.request_wakes import first_request_wakes
from procstore.errors import LeaseExpired, ProcedureError, StoreError, describe
from procstore.ids import ProcedureId
from procstore.state import ProcedureState

logger = get_logger("procstore.runtime")


async def store_submitted(ctx: ManagerContext, pid: ProcedureId, type_name: str, data: str) -> bool:
    """Create a submitted procedure's first key, retrying transient errors as a step's write.

    Repeating the create is safe: it is create-only and recognises our own bytes. Returns
    False if the key holds something else (a duplicate id).
    """
    retried = False

    async def create(attempt: int) -> bool:
        return await ctx.store.create_procedure(pid, type_name, data, None)

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


async def delete_tree_later(ctx: ManagerContext, root: ProcedureMeta, ids: list[ProcedureId], delay: float) -> None:
    """`delete_tree` after `delay` seconds: a paused former leader's late write could
    re-create a key deleted now."""
    await asyncio.sleep(delay)
    await delete_tree(ctx, root, ids, root.state)
    ctx.on_tree_finished(ids)


async def delete_tree(ctx: ManagerContext, root: ProcedureMeta, ids: list[ProcedureId], state: ProcedureState) -> None:
    """Record a finished tree (with history on), then delete the keys that may go.

    Kept: unreadable procedures and those whose keys must survive (`keep_keys`). A failure
    is logged, not raised: the next start deletes (and records) what is left.
    """
    # An unreadable procedure is kept, and so is every descendant of it: a procedure whose
    # parent cannot be read is not known to be finished with (its parent may still need it).
    kept = {pid for pid in ids if pid in ctx.stored.unreadable}
    for pid in list(kept):
        kept.update(ctx.stored.descendants(pid))
    doomed = [pid for pid in ids if pid not in kept and not ((m := ctx.metas.get(pid)) and m.keep_keys)]
    if not doomed and ctx.history is None:
        return
    children = [pid for pid in doomed if pid != root.id]
    # The keys of procedures this term wrote from step 0: deleted without listing their folder.
    known = {pid: keys for pid in doomed if (m := ctx.metas.get(pid)) and (keys := m.known_keys(ctx.store.proc_path))}
    ended = datetime.now(UTC)  # one end time for every attempt: one record, not one per retry

    async def delete(_attempt: int) -> None:
        # The record first: keys deleted unrecorded would be history lost for good.
        await record_tree(ctx, ids, root, state, ended)
        # Children first, the root last: a crash part way leaves the root marked finished.
        await ctx.store.delete_procedures(children, known)
        if doomed and doomed[0] == root.id:
            await ctx.store.delete_procedure(root.id, known.get(root.id))
        # Requests go last: until the keys are gone, a restart must honour them again. A tree
        # recovered from the store may have requests this term never read (a rollback reads none).
        if root.inherited:
            await ctx.store.requests.delete_present(doomed)
        else:
            await ctx.store.requests.delete([pid for pid in doomed if pid in ctx.operator_requests])

    try:
        await ctx.policy.call(delete)
    except ProcedureError as e:
        logger.warning(
            "procedure %s ended but deleting its keys failed (%s); the next start() deletes them",
            root.id,
            e,
            extra=procedure_fields(root.id, root.type_name, root.steps),
        )
