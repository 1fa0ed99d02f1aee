"""Writing history records (see `procstore.store.history`) as trees end and at recovery."""

from __future__ import annotations

from datetime import UTC, datetime

from procstore._logs import get_logger
from procstore._runtime.context import ManagerContext
from procstore._runtime.meta import ProcedureMeta
from procstore.ids import ProcedureId
from procstore.state import ProcedureState
from procstore.store.history import HistoryRecord, iso
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
    )


async def record_tree(
    ctx: ManagerContext, ids: list[ProcedureId], root: ProcedureMeta, root_state: ProcedureState, ended: datetime
) -> None:
    """Write a record for each ended procedure of a finished tree (before its keys go).

    Raises the store's error: the caller then keeps the keys, and the next start records
    and deletes them.
    """
    if ctx.history is None:
        return
    records: list[HistoryRecord] = []
    for pid in ids:
        meta = ctx.metas.get(pid)
        if meta is not None:
            state = root_state if meta is root else meta.state
            if state.is_ended():
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
                )
            )
    await ctx.history.put_many(records)


async def record_recovered(ctx: ManagerContext, loaded: ProcedureMessages, ids: list[ProcedureId]) -> None:
    """Records for finished procedures recovery is about to delete, unless one exists.

    What the store keeps of them is their last message: no start time, no retry count.
    """
    if ctx.history is None or not ids:
        return
    recorded = await ctx.history.recorded_ids()
    now = iso(datetime.now(UTC)) or ""
    records: list[HistoryRecord] = []
    for pid in ids:
        message = loaded.finished_messages.get(pid)
        if str(pid) in recorded or message is None:
            continue
        rolled_back = pid in loaded.rolled_back_ids
        records.append(
            HistoryRecord(
                id=str(pid),
                type_name=message.type_name,
                parent_id=None if message.parent_id is None else str(message.parent_id),
                outcome="failed" if rolled_back else "done",
                error=message.error if rolled_back else None,
                ended_at=now,
                steps=message.step,
            )
        )
    await ctx.history.put_many(records)
