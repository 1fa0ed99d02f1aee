"""`procstore ls` and `procstore tree`: what the store holds, as a table, a tree or data."""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable, Iterable
from typing import Any, Literal, get_args

import click
from rich import box
from rich.console import Console, RenderableType
from rich.progress import BarColumn, MofNCompleteColumn, Progress, SpinnerColumn, TextColumn
from rich.table import Table
from rich.text import Text
from rich.tree import Tree

from procstore._cli.common import (
    CommandError,
    ExitCode,
    closing,
    open_existing_store,
    parse_age,
    resolve_id,
    run_command,
    store_options,
)
from procstore._cli.history import HistoryListing, print_history
from procstore._cli.output import (
    SHORT_ID,
    Format,
    TimeFormat,
    chosen_format,
    emit,
    error_console,
    iso_time,
    output_console,
    output_options,
    plural,
    rows_options,
    short_ids,
    stored,
    table_time,
    time_option,
)
from procstore._client.inventory import Inventory, StoredProcedure, read_inventory, read_outcomes
from procstore._client.words import StatusWord, status_word
from procstore.ids import ProcedureId
from procstore.store.folder import StoredStatus
from procstore.store.procedure_store import ProcedureStore
from procstore.store.state_store import walk_readable

STATUS_STYLE = {
    StoredStatus.UNFINISHED: "yellow",
    StoredStatus.COMMITTED: "green",
    StoredStatus.ROLLING_BACK: "magenta",
    StoredStatus.FAILED: "cyan",
    StoredStatus.UNREADABLE: "bold red",
    StoredStatus.PARENT_CYCLE: "bold red",
}
OUR_FOLDERS = ("lease/", "requests/", "history/", "activity/", "flow/")
"""Folders a manager writes beside `procedure/`: a store holding only these is ours, and empty."""


def _statuses(_ctx: click.Context, _param: click.Parameter, values: tuple[str, ...]) -> set[str]:
    # One spelling in the help; `rolling-back` and `ROLLING_BACK` are read the same, and
    # `committed` (the former name of `done`) as `done`.
    out: set[str] = set()
    for value in values:
        text = value.lower().replace("-", " ").replace("_", " ")
        text = "done" if text == "committed" else text
        if text not in STATUS_WORDS:
            raise click.BadParameter(f"{value!r} is not a status ({', '.join(STATUS_WORDS)})") from None
        out.add(text)
    return out


STATUS_WORDS: tuple[str, ...] = get_args(StatusWord)


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

        inventory = await read_inventory(store, advance)
        await read_outcomes(store, inventory)
        return inventory


def row_json(p: StoredProcedure, inventory: Inventory | None = None) -> dict[str, Any]:
    """One procedure as data; times are ISO 8601 in UTC."""
    return {
        "id": str(p.procedure_id),
        "type": p.type_name,
        "status": inventory.word(p) if inventory is not None else status_word(p.status),
        "step": p.latest.step,
        "parent": None if p.parent_id is None else str(p.parent_id),
        "children": len(p.children),
        "modified": iso_time(p.modified),
        "error": p.error,
        "problem": p.problem,
        "orphan": inventory is not None and inventory.is_orphan(p),
        "pending": None if inventory is None else inventory.pending.get(p.procedure_id),
        "waiting": p.waiting,
    }


def status_text(p: StoredProcedure, inventory: Inventory | None) -> str:
    """The status, `*` when its latest state cannot be read although it finished (see
    `procstore show`), and `orphan` when its parent is not in the store."""
    text: str = inventory.word(p) if inventory is not None else status_word(p.status)
    if p.problem is not None and p.status is not StoredStatus.UNREADABLE and p.status is not StoredStatus.PARENT_CYCLE:
        text += "*"
    if inventory is not None and inventory.is_orphan(p):
        text += " (orphan)"
    if inventory is not None and (kind := inventory.pending.get(p.procedure_id)) is not None:
        text += f" ({kind} pending)"
    return f"[{STATUS_STYLE[p.status]}]{text}[/]"


# Dropped in this order when a table is too wide for the terminal; the id never is.
_DROP_ORDER = ("parent", "ch", "step", "last step")
_TYPE_MIN = 12


def procedures_table(
    procedures: list[StoredProcedure],
    now: float,
    *,
    inventory: Inventory | None = None,
    title: str | None = None,
    wide: bool = False,
    time_format: TimeFormat = "relative",
    headers: bool = True,
    width: int | None = None,
) -> Table:
    """One row per procedure, fitted to `width` columns: ids cut to a unique prefix, then
    columns dropped (parent, children, step, time) and the type cut with an ellipsis until
    it fits. `wide` shows full ids and every column, however wide."""
    known = list(inventory.procedures) if inventory is not None else [p.procedure_id for p in procedures]
    ids = {i: str(i) for i in known} if wide else short_ids(known)
    rows: list[dict[str, str]] = []
    for p in procedures:
        when = table_time(p.modified, time_format, now)
        if wide and time_format == "relative":
            when = f"{iso_time(p.modified)} ({when})"
        parent = "" if p.parent_id is None else ids.get(p.parent_id) or str(p.parent_id)[: 36 if wide else SHORT_ID]
        rows.append({
            "id": ids.get(p.procedure_id, str(p.procedure_id)), "type": stored(p.type_name or "?"),
            "status": status_text(p, inventory), "step": str(p.latest.step), "parent": parent,
            "ch": str(len(p.children)) if p.children else "", "last step": when,
        })  # fmt: skip
    columns = ["id", "type", "status", "step", "parent", "ch", "last step"]
    natural = {c: max([len(c), *(len(Text.from_markup(r[c]).plain) for r in rows)]) for c in columns}
    type_width: int | None = None
    if not wide and width is not None:
        # Between two columns: a padding space, the divider and another padding space.
        def others() -> int:
            return sum(natural[c] for c in columns if c != "type") + 3 * (len(columns) - 1)

        for dropped in _DROP_ORDER:
            if others() + min(natural["type"], _TYPE_MIN) <= width:
                break
            columns.remove(dropped)
        type_width = max(_TYPE_MIN, width - others())
    table = Table(
        title=title, title_justify="left", show_header=headers, box=box.SIMPLE_HEAD, pad_edge=False, show_edge=False
    )
    for column in columns:
        if column == "type":
            table.add_column(column, no_wrap=not wide, overflow="ellipsis", max_width=type_width)
        else:
            justify: Literal["left", "right"] = "right" if column in ("step", "ch") else "left"
            table.add_column(column, no_wrap=True, justify=justify, min_width=natural[column])
    for row in rows:
        table.add_row(*(row[c] for c in columns))
    return table


_SORT_KEYS: dict[str, Callable[[StoredProcedure], Any]] = {
    "time": lambda p: (p.modified or 0.0, str(p.procedure_id)),
    "id": lambda p: str(p.procedure_id),
    "type": lambda p: (p.type_name or "", str(p.procedure_id)),
    "status": lambda p: (p.status.value, str(p.procedure_id)),
    "step": lambda p: (p.latest.step, str(p.procedure_id)),
}


def select(
    inventory: Inventory,
    type_name: str | None,
    statuses: Iterable[str],
    older: float | None,
    newer: float | None,
    sort: str = "time",
) -> list[StoredProcedure]:
    now = time.time()
    wanted = set(statuses)
    out = []
    for p in inventory.procedures.values():
        age = None if p.modified is None else now - p.modified
        if type_name is not None and p.type_name != type_name:
            continue
        if wanted and inventory.word(p) not in wanted:
            continue
        if older is not None and (age is None or age < older):
            continue
        if newer is not None and (age is None or age > newer):
            continue
        out.append(p)
    return sorted(out, key=_SORT_KEYS[sort])


def inventory_warnings(inventory: Inventory) -> list[str]:
    unlisted = [
        f"cannot list {folder} ({why}): what it holds is not shown; fix its permissions"
        for folder, why in sorted(inventory.unlisted.items())
    ]
    return [*unlisted, *(f"not a procedure key, ignored: {key}" for key in inventory.other_keys)]


async def check_not_misplaced(store: ProcedureStore, inventory: Inventory) -> None:
    """An empty listing of a folder that holds other things is most likely a wrong prefix."""
    if inventory.procedures or inventory.other_keys or inventory.unlisted:
        return
    # A folder of the user's beside ours that cannot be read (`lost+found`, say) is left out.
    listed = await walk_readable(store.store, store.parent_path)
    around = [k for k in listed if not k[len(store.parent_path) :].startswith(OUR_FOLDERS)]
    if around:
        raise CommandError(
            f"no {store.proc_path} in {store.store.url} but {plural(len(around), 'other key')} "
            f"(such as {around[0]}): a wrong prefix, or a store under --parent-path?",
            ExitCode.NOT_FOUND,
        )


@click.command("ls")
@store_options
@click.option("--type", "type_name", help="Only procedures of this type_name.")
@click.option(
    "--status",
    "statuses",
    multiple=True,
    callback=_statuses,
    metavar="STATUS",
    help="Only these statuses (repeatable): " + ", ".join(get_args(StatusWord)) + ".",
)
@click.option("--older-than", callback=lambda _c, _p, v: parse_age(v) if v else None, help="Last step older than (7d).")
@click.option("--newer-than", callback=lambda _c, _p, v: parse_age(v) if v else None, help="Last step newer than.")
@rows_options(_SORT_KEYS)
@click.option(
    "--history",
    "ended",
    is_flag=True,
    help="Ended procedures instead (managers with history=...): the options above apply to their type, "
    "end time, outcome (--sort status) and steps; --status does not.",
)
@time_option
@output_options
@run_command
async def ls(
    url: str,
    storage_options: tuple[str, ...],
    parent_path: str,
    type_name: str | None,
    statuses: set[str],
    older_than: float | None,
    newer_than: float | None,
    sort: str,
    reverse: bool,
    limit: int | None,
    wide: bool,
    no_headers: bool,
    ended: bool,
    time_format: TimeFormat,
    output: str | None,
    as_json: bool,
) -> None:
    """One row per procedure: id, type, status, step, parent, children, time of the last step.

    Ids are shortened to a unique prefix (any command takes it back); --wide shows them
    whole. A status marked `*` finished, but its last state cannot be read (`procstore
    show` says why); `(orphan)` marks a procedure whose parent is not in the store: nothing
    will run it. Warnings go to stderr (and into -o json as "warnings").
    """
    fmt: Format = chosen_format(storage_options, output, as_json)
    store = await open_existing_store(url, storage_options, parent_path)
    if ended:
        if statuses:
            raise click.UsageError(
                "--status filters stored procedures: `procstore history --outcome` filters ended ones"
            )
        listing = HistoryListing(
            type_name, older_than, newer_than, sort, reverse, limit, wide, not no_headers, time_format
        )
        await closing(store, print_history(store, fmt, listing))
        return

    async def read() -> Inventory:
        inventory = await load_inventory(store, error_console())
        await check_not_misplaced(store, inventory)
        return inventory

    inventory = await closing(store, read())
    chosen = select(inventory, type_name, statuses, older_than, newer_than, sort)
    if reverse:
        chosen.reverse()
    if limit is not None:
        chosen = chosen[:limit]
    now = time.time()

    def table() -> list[RenderableType]:
        rows: list[RenderableType] = [
            procedures_table(
                chosen,
                now,
                inventory=inventory,
                wide=wide,
                time_format=time_format,
                headers=not no_headers,
                width=output_console().width,
            )
        ]
        if not no_headers:
            counts: Counter[str] = Counter(inventory.word(p) for p in chosen)
            summary = ", ".join(f"{counts[w]} {w}" for w in STATUS_WORDS if counts[w])
            rows.append(f"{plural(len(chosen), 'procedure')}{': ' + summary if summary else ''}")
        return rows

    document = {"procedures": [row_json(p, inventory) for p in chosen]}
    emit(fmt, document, table, rows="procedures", warnings=inventory_warnings(inventory), wide=wide)


TREE_DEPTH = 20
"""Levels `tree` nests (in a table and in JSON); below, it says how many descendants it left
out, and `procstore tree URL ID` of the last one shown goes on from there. A chain thousands
deep (a corrupt or hostile store) stays one screen, and inside JSON's nesting limits."""


def _not_shown(inventory: Inventory, p: StoredProcedure, shown: frozenset[ProcedureId]) -> int | None:
    """How many descendants of `p` the tree leaves out at this depth (None: it goes on)."""
    return len(inventory.descendants(p.procedure_id)) if len(shown) >= TREE_DEPTH and p.children else None


def _node(inventory: Inventory, p: StoredProcedure, shown: frozenset[ProcedureId] = frozenset()) -> dict[str, Any]:
    node = row_json(p, inventory)
    if (left_out := _not_shown(inventory, p, shown)) is not None:
        node["children"], node["descendants_not_shown"] = [], left_out
        return node
    node["children"] = [] if p.procedure_id in shown else [
        _node(inventory, inventory.procedures[c], shown | {p.procedure_id}) for c in p.children
    ]  # fmt: skip
    return node


@click.command()
@store_options
@click.argument("procedure_id", required=False)
@output_options
@run_command
async def tree(
    url: str,
    storage_options: tuple[str, ...],
    parent_path: str,
    procedure_id: str | None,
    output: str | None,
    as_json: bool,
) -> None:
    """Parents and their children: the whole store, or one procedure's tree.

    For a subprocedure, its ancestors are shown above it, from the root down.
    """
    fmt: Format = chosen_format(storage_options, output, as_json)
    store = await open_existing_store(url, storage_options, parent_path)
    inventory = await closing(store, load_inventory(store, error_console()))
    ancestors: list[StoredProcedure] = []
    if procedure_id is not None:
        chosen = inventory.procedures[resolve_id(inventory.procedures, procedure_id, inventory.unlisted_ids)]
        roots = [chosen]
        ancestors = list(reversed(inventory.ancestors(chosen)))
    else:
        roots = sorted(inventory.roots(), key=lambda p: (p.modified or 0.0, str(p.procedure_id)))
    ids = short_ids(list(inventory.procedures))

    def table() -> list[RenderableType]:
        top = Tree(f"{store.store.url}{store.proc_path}", guide_style="dim")
        at = top
        if len(ancestors) > TREE_DEPTH:
            at = at.add(f"[dim]... {plural(len(ancestors) - TREE_DEPTH, 'more ancestor')}[/]")
        for ancestor in ancestors[-TREE_DEPTH:]:
            at = at.add(f"{_label(inventory, ancestor, ids)} [dim](ancestor)[/]")
        for root in roots:
            _add_branch(at, inventory, root, ids)
        return [top]

    document = {
        "ancestors": [row_json(a, inventory) for a in ancestors],
        "procedures": [_node(inventory, r) for r in roots],
    }
    emit(fmt, document, table, rows="procedures", warnings=inventory_warnings(inventory))


def _label(inventory: Inventory, p: StoredProcedure, ids: dict[ProcedureId, str]) -> str:
    label = (
        f"{ids[p.procedure_id]} [bold]{stored(p.type_name or '?')}[/] {status_text(p, inventory)} step {p.latest.step}"
    )
    if inventory.is_orphan(p):
        label += f" [bold red](its parent {p.parent_id} is not in the store: nothing runs it)[/]"
    return label


def _add_branch(
    parent: Tree,
    inventory: Inventory,
    p: StoredProcedure,
    ids: dict[ProcedureId, str],
    shown: frozenset[ProcedureId] = frozenset(),
) -> None:
    label = _label(inventory, p, ids)
    if p.procedure_id in shown:  # parent links that loop back: show the loop once, not forever
        parent.add(f"{label} [bold red](the cycle closes here)[/]")
        return
    branch = parent.add(label)
    if (left_out := _not_shown(inventory, p, shown)) is not None:
        branch.add(f"[dim]... {plural(left_out, 'more descendant')}: `procstore tree URL {p.procedure_id}`[/]")
        return
    for child_id in p.children:
        _add_branch(branch, inventory, inventory.procedures[child_id], ids, shown | {p.procedure_id})
