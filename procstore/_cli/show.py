"""`procstore show URL ID`: every stored step of one procedure, decoded, with what changed."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

import click
import msgspec
import orjson
from rich.console import Group, RenderableType
from rich.panel import Panel
from rich.table import Table

from procstore._cli.common import (
    CommandError,
    ExitCode,
    closing,
    listed_procedures,
    open_existing_store,
    resolve_id,
    run_command,
    store_options,
)
from procstore._cli.history import action_text, ended_record, record_json, record_lines
from procstore._cli.listing import STATUS_STYLE
from procstore._cli.output import chosen_format, emit, iso_time, nested, output_options, plural, stored
from procstore._client.client import Client
from procstore._client.inventory import ENDINGS, endings, read_history
from procstore._client.status import ProcedureStatus, from_record
from procstore._client.words import status_word
from procstore._text import TEXT_LIMIT, bounded, cut_text
from procstore.errors import ProcedureError
from procstore.ids import ProcedureId
from procstore.store.folder import StoredStatus
from procstore.store.message import ProcedureMessage, StepWait

FIELDS_SHOWN = 200
"""Fields of one step's data `show` and the web page list; `-o json` has the whole value."""
ELEMENTS_SHOWN = 20
"""Elements of one JSON array listed as fields; the rest are counted."""


@dataclass(frozen=True, slots=True)
class NotShown:
    """In place of the fields a bounded listing leaves out."""

    count: int
    what: str

    def __str__(self) -> str:
        return f"… {plural(self.count, 'more ' + self.what)} (`procstore show -o json` has them all)"


def flatten(
    value: Any,
    path: str = "",
    limit: int | None = FIELDS_SHOWN,
    elements: int | None = ELEMENTS_SHOWN,
    names: int | None = TEXT_LIMIT,
    budget: int | None = None,
) -> dict[str, Any]:
    """Nested JSON as `{"a.b[0].c": leaf}`: a state machine's context and state become fields.

    Bounded, as a value may be hostile or just large: an array lists its first `elements`
    elements then `NotShown`, and at most `limit` fields come out, then a `NotShown` (None:
    all of them, for an output that has every value whole). A loop, not a recursion: orjson
    reads values nested up to 1,024 deep, deeper than Python's recursion goes.

    A field's name is its path, and a path repeats every key above it: one long key over
    many fields would be copied once per field. So a path longer than `names` characters
    (None: no limit) is never made whole: its name is its first characters and how many
    more there are (as `bounded` cuts text), `names` in all, and `budget` (None: none) caps
    the characters of all names together, then a `NotShown`: the work is linear in the value."""
    out: dict[str, Any] = {}
    repeats: dict[str, int] = {}
    spent = 0
    # Each level: its path's first `names` characters and its length, its members (the
    # segment each adds to the path, its value) and the index of the next; innermost last.
    levels: list[tuple[str, int, list[tuple[str, Any]], int]] = [("", 0, [(path, value)], 0)]
    while levels:
        where, length, members, at = levels[-1]
        if at == len(members):
            levels.pop()
            continue
        if (limit is not None and len(out) >= limit) or (budget is not None and spent > budget):
            left = sum(len(m) - i for _, _, m, i in levels)
            out["…"] = NotShown(left, "fields or groups of fields")
            break
        levels[-1] = (where, length, members, at + 1)
        segment, item = members[at]
        if names is None:
            prefix, size = where + segment, length + len(segment)
        else:  # never made whole: its first characters, and how long it is
            head = names - _SAYS_HOW_MANY_MORE  # with what `cut_text` adds, at most `names`
            prefix = where if length >= head else (where + segment[: head - length])
            size = length + len(segment)
        spent += len(prefix)
        if isinstance(item, dict) and item:
            dot = "." if size else ""
            levels.append((prefix, size, [(f"{dot}{key}", inner) for key, inner in item.items()], 0))
        elif isinstance(item, list) and item:
            shown: list[tuple[str, Any]] = [(f"[{i}]", inner) for i, inner in enumerate(item[:elements])]
            if elements is not None and len(item) > elements:
                shown.append(("[…]", NotShown(len(item) - elements, "elements")))
            levels.append((prefix, size, shown, 0))
        else:
            out[_unused(cut_text(prefix, size) or "(value)", out, repeats)] = item
    return out


_SAYS_HOW_MANY_MORE = 40
"""Characters `cut_text` adds at most (`… {n} more characters`): a cut name stays within
`names`, so that a view bounding it to as many shows it whole, its count right."""


def _unused(name: str, out: dict[str, Any], repeats: dict[str, int]) -> str:
    """`name`, or `name (2)`, `name (3)`... if fields hold it already: two paths may read
    alike (`{"a.b": 1, "a": {"b": 2}}`, or two long ones cut alike), and each is a field.
    `repeats` keeps the next number of each name, so many alike cost one look each."""
    if name not in out:
        return name
    n = repeats.get(name, 2)
    while f"{name} ({n})" in out:
        n += 1
    repeats[name] = n + 1
    return f"{name} ({n})"


WHOLE_NAME_TEXT = 16
"""Characters of field names `data_fields(whole=True)` makes per character of the data (and
4,096 more): a usual state's names are a few times its size, and a value shaped to name
many fields by one long path stops there (`names_cut` says so; its data is whole as stored)."""


def data_fields(message: ProcedureMessage, *, whole: bool = False) -> dict[str, Any] | None:
    """The message's `data` as fields if it is JSON (it usually is), else None; `whole`:
    every field and element, named by whole paths, up to `WHOLE_NAME_TEXT`."""
    try:
        if whole:
            budget = WHOLE_NAME_TEXT * len(message.data) + 4096
            return flatten(orjson.loads(message.data), limit=None, elements=None, names=None, budget=budget)
        return flatten(orjson.loads(message.data))
    except orjson.JSONDecodeError:
        return None


def names_cut(fields: dict[str, Any]) -> bool:
    """Whether `flatten` stopped before the last field (`limit` or `budget`)."""
    return isinstance(fields.get("…"), NotShown)


def field_changes(
    fields: dict[str, Any], previous: dict[str, Any] | None, *, whole: bool = False
) -> list[tuple[str, str, str]]:
    """(mark, field, value as JSON, cut to `TEXT_LIMIT` unless `whole`) for each field: `*`
    changed since `previous`, `-` removed."""
    rows = []
    for name, value in fields.items():
        changed = previous is not None and (name not in previous or previous[name] != value)
        text = str(value) if isinstance(value, NotShown) else orjson.dumps(value).decode()
        shown = text if whole else bounded(text)
        rows.append(("*" if changed else "", name, shown))
    if previous is not None:
        rows += [("-", name, "(removed)") for name in previous.keys() - fields.keys()]
    return rows


def _fields_table(fields: dict[str, Any], previous: dict[str, Any] | None) -> Table:
    table = Table(show_header=True, box=None, pad_edge=False)
    table.add_column("", width=1)
    table.add_column("field", style="cyan")
    table.add_column("value")
    for mark, name, value in field_changes(fields, previous):
        if mark == "-":
            table.add_row("[bold yellow]-[/]", f"[strike]{stored(name)}[/]", stored(value))
        else:
            table.add_row("[bold yellow]*[/]" if mark else "", stored(name), stored(value))
    return table


def _entry(history: list[Any], index: int, ended: StoredStatus | None) -> dict[str, Any]:
    key, modified, message, problem = history[index]
    entry: dict[str, Any] = {"key": str(key), "step": key.step, "kind": key.key_type.value,
                             "modified": iso_time(modified), "problem": problem, "message": None}  # fmt: skip
    if ended is not None:
        entry["ended"] = status_word(ended)
    if message is not None:
        entry["message"] = {"type_name": message.type_name, "data": nested(message.data),
                            "parent_id": message.parent_id and str(message.parent_id),
                            "step": message.step, "error": message.error, "wake_at": message.wake_at,
                            "signal": message.signal, "consumed": list(message.consumed)}  # fmt: skip
    return entry


def _panels(history: list[Any]) -> list[RenderableType]:
    panels: list[RenderableType] = []
    previous: dict[str, Any] | None = None
    for (key, modified, message, problem), ended in zip(history, endings(history), strict=True):
        title = f"step {key.step} {key.key_type.value}, {iso_time(modified) or '-'}"
        if ended is not None:
            color = STATUS_STYLE[ended]
            panels.append(Panel(f"[{color}]{ENDINGS[ended]}[/]", title=title, title_align="left"))
            continue
        if message is None:
            panels.append(
                Panel(f"[dim]{key}[/]\n[bold red]unreadable:[/] {stored(problem)}", title=title, title_align="left")
            )
            continue
        parts: list[Any] = [
            f"type [bold]{stored(message.type_name)}[/]"
            + (f", parent {message.parent_id}" if message.parent_id else "")
        ]
        if message.error is not None:
            parts.append(f"[bold red]error:[/] {stored(message.error)}")
        if (wait := StepWait.of(message)).waits:
            parts.append(f"[bold cyan]then:[/] {stored(wait.describe())}")
        fields = data_fields(message)
        parts.append(_fields_table(fields, previous) if fields is not None else f"data: {stored(repr(message.data))}")
        previous = fields
        panels.append(Panel(Group(*parts), title=title, title_align="left"))
    return panels


def status_json(status: ProcedureStatus) -> dict[str, Any]:
    """What `Client.get` says of the procedure, as data (times ISO 8601 in UTC)."""
    return {
        "status": status.status,
        "run": status.run,
        "step": status.step,
        "started_at": _iso(status.started_at),
        "ended_at": _iso(status.ended_at),
        "updated_at": _iso(status.updated_at),
        "duration": status.duration,
        "error": status.error,
        "doing": status.doing,
        "started": None if status.started is None else msgspec.to_builtins(status.started),
        "pending": None if status.pending is None else msgspec.to_builtins(status.pending),
    }


def _iso(moment: datetime | None) -> str | None:
    return None if moment is None else iso_time(moment.timestamp())


def status_line(status: ProcedureStatus) -> str:
    """`unfinished, run 2 (resume by ops@host: why), step 4, for 12s; pending: cancel by …`."""
    parts = [f"[bold]{stored(status.status)}[/]", f"run {status.run}"]
    if status.started is not None and status.started.kind != "submit":
        parts[-1] += f" ({stored(action_text(status.started))})"
    if status.step is not None:
        parts.append(f"step {status.step}")
    if status.duration is not None:
        parts.append(f"{'took' if status.is_ended else 'for'} {status.duration:.1f}s")
    line = ", ".join(parts)
    if status.pending is not None:
        line += f"; [bold yellow]pending:[/] {stored(action_text(status.pending))}"
    return line


@click.command()
@store_options
@click.argument("procedure_id")
@output_options
@run_command
async def show(
    url: str, storage_options: tuple[str, ...], parent_path: str, procedure_id: str, output: str | None, as_json: bool
) -> None:
    """Every stored step of one procedure (ID or a unique prefix of it), oldest first.

    Fields that changed since the previous step are marked with `*`. For an id no longer in
    the store, its history record (managers with history=...). Exits with code 5 if a value
    cannot be decoded (it is shown as such and left untouched).
    """
    fmt = chosen_format(storage_options, output, as_json)
    store = await open_existing_store(url, storage_options, parent_path)

    async def read() -> tuple[ProcedureId, ProcedureStatus | None, Any] | None:
        # A listing is enough to resolve the id; reading every procedure would not be.
        listed, unlisted = await listed_procedures(store)
        if not any(str(p).startswith(procedure_id.lower()) for p in [*listed.steps, *unlisted]):
            # Ended and deleted: its history record, if managers keep history.
            key_id, ended = await ended_record(store, procedure_id)
            pid = ProcedureId.parse_canonical(key_id)  # None: a record of an earlier release
            said = None if pid is None else status_json(from_record(pid, ended))
            # A live id's document, no key left, and the record itself.
            document: dict[str, Any] = {"procedure": key_id, "status": said, "keys": [], "record": record_json(ended)}
            emit(fmt, document, lambda: record_lines(ended), rows="keys")
            return None
        pid = resolve_id(listed.steps, procedure_id, unlisted)
        try:
            status = await Client(store.store, parent_path=store.parent_path).get(pid)
        except ProcedureError:
            status = None  # its keys went meanwhile: the steps below say what is left
        return pid, status, await read_history(store, pid)

    found = await closing(store, read())
    if found is None:
        return
    pid, status, history = found
    document = {
        "procedure": str(pid),
        "status": None if status is None else status_json(status),
        "keys": [_entry(history, i, ended) for i, ended in enumerate(endings(history))],
    }

    def table() -> list[RenderableType]:
        return [*([] if status is None else [status_line(status)]), *_panels(history)]

    emit(fmt, document, table, rows="keys")
    unreadable = [str(key) for key, _, _, problem in history if problem is not None]
    if unreadable:
        raise CommandError(
            f"{plural(len(unreadable), 'value')} of procedure {pid} cannot be decoded ({unreadable[0]}); left "
            "untouched: restore them, or `procstore delete` the procedure",
            ExitCode.UNREADABLE,
        )
