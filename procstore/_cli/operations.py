"""`procstore resume` and `procstore rewind`: run a failed or stuck procedure again.

Both act through the store, so they work while managers run, under a lease too: the
state to run from is written as a new step key (`procstore.store.restart`), and a nudge
(`requests/resume/ID.json`, naming that key's step) tells the leader to load the procedure
again within a poll interval; with no manager running, the next one to start does.

Writes, in order: a rewind deletes the operator request, writes the copy, then the nudge.
A crash before the copy changes nothing that matters (run it again); after it, the
procedure is unfinished at the copy, which the next start runs, and `resume` (which
accepts a latest `.step` right above a `.commit`: a copy not run past) nudges a running
leader to run it. A resume writes only the nudge (the leader writes its copy).
"""

from __future__ import annotations

import click

from procstore._cli.common import (
    CommandError,
    ExitCode,
    listed_procedures,
    open_existing_store,
    parse_storage_options,
    resolve_id,
    run_command,
    store_options,
)
from procstore._cli.history import history_of
from procstore._cli.maintenance import _confirm
from procstore._cli.output import output_console, plural, stored
from procstore.errors import ProcedureError
from procstore.ids import ProcedureId
from procstore.store.message import ProcedureMessage
from procstore.store.procedure_store import ProcedureStore
from procstore.store.requests import OperatorRequest
from procstore.store.restart import RestartedMeanwhile, RestartPlan, apply_restart, check_restart, plan_restart


async def _plan(store: ProcedureStore, procedure_id: str, to_step: int | None) -> RestartPlan:
    listed, unlisted = await listed_procedures(store)
    pid = resolve_id(set(listed.steps), procedure_id, unlisted)
    try:
        return await plan_restart(store, pid, to_step)
    except ProcedureError as e:
        raise CommandError(str(e), ExitCode.REFUSED) from e


async def _checked(store: ProcedureStore, plan: RestartPlan) -> ProcedureMessage:
    """What the restart runs from, refused (exit 6, nothing changed) if it cannot run."""
    try:
        return await check_restart(store, plan)
    except ProcedureError as e:
        raise CommandError(str(e), ExitCode.REFUSED) from e


async def _nudge(store: ProcedureStore, pid: ProcedureId, what: str, step: int, wrote_copy: bool) -> None:
    """Write the nudge naming `step` (the latest key as the leader should find it); say
    truthfully what happened if a nudge was there already."""
    key = store.resumes.key(pid)
    for _ in range(3):
        if await store.resumes.put(pid, OperatorRequest.new("resume", what, step)):
            output_console().print(
                f"wrote {key}: the leader loads {pid} again within a second or so (its request_poll_interval); "
                "with no manager running, the next one to start runs it"
            )
            return
        existing = await store.resumes.get(pid)
        if existing is None:
            continue  # acted on and deleted since: write ours again
        if wrote_copy or existing.step == step:
            # The leader deletes a nudge only after acting on it, then reads the store again:
            # it runs what it finds, the copy written above included.
            output_console().print(
                f"a nudge was already waiting at {key} ({stored(existing.describe())}), so none was written: the "
                f"leader acts on it within a second or so and runs {pid} from what the store then holds"
                + (f", the copy this {what} wrote (step {step}) included" if wrote_copy else "")
                + "; with no manager running, the next one to start runs it"
            )
            return
        raise CommandError(
            f"a nudge for an earlier state of {pid} is waiting at {key} ({existing.describe()}): the leader deletes "
            "it unused at its next look (within a second or so; with no manager running, at the next start). Run "
            "this command again then",
            ExitCode.REFUSED,
        )
    raise CommandError(f"the nudge at {key} kept changing while it was written; try again", ExitCode.REFUSED)


@click.command()
@store_options
@click.argument("procedure_id")
@click.option(
    "--force",
    is_flag=True,
    help="Resume an unfinished procedure: only one that the running manager could not load (POISONED).",
)
@run_command
async def resume(url: str, storage_options: tuple[str, ...], parent_path: str, procedure_id: str, force: bool) -> None:
    """Run a failed procedure again from its last stored step, with fresh retries.

    For a root that ended FAILED with its keys kept (managers with keep_failed=True, or a
    rollback that failed). Refused, exit code 6, saying why: a subprocedure (resume its
    root), one that finished successfully, one that was rolled back (rewind it instead: its
    later steps would run over undone work; told by its history record, else the manager
    checks), and one that is unfinished, which a manager may be running (the next start
    resumes it anyway; `--force` for one the running manager could not load, POISONED).
    Not refused: one whose latest key is a restart's copy no manager has run past (a
    `rewind` interrupted before its nudge): only the nudge is written, which a manager
    running it ignores. PROCEDURE_ID may be a unique prefix.
    """
    store = await open_existing_store(url, storage_options, parent_path)
    try:
        plan = await _plan(store, procedure_id, None)
        pid = plan.procedure_id
        if not plan.ended and not plan.copy_pending and not force:
            raise CommandError(
                f"procedure {pid} is unfinished (its latest key is {plan.latest.step}.{plan.latest.key_type.value}): "
                "a manager may be running it, and the next one to start resumes it anyway. Resume is for a "
                f"procedure that has ended: cancel it first (procstore cancel {pid}), or pass --force if the "
                "running manager could not load it (POISONED)",
                ExitCode.REFUSED,
            )
        await _checked(store, plan)
        if plan.copy_pending:
            output_console().print(
                f"its latest key, {plan.latest.step}.step, is a restart's copy that no manager has run past (a "
                "rewind or resume interrupted before its nudge, or one a manager is just starting): nudging the "
                "leader to run it (one that runs it already ignores the nudge)"
            )
        record = await history_of(store).find(pid) if plan.ended else None
        if record is not None and record.outcome == "rolled back":
            raise CommandError(
                f"procedure {pid} was rolled back: resuming would run its later steps over undone work; "
                f"rewind it instead (procstore rewind {pid} --to-step 0 to run it again from the start)",
                ExitCode.REFUSED,
            )
        if not plan.ended and not plan.copy_pending:
            # `--force` on one its manager could not load: the operator's word is newer than
            # any request stored for it. (A request stored after a restart's copy stands.)
            await store.requests.delete([pid])
        await _nudge(store, pid, "resume", plan.latest.step, wrote_copy=False)
        if plan.ended and record is None:
            output_console().print(
                "no history record says whether it was rolled back: the manager checks, and refuses (in its log) "
                "to resume a rolled-back one"
            )
    finally:
        await store.store.close()


@click.command()
@store_options
@click.argument("procedure_id")
@click.option("--to-step", "to_step", type=click.IntRange(min=0), required=True, help="The stored step to run from.")
@click.option("--force", is_flag=True, help="Rewind an unfinished procedure: only when no manager runs on the store.")
@click.option("--yes", "-y", is_flag=True, help="Do not ask for confirmation.")
@run_command
async def rewind(
    url: str,
    storage_options: tuple[str, ...],
    parent_path: str,
    procedure_id: str,
    to_step: int,
    force: bool,
    yes: bool,
) -> None:
    """Make step N's stored state the latest again, then run the procedure from there.

    The state is copied to a new key above the latest: step keys are never overwritten, so
    the history stays for audit. Refused on an unfinished procedure, which a manager may be
    running: cancel it (`procstore cancel`), wait until it has ended, then rewind (its keys
    are kept if managers run with keep_failed=True). `--force` rewinds it anyway, for a
    store no manager runs on. Refused too, exit code 6, if another operator restarted it
    first (retry once you have looked at it). PROCEDURE_ID may be a unique prefix.
    """
    store = await open_existing_store(url, storage_options, parent_path)
    try:
        plan = await _plan(store, procedure_id, to_step)
        pid = plan.procedure_id
        if plan.copy_pending and not force:
            raise CommandError(
                f"procedure {pid} is unfinished: its latest key, {plan.latest.step}.step, is a restart's copy that "
                "no manager has run past (a rewind or resume interrupted before its nudge, or one a manager is just "
                f"starting). Run it: procstore resume {pid} (a manager that runs it already ignores that); rewind it "
                "once it has ended, or pass --force if no manager runs on this store",
                ExitCode.REFUSED,
            )
        if not plan.ended and not force:
            raise CommandError(
                f"procedure {pid} is unfinished (its latest key is {plan.latest.step}.{plan.latest.key_type.value}): "
                f"a manager may be running it. Cancel it first (procstore cancel {pid}) and rewind it once it has "
                "ended, or pass --force if no manager runs on this store",
                ExitCode.REFUSED,
            )
        message = await _checked(store, plan)
        _confirm(f"Rewind {pid} to step {to_step} (written as step {plan.latest.step + 1})?", yes)
        # Certain now. The old request first: left in place, it would fail the rewound run at once.
        await store.requests.delete([pid])
        try:
            copied = await apply_restart(store, plan, message)
        except RestartedMeanwhile as e:
            raise CommandError(str(e), ExitCode.REFUSED) from e
        await _nudge(store, pid, f"rewind to step {to_step}", copied.step, wrote_copy=True)
    finally:
        await store.store.close()


@click.command()
@store_options
@click.argument("snapshot", type=click.Path(dir_okay=False, writable=True))
@run_command
async def export(url: str, storage_options: tuple[str, ...], parent_path: str, snapshot: str) -> None:
    """Write the store's procedures and operator requests to SNAPSHOT (a .tar.gz).

    For `procstore.testing.replay`: run them with a new release's code in a sandbox, to
    prove it can take over the work in flight. Read-only; export from a store no manager
    writes to, or accept a snapshot of one moment.
    """
    from procstore.testing.replay import export_snapshot

    await open_existing_store(url, storage_options, parent_path)  # a clear error for a bad URL
    count = await export_snapshot(url, snapshot, parse_storage_options(storage_options), parent_path)
    output_console().print(f"wrote {plural(count, 'key')} to {snapshot}")
