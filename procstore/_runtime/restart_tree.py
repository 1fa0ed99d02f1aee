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

from procstore._runtime.recovery import record_recovered
from procstore.errors import ProcedureError
from procstore.ids import ProcedureId
from procstore.store.message import ProcedureMessage
from procstore.store.procedure_store import ProcedureMessages
from procstore.store.tree import descendants

if TYPE_CHECKING:
    from procstore._runtime.context import ManagerContext


async def take_stored_tree(ctx: ManagerContext, root_id: ProcedureId, run: int) -> None:
    """Before the root runs `run` here: keep its stored descendants of that run for it to
    claim, and delete the finished ones of earlier runs. Raises `ProcedureError` if they
    cannot be read or deleted (the run is then left to the next start, or to another restart)."""
    loaded = await ctx.store.load_messages()
    recorded = await ctx.store.history.recorded()
    stored = _stored_messages(loaded)
    children: dict[ProcedureId, list[ProcedureId]] = {}
    for pid, message in stored.items():
        if message.parent_id is not None:
            children.setdefault(message.parent_id, []).append(pid)
    found = descendants(root_id, lambda pid: children.get(pid, ()))
    for pid in found:
        meta = ctx.metas.get(pid)
        if meta is not None and meta.state.is_ended():
            # Its ended run is known again from the store below (claimed as ended), as part
            # of the tree that runs now: this term's memory of it may expire meanwhile.
            ctx.forget(pid)
    earlier = [pid for pid in found if stored[pid].run < run and pid in loaded.finished_messages]
    for pid in found:
        if stored[pid].run == run:
            ctx.recovered.keep_for_parent(pid, stored[pid], loaded)
    for problem in loaded.problems:
        if problem.procedure_id in found:
            ctx.recovered.keep_unreadable(problem)
    if earlier:
        try:
            await ctx.settings.policy.call(lambda _n: record_recovered(ctx, loaded, earlier, recorded))
            await ctx.settings.policy.call(lambda _n: ctx.store.delete_procedures(earlier))
        except ProcedureError as e:
            raise ProcedureError(
                f"procedure {root_id}: its run {run} is stored, but the subprocedures its earlier run left "
                f"could not be deleted ({e}); the next start deletes them and runs it"
            ) from e


def _stored_messages(loaded: ProcedureMessages) -> dict[ProcedureId, ProcedureMessage]:
    """Each procedure's message that says its parent and run: its latest, or for a finished
    one the message its `.commit` ends."""
    out = {pid: m for pid, m in loaded.finished_messages.items() if m is not None}
    out.update(loaded.messages)
    out.update(loaded.rollback_messages)
    return out
