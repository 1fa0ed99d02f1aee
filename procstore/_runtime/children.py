"""Taking over subprocedures found in the store: a parent resumed after a restart claims
its stored children (finished, unfinished or unreadable) before it runs again, so that no
child id is ever started twice."""

from __future__ import annotations

from collections.abc import Callable

from procstore._logs import get_logger
from procstore._runtime.context import LoadFailed, ManagerContext
from procstore._runtime.meta import ProcedureMeta
from procstore._runtime.outcome import rolled_back
from procstore.ids import ProcedureId
from procstore.procedure import Procedure
from procstore.state import ProcedureState, ProcedureStateKind
from procstore.store.keys import KeyType

logger = get_logger("procstore.runtime")

StartChild = Callable[[ProcedureMeta, Procedure, int, str], None]
"""Starts a runner for a claimed child: its metadata, procedure, next step and stored data."""


def claim_stored_child(
    ctx: ManagerContext, parent_id: ProcedureId, child_id: ProcedureId, start: StartChild, *, roll_back: bool = False
) -> bool:
    """Take over a child found in the store at start; False if there is none.

    With `roll_back`, an unfinished child is made to fail and roll back instead of resuming.
    """
    stored = ctx.stored
    if child_id in stored.committed:
        name = stored.committed.pop(child_id)
        error = stored.rolled_back.pop(child_id, None)
        final = ProcedureState.done() if error is None else rolled_back(error)
        meta = ctx.new_meta(child_id, name, parent_id, None, final, run=stored.committed_runs.pop(child_id, 1))
        meta.end_stored = True
        return True
    if child_id in stored.unreadable:
        problem = stored.unreadable[child_id]
        poison_child(ctx, parent_id, child_id, problem.type_name or "", problem.reason)
        return True
    entry = stored.messages.pop(child_id, None)
    if entry is None:
        return False
    message, rolling_back = entry
    key = ctx.store.key(child_id, message.step, KeyType.ROLLBACK if rolling_back else KeyType.STEP)
    try:
        procedure, lock_key = ctx.load_with_lock_key(child_id, message, key)
    except LoadFailed as e:
        logger.error("cannot resume subprocedure: %s", e.problem, extra=e.problem.log_fields())
        stored.unreadable[child_id] = e.problem
        poison_child(ctx, parent_id, child_id, message.type_name, e.problem.reason)
        return True
    if rolling_back:
        state = ProcedureState.with_error(ProcedureStateKind.ROLLING_BACK, message.error or "unknown error")
    elif roll_back:
        state = ProcedureState.with_error(
            ProcedureStateKind.PREPARE_ROLLBACK, f"its parent {parent_id} is rolling back"
        )
    else:
        state = ProcedureState.running()
    meta = ctx.new_meta(child_id, message.type_name, parent_id, procedure, state, lock_key, message.run)
    start(meta, procedure, message.step + 1, message.data)
    return True


def poison_child(
    ctx: ManagerContext, parent_id: ProcedureId, child_id: ProcedureId, type_name: str, reason: str
) -> None:
    """Register a child that cannot run as POISONED (its parent sees it ended); its keys are kept."""
    state = ProcedureState.with_error(
        ProcedureStateKind.POISONED, f"subprocedure {child_id} cannot run: {reason}; its keys were kept"
    )
    meta = ctx.new_meta(child_id, type_name, parent_id, None, state)
    meta.keep_keys = True
