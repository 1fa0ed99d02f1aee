"""History records in the CLI: `procstore ls --history` and `procstore show` of an ended id."""

from __future__ import annotations

import click
import msgspec
from rich.console import RenderableType
from rich.table import Table

from procstore._cli.common import CommandError, ExitCode
from procstore._cli.output import Format, emit, output_console, plural
from procstore.store import ProcedureStore
from procstore.store.history import HistoryStore

_FIELDS = ("id", "type_name", "outcome", "steps", "retries", "parent_id", "started_at", "ended_at", "error")


def history_of(store: ProcedureStore) -> HistoryStore:
    return HistoryStore(store.store, store.parent_path)


async def print_history(store: ProcedureStore, fmt: Format) -> None:
    """Every record, oldest first: a table, one document (`json`, `yaml`) or one record per line (`jsonl`)."""
    records = await history_of(store).list()

    def table() -> list[RenderableType]:
        out = Table(box=None, pad_edge=False)
        for name in ("id", "type", "outcome", "steps", "retries", "ended (UTC)", "error"):
            out.add_column(name, overflow="fold")
        for r in records:
            out.add_row(
                r.id, r.type_name, r.outcome, str(r.steps), str(r.retries), r.ended_at[:19], (r.error or "")[:80]
            )
        return [out, f"{plural(len(records), 'ended procedure')} in the history"]

    emit(fmt, {"history": [msgspec.to_builtins(r) for r in records]}, table, rows="history")


async def show_ended(store: ProcedureStore, text: str, as_json: bool) -> None:
    """The newest record of an id no longer in the store (the full id, or a unique prefix)."""
    history = history_of(store)
    ids = await history.recorded_ids()
    matches = sorted(i for i in ids if i.startswith(text.lower())) if len(text) >= 4 else []
    if len(matches) != 1:
        found = "matches several ended procedures" if matches else "is neither in the store nor in its history"
        raise CommandError(f"{text!r} {found} (`procstore ls URL --history` lists them)", ExitCode.NOT_FOUND)
    record = await history.find(matches[0])
    if record is None:
        raise CommandError(f"the history record of {matches[0]} cannot be read", ExitCode.UNREADABLE)
    if as_json:
        click.echo(msgspec.json.encode(record).decode())
        return
    console = output_console()
    console.print(f"[bold]{record.id}[/] ended: its keys are gone, this is its history record")
    for name in _FIELDS[1:]:
        console.print(f"  {name:<11} {getattr(record, name)}")
