"""Writing history records (see `procstore.store.history`) as trees end and at recovery."""

from __future__ import annotations

import dataclasses
import time
from datetime import UTC, datetime

from procstore._logs import get_logger
from procstore._runtime.context import ManagerContext
from procstore._runtime.meta import ProcedureMeta
from procstore.errors import ProcedureError
from procstore.ids import ProcedureId
from procstore.state import ProcedureState
from procstore.store.history import HistoryRecord, Recorded, iso, record_from_keys
from procstore.store.keys import procedure_dir
from procstore.store.message import ProcedureMessage
from procstore.store.procedure_store import ProcedureMessages

logger = get_logger("procstore.runtime")


def _record(meta: ProcedureMeta, state: ProcedureState, ended: datetime) -> HistoryRecord:
    return HistoryRecord(
        id=str(meta.id),
        type_name=meta.type_name,
        parent_id=None if meta.parent_id is None else str(meta.parent_id),
        outcome=meta.outcome(state),
        error=state.error,
        started_at=iso(meta.start_time),
        ended_at=iso(meta.end_time or ended) or "",
        steps=meta.steps,
        retries=meta.retries,
        run=meta.run,
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
            if meta.end_stored and state.is_ended():
                records.append(_record(meta, state, ended))
        elif (type_name := ctx.stored.committed.get(pid)) is not None:
            # A child that ended in an earlier term: the store kept only its last message, which
            # does not say whether it rolled back or had no rollback (`StoredStatus.FAILED`).
            error = ctx.stored.rolled_back.get(pid)
            records.append(
                HistoryRecord(
                    id=str(pid),
                    type_name=type_name,
                    parent_id=next((str(p) for p, kids in ctx.stored.children_of.items() if pid in kids), None),
                    outcome="done" if error is None else "failed",
                    error=error,
                    ended_at=iso(ended) or "",
                    run=ctx.stored.committed_runs.get(pid, 1),
                )
            )
    await ctx.history.put_many(records)


async def record_superseded(
    ctx: ManagerContext, procedure_id: ProcedureId, old: ProcedureMeta | None, new_run: ProcedureMessage, how: str
) -> None:
    """The end record of the run an operator's restart (`how`) has just superseded with a
    copy (`new_run`'s first message) before that run's end was stored: it ended here
    unrecorded (`old`, its metadata), or it was stuck (nothing here ran it). History holds
    one record per run; written after the copy, so that a crash between the two leaves the
    run to the new one, never an unfinished run marked ended. An error is logged: the new
    run goes on, and that one record is missing."""
    if old is not None and old.run == new_run.run - 1 and old.state.is_ended():
        state = old.state
        error = f"{state.error}; {how} before this end was stored" if state.error else how
        record = _record(old, dataclasses.replace(state, error=error), datetime.now(UTC))
    else:
        record = HistoryRecord(
            id=str(procedure_id),
            type_name=new_run.type_name,
            parent_id=None if new_run.parent_id is None else str(new_run.parent_id),
            outcome="failed",
            error=f"{how} before it ended",
            ended_at=iso(datetime.now(UTC)) or "",
            run=new_run.run - 1,
        )
    try:
        await ctx.policy.call(lambda _n: ctx.history.put_many([record]))
    except ProcedureError as e:
        logger.warning(
            "run %d of procedure %s was superseded, but its end record could not be written: %s",
            record.run,
            procedure_id,
            e,
        )


async def record_recovered(
    ctx: ManagerContext, loaded: ProcedureMessages, ids: list[ProcedureId], recorded: Recorded
) -> None:
    """End records for the finished runs recovery is about to delete, unless history holds
    that end (`recorded`: a record of another run of the same id says nothing of this one).

    What the store keeps of them is their last message: no start time, no retry count.
    """
    now = iso(datetime.now(UTC)) or ""
    records = [
        record_from_keys(pid, message, rolled_back=pid in loaded.rolled_back_ids, ended_at=now)
        for pid in ids
        if (message := loaded.finished_messages.get(pid)) is not None
    ]
    await ctx.history.put_unrecorded(records, recorded)


async def record_kept(
    ctx: ManagerContext, loaded: ProcedureMessages, ids: list[ProcedureId], recorded: Recorded
) -> None:
    """End records for failed roots kept for an operator whose end history lacks: a crash
    came between their `.commit` and their record. The record says when the `.commit` was
    written (where the store knows), so one that retention swept since stays swept instead
    of coming back, as ending now, at every start."""
    now = time.time()
    records: list[HistoryRecord] = []
    for pid in ids:
        message = loaded.finished_messages.get(pid)
        if message is None or recorded.has(pid, message.run):
            continue
        modified = await ctx.store.store.walk_modified(procedure_dir(ctx.store.proc_path, pid))
        ended = max((t for t in modified.values() if t is not None), default=now)
        if now - ended > ctx.history.settings.retention:
            continue
        at = iso(datetime.fromtimestamp(ended, UTC)) or ""
        records.append(record_from_keys(pid, message, rolled_back=True, ended_at=at))
    await ctx.history.put_many(records)
