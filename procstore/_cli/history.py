"""History records in the CLI: `procstore ls --history` and `procstore show` of an ended id."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, get_args

import click
import msgspec
from rich import box
from rich.console import RenderableType
from rich.table import Table

from procstore._cli.common import (
    CommandError,
    ExitCode,
    closing,
    open_existing_store,
    parse_age,
    plural_matches,
    run_command,
    store_options,
)
from procstore._cli.output import (
    Format,
    TimeFormat,
    chosen_format,
    emit,
    iso_time,
    nested,
    output_console,
    output_options,
    plural,
    rows_options,
    short_ids,
    stored,
    table_time,
    time_option,
)
from procstore.ids import ProcedureId
from procstore.store.history import Action, HistoryRecord, HistoryStore, Outcome
from procstore.store.procedure_store import ProcedureStore

_FIELDS = (
    "id", "type_name", "outcome", "run", "steps", "retries", "parent_id", "started_at", "ended_at", "error",
    "started", "ended_by", "output", "output_not_kept",
)  # fmt: skip


def history_of(store: ProcedureStore) -> HistoryStore:
    return HistoryStore(store.store, store.parent_path)


_COLUMNS = ("id", "type", "outcome", "steps", "retries", "ended", "error")


@dataclass(frozen=True, slots=True)
class HistoryListing:
    """What `ls --history` shows: the options of `ls` that apply to ended procedures."""

    type_name: str | None = None
    older_than: float | None = None
    newer_than: float | None = None
    sort: str = "time"
    reverse: bool = False
    limit: int | None = None
    wide: bool = False
    headers: bool = True
    time_format: TimeFormat = "relative"
    id_prefix: str | None = None
    outcomes: frozenset[str] = frozenset()

    def select(self, records: list[HistoryRecord], now: float) -> list[HistoryRecord]:
        """Filtered by id, type, outcome and end time, sorted, reversed and cut as `ls` does."""
        chosen = [
            r
            for r in records
            if (self.type_name is None or r.type_name == self.type_name)
            and (self.id_prefix is None or r.id.startswith(self.id_prefix.lower()))
            and (not self.outcomes or r.outcome in self.outcomes)
            and (self.older_than is None or now - _ended(r) >= self.older_than)
            and (self.newer_than is None or now - _ended(r) <= self.newer_than)
        ]
        chosen.sort(key=_SORT_KEYS[self.sort])
        if self.reverse:
            chosen.reverse()
        return chosen if self.limit is None else chosen[: self.limit]


_SORT_KEYS: dict[str, Callable[[HistoryRecord], Any]] = {
    "time": lambda r: (_ended(r), r.id),
    "id": lambda r: r.id,
    "type": lambda r: (r.type_name, r.id),
    "status": lambda r: (r.outcome, r.id),
    "step": lambda r: (r.steps, r.id),
}


def _ended(record: HistoryRecord) -> float:
    try:
        return datetime.fromisoformat(record.ended_at).timestamp()
    except ValueError:
        return 0.0


async def print_history(store: ProcedureStore, fmt: Format, listing: HistoryListing) -> None:
    """The records `listing` selects: a table that fits the terminal as `ls`'s does (ids cut
    to a unique prefix, the type and error cut with `…`), one document (`json`, `yaml`) or
    one record per line (`jsonl`)."""
    now = time.time()
    records = listing.select(await history_of(store).list(), now)

    def table() -> list[RenderableType]:
        parsed = {r.id: ProcedureId.parse_canonical(r.id) for r in records}
        short = {} if listing.wide else short_ids([p for p in parsed.values() if p is not None])
        rows = [
            (
                short.get(pid, r.id) if (pid := parsed[r.id]) is not None else stored(r.id),
                stored(r.type_name),
                stored(r.outcome),
                str(r.steps),
                str(r.retries),
                stored(table_time(_ended(r) or None, listing.time_format, now)),
                stored(r.error or ""),
            )
            for r in records
        ]
        natural = [max([len(name), *(len(row[n]) for row in rows)]) for n, name in enumerate(_COLUMNS)]
        # What is left beside the fixed columns (and 3 between each two) goes to the type (half
        # at most), then the error: together never wider than that, or the table overflows the
        # terminal and rich squeezes the columns itself, cutting them without `…`.
        room = output_console().width - sum(natural[n] for n in (0, 2, 3, 4, 5)) - 3 * (len(_COLUMNS) - 1)
        type_width = min(natural[1], max(1, room // 2))
        cut = {"type": type_width, "error": max(1, room - type_width)}
        out = Table(box=box.SIMPLE_HEAD, pad_edge=False, show_edge=False, show_header=listing.headers)
        for n, name in enumerate(_COLUMNS):
            if name in cut and not listing.wide:  # what gives way when space runs out
                out.add_column(name, no_wrap=True, overflow="ellipsis", max_width=cut[name])
            else:
                out.add_column(name, no_wrap=True, min_width=natural[n])
        for row in rows:
            out.add_row(*row)
        summary = [f"{plural(len(records), 'ended procedure')} in the history"] if listing.headers else []
        return [out, *summary]

    emit(fmt, {"history": [record_json(r) for r in records]}, table, rows="history", wide=listing.wide)


def record_json(record: HistoryRecord) -> dict[str, Any]:
    """A history record as data, its `output` nested as JSON (as `show` nests `data`), its
    times in the one form of every JSON document (`iso_time`: to the second, with `Z`)."""
    document: dict[str, Any] = msgspec.to_builtins(record)
    document["output"] = None if record.output is None else nested(record.output)
    for name in ("started_at", "ended_at"):
        document[name] = _same_form(document[name])
    for action in (document["started"], document["ended_by"]):
        if action is not None:
            action["at"] = _same_form(action.get("at"))
    return document


def _same_form(text: str | None) -> str | None:
    """A stored ISO 8601 time in `iso_time`'s form; text that is not one, as stored."""
    if not text:
        return text
    try:
        moment = datetime.fromisoformat(text)
    except ValueError:
        return text
    return iso_time((moment if moment.tzinfo else moment.replace(tzinfo=UTC)).timestamp()) or text


def action_text(action: Action | None) -> str:
    """`resume by ops@host at 2026-…: why` for an `Action` (how a run started, or the request that ended it)."""
    if action is None:
        return ""
    parts = [action.kind + (f" to step {action.to_step}" if action.to_step is not None else "")]
    if action.by:
        parts.append(f"by {action.by}")
    if action.at:
        parts.append(f"at {action.at}")
    return " ".join(parts) + (f": {action.reason}" if action.reason else "")


async def ended_record(store: ProcedureStore, text: str) -> tuple[str, HistoryRecord]:
    """The id (as its record's key names it) and newest record of an id no longer in the
    store (the full id, or a unique prefix)."""
    history = history_of(store)
    ids = await history.recorded_ids()
    matches = sorted(i for i in ids if i.startswith(text.lower()))
    if matches and len(text) < 4:
        raise CommandError(
            f"{text!r} is too short to name a procedure: give at least 4 characters of its id "
            f"({plural_matches(len(matches))} in the history start with it)",
            ExitCode.NOT_FOUND,
        )
    if len(matches) != 1:
        found = "matches several ended procedures" if matches else "is neither in the store nor in its history"
        raise CommandError(f"{text!r} {found} (`procstore ls URL --history` lists them)", ExitCode.NOT_FOUND)
    record = await history.find(matches[0])
    if record is None:
        raise CommandError(f"the history record of {matches[0]} cannot be read", ExitCode.UNREADABLE)
    return matches[0], record


def record_lines(record: HistoryRecord) -> list[RenderableType]:
    """An ended id's record, for people (`procstore show`)."""
    lines: list[RenderableType] = [f"[bold]{stored(record.id)}[/] ended: its keys are gone, this is its history record"]
    for name in _FIELDS[1:]:
        value = getattr(record, name)
        if name in ("started", "ended_by"):
            value = action_text(value)
        if value is not None and value != "":
            lines.append(f"  {name:<15} {stored(value)}")
    return lines


@click.command("history")
@store_options
@click.option("--id", "id_prefix", help="Only the runs of this procedure (its id, or a prefix of it).")
@click.option("--type", "type_name", help="Only procedures of this type_name.")
@click.option(
    "--outcome",
    "outcomes",
    multiple=True,
    type=click.Choice(get_args(Outcome)),
    help="Only these outcomes (repeatable).",
)
@click.option("--older-than", callback=lambda _c, _p, v: parse_age(v) if v else None, help="Ended longer ago (7d).")
@click.option("--newer-than", callback=lambda _c, _p, v: parse_age(v) if v else None, help="Ended more recently.")
@rows_options(_SORT_KEYS)
@time_option
@output_options
@run_command
async def history(
    url: str,
    storage_options: tuple[str, ...],
    parent_path: str,
    id_prefix: str | None,
    type_name: str | None,
    outcomes: tuple[str, ...],
    older_than: float | None,
    newer_than: float | None,
    sort: str,
    reverse: bool,
    limit: int | None,
    wide: bool,
    no_headers: bool,
    time_format: TimeFormat,
    output: str | None,
    as_json: bool,
) -> None:
    """The record of every ended run the store's history keeps, oldest end first.

    Each says how the run ended (outcome, error), how it started (`started`: submit,
    resume or rewind, with who, when and why), the operator request that ended it, if one
    did (`ended_by`), and a done run's output: `-o json` has every field.
    """
    fmt: Format = chosen_format(storage_options, output, as_json)
    store = await open_existing_store(url, storage_options, parent_path)
    listing = HistoryListing(
        type_name,
        older_than,
        newer_than,
        sort,
        reverse,
        limit,
        wide,
        not no_headers,
        time_format,
        id_prefix,
        frozenset(outcomes),
    )
    await closing(store, print_history(store, fmt, listing))
