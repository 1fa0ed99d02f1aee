"""`procstore resume` and `procstore rewind`: run a failed or stuck procedure again.

Both act through the store, so they work while managers run, under a lease too: the
checks and writes are `procstore._client.operations` (shared with `procstore.Client`); a
nudge (`requests/resume/ID.json`) tells the leader to load the procedure again within a
poll interval; with no manager running, the next one to start does.
"""

from __future__ import annotations

import click

from procstore._cli.common import (
    listed_procedures,
    open_existing_store,
    parse_storage_options,
    refused,
    resolve_id,
    run_command,
    storable_text,
    store_options,
)
from procstore._cli.maintenance import _confirm
from procstore._cli.output import output_console, plural, stored
from procstore._client.operations import (
    Nudged,
    carry_out_resume,
    carry_out_rewind,
    prepare_resume,
    prepare_rewind,
)
from procstore.ids import ProcedureId
from procstore.store.procedure_store import ProcedureStore


async def _resolved(store: ProcedureStore, procedure_id: str) -> ProcedureId:
    listed, unlisted = await listed_procedures(store)
    return resolve_id(set(listed.steps), procedure_id, unlisted)


def _say(pid: ProcedureId, nudged: Nudged, what: str) -> None:
    """What the nudge did, truthfully: written, or one already waiting covers it."""
    console = output_console()
    if nudged.written:
        console.print(
            f"wrote {nudged.key}: the leader loads {pid} again within a second or so (its request_poll_interval); "
            "with no manager running, the next one to start runs it"
        )
    elif nudged.existing is not None:
        console.print(
            f"a nudge was already waiting at {nudged.key} ({stored(nudged.existing.describe())}), so none was "
            f"written: the leader acts on it within a second or so and runs {pid} from what the store then holds"
            + (f", the copy this {what} wrote (step {nudged.step}) included" if nudged.wrote_copy else "")
            + "; with no manager running, the next one to start runs it"
        )
    for note in nudged.notes:
        console.print(note)


REASON = click.option(
    "--reason",
    default=None,
    callback=storable_text,
    help="Why: kept, with who and when, in the new run's history record.",
)


@click.command()
@store_options
@click.argument("procedure_id")
@click.option(
    "--force",
    is_flag=True,
    help="Resume an unfinished procedure: only one that the running manager could not load (POISONED).",
)
@REASON
@run_command
async def resume(
    url: str, storage_options: tuple[str, ...], parent_path: str, procedure_id: str, force: bool, reason: str | None
) -> None:
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
        pid = await _resolved(store, procedure_id)
        with refused():
            prepared = await prepare_resume(store, pid, force=force)
            for note in prepared.notes:
                output_console().print(note)
            nudged = await carry_out_resume(store, prepared, reason)
        _say(pid, nudged, "resume")
    finally:
        await store.store.close()


@click.command()
@store_options
@click.argument("procedure_id")
@click.option("--to-step", "to_step", type=click.IntRange(min=0), required=True, help="The stored step to run from.")
@click.option("--force", is_flag=True, help="Rewind an unfinished procedure: only when no manager runs on the store.")
@REASON
@click.option("--yes", "-y", is_flag=True, help="Do not ask for confirmation.")
@run_command
async def rewind(
    url: str,
    storage_options: tuple[str, ...],
    parent_path: str,
    procedure_id: str,
    to_step: int,
    force: bool,
    reason: str | None,
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
        pid = await _resolved(store, procedure_id)
        with refused():
            prepared = await prepare_rewind(store, pid, to_step, force=force)
            _confirm(f"Rewind {pid} to step {to_step} (written as step {prepared.plan.latest.step + 1})?", yes)
            nudged = await carry_out_rewind(store, prepared, reason)
        _say(pid, nudged, f"rewind to step {to_step}")
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
