"""A submit's part inside its term: store the procedure's first step, then start its runner.

Both happen in one task that the term owns (see `ManagerContext.run_in_term`): stop() waits
for it, and a caller that gives up meanwhile cannot leave a stored procedure unrun.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from procstore._runtime.context import ManagerContext
from procstore._runtime.meta import ProcedureMeta
from procstore._runtime.runner import Runner
from procstore._runtime.writes import store_submitted
from procstore.ids import ProcedureId
from procstore.lock_key import LockKey
from procstore.procedure import ProcedureWithId
from procstore.state import ProcedureState

if TYPE_CHECKING:
    from procstore._runtime.leadership import Leadership


async def store_and_run(
    ctx: ManagerContext,
    procedure: ProcedureWithId,
    type_name: str,
    lock_key: LockKey,
    data: str,
    leadership: Leadership | None,
    submitting: set[ProcedureId],
) -> ProcedureMeta | None:
    """Store a submitted procedure's first step and start its runner; None for a duplicate
    (the key holds another value). `lock_key` and `data` were computed by the caller;
    `leadership` is the manager's as the submit began (None without a lease). The id leaves
    `submitting` (the submits in flight) as its procedure is registered, in the same step:
    counted by both, it would count twice against `max_running_procedures`."""
    pid, proc = procedure.id, procedure.procedure
    if not await store_submitted(ctx, pid, type_name, data):
        return None
    ctx.telemetry.submitted(type_name)
    meta = ctx.new_meta(pid, type_name, None, proc, ProcedureState.running(), lock_key)
    submitting.discard(pid)  # known now: a duplicate submit or an adoption sees it registered
    meta.wrote_every_key = True
    if not (ctx.running and (leadership is None or leadership.keeper.is_holding)):
        # Stored, but the term ended as the write landed: the next term (this manager's next
        # start, or the leader's recovery or look for procedures stored after it) runs it.
        # Its watcher here raises `ManagerStopped`.
        meta.abandon()
        return meta
    Runner(ctx, meta, proc, 1, data).start()
    return meta
