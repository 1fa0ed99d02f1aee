"""`procstore ls`, `procstore tree` and `procstore watch`: what the store holds, now and as it changes."""

from __future__ import annotations

import asyncio
import sys
import time
from typing import Any

import click
import orjson
from rich.console import Console
from rich.live import Live
from rich.progress import BarColumn, MofNCompleteColumn, Progress, SpinnerColumn, TextColumn
from rich.table import Table
from rich.tree import Tree

from procstore.cli.common import (
    closing,
    format_age,
    format_time,
    open_existing_store,
    output_console,
    parse_age,
    resolve_id,
    run_command,
    store_options,
)
from procstore.cli.history import print_history
from procstore.ids import ProcedureId
from procstore.store import ProcedureStore
from procstore.store.inventory import Inventory, StoredProcedure, StoredStatus, read_inventory

_STATUS_STYLE = {
    StoredStatus.UNFINISHED: "yellow",
    StoredStatus.COMMITTED: "green",
    StoredStatus.ROLLING_BACK: "magenta",
    StoredStatus.ROLLED_BACK: "cyan",
    StoredStatus.UNREADABLE: "bold red",
    StoredStatus.PARENT_CYCLE: "bold red",
}
STATUS_CHOICE = click.Choice([s.value for s in StoredStatus] + ["rolling-back"])


async def load_inventory(store: ProcedureStore, console: Console) -> Inventory:
    """Read the inventory, with a progress bar on stderr once it takes more than a moment."""
    progress = Progress(
        SpinnerColumn(), TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
        console=console, transient=True, disable=not console.is_terminal,
    )  # fmt: skip
    with progress:
        task = progress.add_task("listing keys", total=None)

        def advance(done: int, total: int) -> None:
            progress.update(task, description="reading procedures", completed=done, total=total)

        return await read_inventory(store, advance)


def row_json(p: StoredProcedure) -> dict[str, Any]:
    return {
        "id": str(p.procedure_id),
        "type": p.type_name,
        "status": p.status.value,
        "step": p.latest.step,
        "parent": None if p.parent_id is None else str(p.parent_id),
        "children": len(p.children),
        "modified": p.modified,
        "error": p.error,
        "problem": p.problem,
    }


def procedures_table(procedures: list[StoredProcedure], now: float, title: str | None = None) -> Table:
    table = Table(title=title, title_justify="left")
    for column in ("id", "type", "status", "step", "parent", "children", "last step"):
        table.add_column(column, no_wrap=column in ("id", "parent"), justify="right" if column == "step" else "left")
    for p in procedures:
        status = p.status.value if p.problem is None or p.status is StoredStatus.UNREADABLE else f"{p.status.value}*"
        table.add_row(
            str(p.procedure_id),
            p.type_name or "?",
            f"[{_STATUS_STYLE[p.status]}]{status}[/]",
            str(p.latest.step),
            str(p.parent_id) if p.parent_id else "",
            str(len(p.children)) if p.children else "",
            f"{format_time(p.modified)} ({format_age(p.modified, now)})",
        )
    return table


def select(
    inventory: Inventory, type_name: str | None, statuses: tuple[str, ...], older: float | None, newer: float | None
) -> list[StoredProcedure]:
    now = time.time()
    wanted = {StoredStatus(s.replace("-", " ")) for s in statuses}
    out = []
    for p in inventory.procedures.values():
        age = None if p.modified is None else now - p.modified
        if type_name is not None and p.type_name != type_name:
            continue
        if wanted and p.status not in wanted:
            continue
        if older is not None and (age is None or age < older):
            continue
        if newer is not None and (age is None or age > newer):
            continue
        out.append(p)
    return sorted(out, key=lambda p: (p.modified or 0.0, str(p.procedure_id)))


@click.command("ls")
@store_options
@click.option("--type", "type_name", help="Only procedures of this type_name.")
@click.option("--status", "statuses", multiple=True, type=STATUS_CHOICE, help="Only these statuses (repeatable).")
@click.option(
    "--older-than", callback=lambda _c, _p, v: parse_age(v) if v else None, help="Last step older than (7d, 12h)."
)
@click.option("--newer-than", callback=lambda _c, _p, v: parse_age(v) if v else None, help="Last step newer than.")
@click.option("--json", "as_json", is_flag=True, help="One JSON object per line, for scripts.")
@click.option("--history", "ended", is_flag=True, help="Ended procedures instead (managers with history=...).")
@run_command
async def ls(
    url: str,
    storage_options: tuple[str, ...],
    parent_path: str,
    type_name: str | None,
    statuses: tuple[str, ...],
    older_than: float | None,
    newer_than: float | None,
    as_json: bool,
    ended: bool,
) -> None:
    """One row per procedure: id, type, status, step, parent, children, time of the last step.

    A status with `*` has a problem with an older value (see `procstore show`).
    """
    store = await open_existing_store(url, storage_options, parent_path)
    if ended:
        await closing(store, print_history(store, as_json))
        return
    inventory = await closing(store, load_inventory(store, Console(stderr=True)))
    chosen = select(inventory, type_name, statuses, older_than, newer_than)
    if as_json:
        for p in chosen:
            sys.stdout.write(orjson.dumps(row_json(p)).decode() + "\n")
        return
    console = output_console()
    console.print(procedures_table(chosen, time.time()))
    counts = {s: sum(p.status is s for p in chosen) for s in StoredStatus}
    summary = ", ".join(f"{n} {s.value}" for s, n in counts.items() if n)
    console.print(f"{len(chosen)} procedures{': ' + summary if summary else ''}")
    for key in inventory.other_keys[:5]:
        console.print(f"[dim]not a procedure key, ignored: {key}[/]")


@click.command()
@store_options
@click.argument("procedure_id", required=False)
@run_command
async def tree(url: str, storage_options: tuple[str, ...], parent_path: str, procedure_id: str | None) -> None:
    """Parents and their children (the whole store, or the tree of one procedure)."""
    store = await open_existing_store(url, storage_options, parent_path)
    inventory = await closing(store, load_inventory(store, Console(stderr=True)))
    if procedure_id is not None:
        roots = [inventory.procedures[resolve_id(inventory.procedures, procedure_id)]]
    else:
        roots = sorted(inventory.roots(), key=lambda p: (p.modified or 0.0, str(p.procedure_id)))
    top = Tree(f"{store.store.url}{store.proc_path}", guide_style="dim")
    for root in roots:
        _add_branch(top, inventory, root)
    output_console().print(top)


def _add_branch(
    parent: Tree, inventory: Inventory, p: StoredProcedure, shown: frozenset[ProcedureId] = frozenset()
) -> None:
    status = f"[{_STATUS_STYLE[p.status]}]{p.status.value}[/]"
    label = f"{p.procedure_id} [bold]{p.type_name or '?'}[/] {status} step {p.latest.step}"
    if p.procedure_id in shown:  # parent links that loop back: show the loop once, not forever
        parent.add(f"{label} [bold red](the cycle closes here)[/]")
        return
    branch = parent.add(label)
    for child_id in p.children:
        _add_branch(branch, inventory, inventory.procedures[child_id], shown | {p.procedure_id})


@click.command()
@store_options
@click.option(
    "--interval", type=click.FloatRange(0.2), default=2.0, show_default=True, help="Seconds between listings."
)
@click.option("--count", type=click.IntRange(1), default=None, help="Stop after this many listings (default: Ctrl-C).")
@run_command
async def watch(
    url: str, storage_options: tuple[str, ...], parent_path: str, interval: float, count: int | None
) -> None:
    """A live view of the procedures, re-listed every INTERVAL seconds; changed rows are marked.

    Object stores have no change feed, so this polls: each refresh is one listing plus a read
    of each procedure's latest key.
    """
    store = await open_existing_store(url, storage_options, parent_path)
    console = output_console()
    seen: dict[str, tuple[str, int]] = {}
    try:
        with Live(console=console, auto_refresh=False) as live:
            n = 0
            while count is None or n < count:
                inventory = await read_inventory(store)
                procedures = sorted(
                    inventory.procedures.values(), key=lambda p: (p.modified or 0.0, str(p.procedure_id))
                )
                current = {str(p.procedure_id): (p.status.value, p.latest.step) for p in procedures}
                changed = {pid for pid, state in current.items() if seen and seen.get(pid) != state}
                gone = len(set(seen) - set(current))
                title = (
                    f"{store.store.url}{store.proc_path} at {format_time(time.time())}: {len(procedures)} procedures"
                )
                title += f", {len(changed)} changed, {gone} gone since the last listing" if seen else ""
                table = procedures_table(procedures, time.time(), title)
                for i, p in enumerate(procedures):
                    if str(p.procedure_id) in changed:
                        table.rows[i].style = "reverse"
                live.update(table, refresh=True)
                seen = current
                n += 1
                if count is None or n < count:
                    await asyncio.sleep(interval)
    finally:
        await store.store.close()
