"""`procstore watch`: the procedures as they change, on a terminal, into a file or a pipe."""

from __future__ import annotations

import asyncio
import sys
import time
from typing import Any

import click
import orjson
from rich.console import Group
from rich.live import Live
from rich.text import Text

from procstore._cli.common import interrupt_ends, open_existing_store, run_command, store_options
from procstore._cli.listing import procedures_table, row_json
from procstore._cli.output import (
    Format,
    TimeFormat,
    chosen_format,
    emit,
    iso_time,
    output_console,
    output_options,
    plural,
    time_option,
)
from procstore._client.inventory import Inventory, read_inventory, read_outcomes


def _changes(seen: dict[str, dict[str, Any]], inventory: Inventory, now: float) -> list[dict[str, Any]]:
    """What differs from the last listing: new, changed (status or step) and gone procedures."""
    current = {str(p.procedure_id): row_json(p, inventory) for p in inventory.procedures.values()}
    out: list[dict[str, Any]] = []
    for pid, row in current.items():
        before = seen.get(pid)
        if before is None or (before["status"], before["step"]) != (row["status"], row["step"]):
            out.append({"at": iso_time(now), "change": "new" if before is None else "changed", **row})
    out += [{"at": iso_time(now), "change": "gone", "id": pid} for pid in seen.keys() - current.keys()]
    seen.clear()
    seen.update(current)
    return out


@click.command()
@store_options
@click.option(
    "--interval", type=click.FloatRange(0.2), default=2.0, show_default=True, help="Seconds between listings."
)
@click.option("--count", type=click.IntRange(1), default=None, help="Stop after this many listings (default: Ctrl-C).")
@time_option
@output_options
@interrupt_ends
@run_command
async def watch(
    url: str,
    storage_options: tuple[str, ...],
    parent_path: str,
    interval: float,
    count: int | None,
    time_format: TimeFormat,
    output: str | None,
    as_json: bool,
) -> None:
    """The procedures, re-listed every INTERVAL seconds; changed rows are marked.

    On a terminal the table is redrawn in place. Into a file or a pipe each listing is
    appended as a frame; with -o jsonl (or --json), each change (new, changed, gone) is one
    JSON line, as it is seen; -o json and -o yaml print one document, {"changes": [...]},
    when watching ends (--count, or Ctrl-C). Object stores have no change feed, so this polls: each listing is one list
    request plus a read of each procedure's latest key.
    """
    fmt: Format = chosen_format(storage_options, output, as_json)
    store = await open_existing_store(url, storage_options, parent_path)
    console = output_console()
    seen: dict[str, dict[str, Any]] = {}
    collected: list[dict[str, Any]] = []
    live = Live(console=console, auto_refresh=False) if fmt == "table" and console.is_terminal else None
    try:
        if live is not None:
            live.start()
        for n in range(count or sys.maxsize):
            if n:
                await asyncio.sleep(interval)
            inventory = await read_inventory(store)
            await read_outcomes(store, inventory)  # the words of `ls`: `rolled back`, `cancelled`
            now = time.time()
            first = not seen
            changes = _changes(seen, inventory, now)
            if fmt == "jsonl":
                for change in changes:
                    sys.stdout.write(orjson.dumps(change).decode() + "\n")
                sys.stdout.flush()
                continue
            if fmt != "table":
                collected += changes
                continue
            procedures = sorted(inventory.procedures.values(), key=lambda p: (p.modified or 0.0, str(p.procedure_id)))
            title = f"{store.store.url}{store.proc_path} at {iso_time(now)}: {plural(len(procedures), 'procedure')}"
            if not first:
                title += f", {plural(len(changes), 'change')} since the last listing"
            # The header is a line of its own, not the table's title: that one wraps at the
            # table's width, so `head -1` of a piped frame would cut it (the time included).
            table = procedures_table(procedures, now, inventory=inventory, time_format=time_format, width=console.width)
            changed = {c["id"] for c in changes} if not first else set()
            for i, p in enumerate(procedures):
                if str(p.procedure_id) in changed:
                    table.rows[i].style = "reverse"
            if live is not None:
                live.update(Group(Text(title), table), refresh=True)
            else:
                console.print(title, soft_wrap=True, highlight=False, markup=False)
                console.print(table)
    finally:
        if live is not None:
            live.stop()
        await store.store.close()
        if fmt in ("json", "yaml") and not isinstance(sys.exc_info()[1], Exception):  # at the end, or on Ctrl-C
            emit(fmt, {"changes": collected}, list, rows="changes")
