"""`procstore settings`: show, or write, what the store says every manager must keep
(`procstore.store.settings`)."""

from __future__ import annotations

from typing import Any

import click
import msgspec
from rich.table import Table

from procstore._cli.common import open_existing_store, parse_age, run_command, store_options
from procstore._cli.output import chosen_format, emit, output_options, stored
from procstore.store.settings import SettingsStore, StoreSettings


def _age(_ctx: click.Context, _param: click.Parameter, text: str | None) -> float | None:
    return None if text is None else parse_age(text)


@click.command()
@store_options
@click.option(
    "--keep-failed/--no-keep-failed",
    default=None,
    help="Every manager keeps the keys of a root that ends failed (for resume, rewind, a post-mortem).",
)
@click.option(
    "--history-retention", callback=_age, default=None, metavar="AGE", help="Keep history at least this long (30d)."
)
@click.option(
    "--history-max-records", type=click.IntRange(min=1), default=None, help="Keep at least this many records."
)
@click.option(
    "--result-limit",
    type=click.IntRange(min=1),
    default=None,
    metavar="BYTES",
    help="Bytes of a done output history keeps.",
)
@click.option(
    "--unset",
    "unset",
    multiple=True,
    type=click.Choice(["history-retention", "history-max-records", "result-limit"]),
    help="Forget a setting: each manager's own value applies again.",
)
@output_options
@run_command
async def settings(
    url: str,
    storage_options: tuple[str, ...],
    parent_path: str,
    keep_failed: bool | None,
    history_retention: float | None,
    history_max_records: int | None,
    result_limit: int | None,
    unset: tuple[str, ...],
    output: str | None,
    as_json: bool,
) -> None:
    """Show the store's settings, or change them (each option given; the rest stay).

    They guard evidence: every manager reads them at start and keeps what they say on top of
    its own settings (a failed root if either says so, history for the longer retention and
    the larger count), and `result_limit` sizes the output kept in end records. Written to
    `settings.json` under the store's root, with who wrote them and when.
    """
    fmt = chosen_format(storage_options, output, as_json)
    store = await open_existing_store(url, storage_options, parent_path)
    try:
        settings_store = SettingsStore(store.store, store.parent_path)
        current = await settings_store.read()
        changes: dict[str, Any] = {
            name: value
            for name, value in (
                ("keep_failed", keep_failed),
                ("history_retention", history_retention),
                ("history_max_records", history_max_records),
                ("result_limit", result_limit),
            )
            if value is not None
        }
        changes |= {name.replace("-", "_"): None for name in unset}
        if changes:
            try:
                current = await settings_store.write(msgspec.structs.replace(current, **changes))
            except ValueError as e:
                raise click.BadParameter(str(e)) from None
    finally:
        await store.store.close()
    document = msgspec.to_builtins(current)
    emit(fmt, {"settings": document}, lambda: [_table(current)])


def _table(current: StoreSettings) -> Table:
    table = Table("setting", "value", title="store settings (every manager keeps at least this)")
    for name, value in msgspec.to_builtins(current).items():
        # `written_by` and the rest are stored text: anyone who can write the bucket chose them.
        table.add_row(name, "(each manager's own)" if value is None else stored(value))
    return table
