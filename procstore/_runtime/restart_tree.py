"""The stored descendants of a root that an operator resumes or rewinds in a running term.

A root whose end the store refused keeps its whole tree stored, and so does one whose tree's
deletion waits out a takeover's grace. Restarted in the term that knew it, the run it runs
finds that tree as the next start would, from the store (what the term remembers of it may
have expired with `metadata_ttl`, and a crash can come at any point of the restart):

- a descendant of the run it runs (a resume as stored goes on with the same run) is kept
  for the root to claim, ended or not: never deleted, so that a crash before the root's
  end leaves it for the next start, and never created and run again;
- a finished descendant of an earlier run (a rewind's or a resumed failed root's copy
  starts a new run) goes, after its end record, once the new run's copy is stored, and
  before the new run can name it again: a crash between the copy and the deletion leaves
  it to the next start, which deletes it for the same reason
  (`procstore._runtime.recovery._runs_that_ended`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from procstore._runtime.recovery import delete_consumed_of_ended, record_recovered, stored_tree
from procstore._runtime.runner import record_known_ends
from procstore.errors import ProcedureError
from procstore.ids import ProcedureId

if TYPE_CHECKING:
    from procstore._runtime.context import ManagerContext


async def take_stored_tree(ctx: ManagerContext, root_id: ProcedureId, run: int) -> None:
    """Before the root runs `run` here: keep its stored descendants of that run for it to
    claim, and delete the finished ones of earlier runs. Raises `ProcedureError` if they
    cannot be read or deleted (the run is then left to the next start, or to another restart)."""
    loaded = await ctx.store.load_messages()
    recorded = await ctx.store.history.recorded()
    found = stored_tree(loaded, root_id)
    known = [meta for pid in found if (meta := ctx.metas.get(pid)) is not None and meta.state.is_ended()]
    # Their ended runs are known again from the store below (claimed as ended), as part of
    # the tree that runs now: this term's memory of them may expire meanwhile. Their records
    # first, from that memory, which the store's keys alone cannot give (a rollback, times).
    await ctx.settings.policy.call(lambda _n: record_known_ends(ctx, known))
    for meta in known:
        ctx.forget(meta.id)
    for pid, message in found.items():
        if message.run == run:
            ctx.recovered.keep_for_parent(pid, message, loaded)
    for problem in loaded.problems:
        if problem.procedure_id in found:
            ctx.recovered.keep_unreadable(problem)
    earlier = [pid for pid, m in found.items() if m.run < run and pid in loaded.finished_messages]
    if earlier:
        try:
            await ctx.settings.policy.call(lambda _n: record_recovered(ctx, loaded, earlier, recorded))
            await ctx.settings.policy.call(lambda _n: ctx.store.delete_procedures(earlier))
        except ProcedureError as e:
            raise ProcedureError(
                f"procedure {root_id}: its run {run} is stored, but the subprocedures its earlier run left "
                f"could not be deleted ({e}); the next start deletes them and runs it"
            ) from e
        await delete_consumed_of_ended(ctx, loaded, earlier)
