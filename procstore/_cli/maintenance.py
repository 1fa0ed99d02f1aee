"""`procstore gc`, `fail`, `cancel` and `delete`: change a store, carefully.

`fail` and `cancel` write a request that running managers honour, so they are safe while
managers run. `gc` and `delete` are for stores no manager drives (as with Accumulo's
`fate delete`): a manager running a procedure would keep writing its steps.
"""

from __future__ import annotations

import asyncio
import time
from datetime import UTC, datetime

import click
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn

from procstore._cli.common import (
    DECLINED,
    CommandError,
    ExitCode,
    listed_procedures,
    open_existing_store,
    parse_age,
    refused,
    resolve_id,
    run_command,
    storable_text,
    store_options,
)
from procstore._cli.listing import OUR_FOLDERS, load_inventory, procedures_table, row_json
from procstore._cli.output import chosen_format, emit, error_console, output_console, output_options, plain, plural
from procstore._client.inventory import Inventory, StoredProcedure
from procstore._client.operations import stoppable, write_stop_request
from procstore._text import terminal_text
from procstore.ids import ProcedureId
from procstore.store.folder import StoredStatus
from procstore.store.history import HistoryStore, iso, record_from_keys
from procstore.store.local import TEMP_PREFIX, Leftovers, LocalDirStore
from procstore.store.procedure_store import ProcedureStore
from procstore.store.requests import RequestKind
from procstore.store.run_origin import run_origin

_GC_CONCURRENCY = 16


def _confirm(question: str, yes: bool) -> None:
    # The question names stored values (a type name): no control character reaches the terminal.
    if not yes and not click.confirm(terminal_text(question), default=False, err=True):
        raise CommandError(DECLINED, ExitCode.REFUSED)


@click.command()
@store_options
@click.option(
    "--older-than",
    default="0s",
    show_default=True,
    callback=lambda _c, _p, v: parse_age(v),
    help="Only procedures finished longer ago (7d, 12h).",
)
@click.option("--dry-run", is_flag=True, help="List what would be deleted; change nothing.")
@output_options
@run_command
async def gc(
    url: str,
    storage_options: tuple[str, ...],
    parent_path: str,
    older_than: float,
    dry_run: bool,
    output: str | None,
    as_json: bool,
) -> None:
    """Delete committed procedures, in the documented order (steps, then commit, then folder).

    Committed subprocedures of a parent that is still unfinished are kept: the parent reads
    them when it resumes. So is a committed procedure whose value cannot be read: whose child
    it is is unknown. A failed root (kept by keep_failed for an operator) is kept too:
    only `procstore delete` removes one. On a local store, temp files a crashed writer left
    (`.tmp-*`, older than an hour) and empty procedure folders older than an hour go too;
    newer temp files and lock files of keys that are gone are reported. Other keys under
    `procedure/` are reported, never deleted: procstore did not write them. Managers delete
    committed procedures at start; this is for stores no one starts.
    """
    fmt = chosen_format(storage_options, output, as_json)
    store = await open_existing_store(url, storage_options, parent_path)
    console = error_console()
    leftovers = Leftovers()
    try:
        inventory = await load_inventory(store, console)
        now = time.time()
        collectable = inventory.collectable()
        failed = [p for p in collectable if p.status is StoredStatus.FAILED and p.parent_id is None]
        failed_ids = {p.procedure_id for p in failed}  # a set: linear in the store, however many failed
        chosen = [
            p
            for p in collectable
            if p.procedure_id not in failed_ids and p.modified is not None and now - p.modified >= older_than
        ]
        kept = sum(p.status is StoredStatus.COMMITTED for p in inventory.procedures.values()) - len(
            [p for p in chosen if p.status is StoredStatus.COMMITTED]
        )
        if not dry_run:
            await _delete_all(store, chosen, console)
        if isinstance(store.store, LocalDirStore):
            folders = [store.proc_path, *(f"{store.parent_path}{f}" for f in OUR_FOLDERS)]
            leftovers = await store.store.leftovers(folders, store.proc_path, remove=not dry_run)
    finally:
        await store.store.close()
    verb = "would delete" if dry_run else "deleted"
    removed = "would remove" if dry_run else "removed"
    others = [k for k in inventory.other_keys if not k.rsplit("/", 1)[-1].startswith(TEMP_PREFIX)]
    summary = (
        f"{'dry run: ' if dry_run else ''}{verb} {plural(len(chosen), 'finished procedure')}; kept "
        f"{kept} committed (too recent, parent still unfinished, or a value that cannot be read)"
        + (f"; kept {len(failed)} failed (`procstore delete ID` removes one)" if failed else "")
        + (f"; {removed} {plural(len(leftovers.old_temps), 'stale temp file')}" if leftovers.old_temps else "")
        + (
            f"; {removed} {plural(len(leftovers.old_empty_folders), 'empty procedure folder')}"
            if leftovers.old_empty_folders
            else ""
        )
    )
    document = {
        "dry_run": dry_run,
        "deleted": [row_json(p, inventory) for p in chosen],
        "kept_committed": kept,
        "kept_failed": [str(p.procedure_id) for p in failed],
        "temp_files_removed": len(leftovers.old_temps),
        "empty_folders_removed": leftovers.old_empty_folders,
        "recent_temp_files": leftovers.young_temps,
        "stray_lock_files": leftovers.stray_locks,
        "left_alone": others + leftovers.young_empty_folders,
    }
    warnings = [
        *(
            f"failed, kept for an operator (`procstore resume`, `rewind`, or `procstore delete` to remove it): "
            f"{p.procedure_id}"
            for p in failed
        ),
        *(f"cannot list {k} ({why}), left alone: fix its permissions" for k, why in sorted(inventory.unlisted.items())),
        *(f"not written by procstore, left alone: {k}" for k in others),
        *(f"recent temp file (a write under way, or cut short lately), left alone: {k}" for k in leftovers.young_temps),
        *(f"lock file of a key that is gone (harmless), left alone: {k}" for k in leftovers.stray_locks),
        *(f"recent empty procedure folder, left alone: {k}" for k in leftovers.young_empty_folders),
    ]
    emit(
        fmt,
        document,
        lambda: [procedures_table(chosen, now, inventory=inventory, title=verb), summary],
        rows="deleted",
        warnings=warnings,
    )


def _parent_not_ended(inventory: Inventory, p: StoredProcedure, doomed: set[ProcedureId]) -> str | None:
    """The nearest ancestor of `p` that has not ended, or may not have, in words (`{id}, which
    is unfinished`); None if all have. One whose latest value cannot be read (`unreadable`),
    or in a parent cycle, has not ended: restored, it runs on. One whose folder cannot be
    listed may not have. The ancestors being deleted with `p` (a cycle it is in) do not count."""
    ancestors = inventory.ancestors(p)
    for a in ancestors:
        if a.is_alive and a.procedure_id not in doomed:
            return f"{a.procedure_id}, which is {inventory.word(a)}"
    top = ancestors[-1] if ancestors else p
    if top.parent_id in inventory.unlisted_ids and top.parent_id not in inventory.procedures:
        return f"{top.parent_id}, whose folder cannot be listed (it may not have ended)"
    return None


async def record_ends(store: ProcedureStore, procedures: list[StoredProcedure]) -> None:
    """Write the end record of each finished run about to be deleted (create-only: the
    record its manager wrote stands), as a manager's deletion does: without it, a late
    write could re-create and run it again (docs/guarantees.md, "Runs and end records")."""
    ended_at = iso(datetime.now(UTC)) or ""
    ended = [
        p for p in procedures if p.message is not None and p.status in (StoredStatus.COMMITTED, StoredStatus.FAILED)
    ]
    requested = await store.requests.that_ended(
        {p.procedure_id: p.message.error for p in ended if p.message is not None and p.status is StoredStatus.FAILED}
    )
    records = [
        record_from_keys(
            p.procedure_id,
            p.message,
            rolled_back=p.status is StoredStatus.FAILED,
            ended_at=ended_at,
            started=run_origin(p.message),
            ended_by=requested.get(p.procedure_id),
        )
        for p in ended
        if p.message is not None
    ]
    await HistoryStore(store.store, store.parent_path).put_unrecorded(records)


async def _delete_all(store: ProcedureStore, procedures: list[StoredProcedure], console: Console) -> int:
    await record_ends(store, procedures)
    limit = asyncio.Semaphore(_GC_CONCURRENCY)
    progress = Progress(TextColumn("deleting"), BarColumn(), MofNCompleteColumn(), console=console, transient=True)
    with progress:
        task = progress.add_task("deleting", total=len(procedures))

        async def one(p: StoredProcedure) -> None:
            async with limit:
                await store.delete_procedure(p.procedure_id)
            progress.advance(task)

        await asyncio.gather(*(one(p) for p in procedures))
    return len(procedures)


async def _request(
    kind: RequestKind,
    url: str,
    storage_options: tuple[str, ...],
    parent_path: str,
    procedure_id: str,
    reason: str,
    yes: bool,
) -> None:
    store = await open_existing_store(url, storage_options, parent_path)
    try:
        listed, unlisted = await listed_procedures(store)
        pid = resolve_id(set(listed.steps), procedure_id, unlisted)
        with refused():
            p = await stoppable(store, pid, kind)
            _confirm(f"{kind.capitalize()} {plain(p.type_name)} {pid} (step {p.step})?", yes)
            await write_stop_request(store, pid, kind, reason)
    finally:
        await store.store.close()
    output_console().print(
        f"wrote {store.requests.key(pid)}: the manager running {pid} (or the next one to start) "
        "stops it before its next step and rolls it back if it supports rollback; its unfinished subprocedures too"
    )


_REQUEST_HELP = """

    Writes a durable request (`requests/ID.json`) that the manager running the procedure, in
    this process or another, honours before the procedure's next step at the latest, also
    under a lease; a procedure waiting for its subprocedures or a retry is reached within a
    second or so. Without a running manager, the next start honours it.
    """


def _request_command(kind: RequestKind, verb: str, default_reason: str) -> click.Command:
    """`procstore fail` and `procstore cancel`: the same request, of another kind."""

    @click.command(kind, help=f"{verb} an unfinished procedure: it rolls back if it can, else fails." + _REQUEST_HELP)
    @store_options
    @click.argument("procedure_id")
    @click.option(
        "--reason", default=default_reason, show_default=True, callback=storable_text, help="Stored as the error."
    )
    @click.option("--yes", "-y", is_flag=True, help="Do not ask for confirmation.")
    @run_command
    async def command(
        url: str, storage_options: tuple[str, ...], parent_path: str, procedure_id: str, reason: str, yes: bool
    ) -> None:
        await _request(kind, url, storage_options, parent_path, procedure_id, reason, yes)

    return command


fail = _request_command("fail", "Fail", "marked failed by an operator")
cancel = _request_command("cancel", "Cancel", "cancelled by an operator")


@click.command()
@store_options
@click.argument("procedure_id")
@click.option("--yes", "-y", is_flag=True, help="Do not ask for confirmation.")
@click.option("--force", is_flag=True, help="Delete it even unfinished: only when no manager runs on the store.")
@run_command
async def delete(
    url: str, storage_options: tuple[str, ...], parent_path: str, procedure_id: str, yes: bool, force: bool
) -> None:
    """Remove an ended procedure and its subprocedures from the store.

    Its effects are not undone: use `procstore fail` for that. Subprocedures go first, then
    the procedure; each in the documented order (steps, then commit or rollback, then folder).
    Refused, exit code 6, for a procedure that is unfinished or rolling back, or has such a
    subprocedure: a manager may be running it, and would run on with what it holds in
    memory (a ghost no store shows); and for a subprocedure whose parent has not ended (the
    parent reads its end when it goes on, and without it would run it again). Cancel it, and
    delete it once it has ended; `--force` deletes it anyway, for a store no manager runs on.
    """
    store = await open_existing_store(url, storage_options, parent_path)
    try:
        inventory = await load_inventory(store, error_console())
        p = inventory.procedures[resolve_id(inventory.procedures, procedure_id, inventory.unlisted_ids)]
        doomed = [*inventory.descendants(p.procedure_id), p]
        alive = [d for d in doomed if d.status in (StoredStatus.UNFINISHED, StoredStatus.ROLLING_BACK)]
        waiting = _parent_not_ended(inventory, p, {d.procedure_id for d in doomed})
        if waiting is not None and not force:
            raise CommandError(
                f"procedure {p.procedure_id} is a subprocedure of {waiting}: it reads this one's end when it goes "
                "on, and without it would run it again. Delete the root once it has ended, or pass --force if no "
                "manager runs on this store",
                ExitCode.REFUSED,
            )
        if alive and not force:
            running = alive[-1] if alive[-1] is p else alive[0]
            which = "is" if running is p else f"has a subprocedure, {running.procedure_id}, that is"
            raise CommandError(
                f"procedure {p.procedure_id} {which} {running.status.value}: a manager may be running it, and "
                "would run on with what it holds in memory. Cancel it first (procstore cancel "
                f"{p.procedure_id}) and delete it once it has ended, or pass --force if no manager runs on this store",
                ExitCode.REFUSED,
            )
        children = f" and its {plural(len(doomed) - 1, 'subprocedure')}" if len(doomed) > 1 else ""
        what = plain(p.type_name or "unreadable procedure")
        _confirm(f"Delete {what} {p.procedure_id} ({p.status.value}){children}?", yes)
        await record_ends(store, doomed)
        for each in doomed:
            await store.delete_procedure(each.procedure_id, everything=True)
    finally:
        await store.store.close()
    ids = ", ".join(str(d.procedure_id) for d in doomed)
    output_console().print(f"deleted {plural(len(doomed), 'procedure')}: {ids}")
    for folder, why in sorted(inventory.unlisted.items()):
        # Its subprocedures there, if any, were not seen: they are left, as orphans.
        error_console().print(
            f"warning: cannot list {folder} ({why}): if it holds a subprocedure of this one, that was not "
            "deleted; fix its permissions",
            markup=False,
        )
