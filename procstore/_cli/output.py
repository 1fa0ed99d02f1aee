"""How commands print data: one format option for all, short ids, times, tables that fit.

Every command that prints data takes `-o FORMAT` (or `--output FORMAT`): `table` (the
default), `json` (one document), `jsonl` (one object per line) or `yaml`. `-o` also takes
the storage options' `KEY=VALUE`: a value with `=` is a storage option, one without is a
format, so the two never collide. `--json` stays what it always was, JSON lines.

Tables go to stdout and fit the terminal (or `COLUMNS` when piped); warnings go to stderr,
and into the document (`"warnings"`) for `json` and `yaml`.

Every value from the store is hostile text (anyone who can write the bucket chose it):
`stored()` makes one inert where this program writes rich markup around it (markup
escaped, cut to `TEXT_LIMIT` characters), and everything printed goes through
`_Console.render_str` (tables, trees, panels, plain lines) or `warn`, which escape control
characters, so no value sets a window title, clears the screen or makes a hyperlink.
"""

from __future__ import annotations

import itertools
import json
import os
import re
import sys
from collections.abc import Callable, Collection, Iterable
from typing import Any, Literal, ParamSpec, TypeVar

import click
import msgspec
import orjson
from rich.console import Console, RenderableType
from rich.errors import MarkupError
from rich.markup import escape
from rich.measure import Measurement
from rich.text import Text

from procstore._text import bounded, has_control, json_inert, terminal_text, valid_unicode
from procstore.ids import ProcedureId
from procstore.wake_time import calendar_time

P = ParamSpec("P")
T = TypeVar("T")

Format = Literal["table", "json", "jsonl", "yaml"]
FORMATS: tuple[Format, ...] = ("table", "json", "jsonl", "yaml")
TimeFormat = Literal["relative", "iso", "raw"]

SHORT_ID = 8
"""The shortest prefix shown for an id: longer only where two ids share it."""


def output_options(fn: Callable[P, T]) -> Callable[P, T]:
    """`--output/-O FORMAT` and `--json` (JSON lines); `-o FORMAT` works too (see above)."""
    fn = click.option("--json", "as_json", is_flag=True, help="One JSON object per line (the same as -o jsonl).")(fn)
    return click.option(
        "--output",
        "-O",
        "output",
        type=click.Choice(FORMATS),
        default=None,
        help="table (default), json (one document), jsonl (one object per line) or yaml; also `-o FORMAT`.",
    )(fn)


def chosen_format(storage_options: tuple[str, ...], output: str | None, as_json: bool) -> Format:
    """The one format asked for, by `--output`, `--json` or `-o FORMAT`; a usage error if several differ."""
    asked = {f for f in storage_options if "=" not in f}
    if output is not None:
        asked.add(output)
    if as_json:
        asked.add("jsonl")
    unknown = asked - set(FORMATS)
    if unknown:
        raise click.BadParameter(
            f"{sorted(unknown)[0]!r} is not an output format ({', '.join(FORMATS)})",
            param_hint="'-o' / '--output'",
        )
    if len(asked) > 1:
        raise click.UsageError(f"several output formats asked for: {', '.join(sorted(asked))}; give one")
    return next((f for f in FORMATS if f in asked), "table")


def rows_options(sort_keys: Collection[str]) -> Callable[[Callable[P, T]], Callable[P, T]]:
    """`--sort KEY`, `--reverse`, `--limit N`, `--wide` and `--no-headers`: how a command
    that prints rows (`ls`, `history`) orders, cuts and lays them out."""

    def add(fn: Callable[P, T]) -> Callable[P, T]:
        for option in reversed(
            [
                click.option("--sort", type=click.Choice(sorted(sort_keys)), default="time", show_default=True,
                             help="Order rows by."),
                click.option("--reverse", is_flag=True, help="Reverse the order."),
                click.option("--limit", type=click.IntRange(min=0), default=None,
                             help="At most this many rows (after sorting)."),
                click.option("--wide", is_flag=True, help="Full ids and every detail, however wide."),
                click.option("--no-headers", is_flag=True, help="Table rows only: no header, no summary."),
            ]
        ):  # fmt: skip
            fn = option(fn)
        return fn

    return add


def time_option(fn: Callable[P, T]) -> Callable[P, T]:
    return click.option(
        "--time-format",
        type=click.Choice(["relative", "iso", "raw"]),
        default="relative",
        show_default=True,
        help="Times in tables: relative (5m ago), iso (ISO 8601, UTC) or raw (seconds since the epoch).",
    )(fn)


def iso_time(timestamp: float | None) -> str | None:
    """ISO 8601 in UTC, to the second: what JSON and YAML carry. None for a time the
    calendar does not hold (a stored end time of `9999-12-31T23:59:59-23:59` is year 10000
    in UTC): a stored value never makes a command fail."""
    moment = None if timestamp is None else calendar_time(timestamp)
    return None if moment is None else moment.isoformat(timespec="seconds").replace("+00:00", "Z")


def table_time(timestamp: float | None, fmt: TimeFormat, now: float) -> str:
    if timestamp is None:
        return "-"
    if fmt == "iso":
        return iso_time(timestamp) or "-"
    if fmt == "raw":
        return f"{timestamp:.3f}"
    seconds = max(0.0, now - timestamp)
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{int(seconds // size)}{unit} ago"
    return f"{int(seconds)}s ago"


def short_ids(ids: Collection[ProcedureId]) -> dict[ProcedureId, str]:
    """Each id cut to the shortest prefix (at least `SHORT_ID` characters) that no other
    id in `ids` shares, as git shortens hashes; any command takes such a prefix back."""
    texts = sorted(str(i) for i in ids)
    length = SHORT_ID
    for a, b in itertools.pairwise(texts):
        common = next((n for n, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b)))
        length = max(length, common + 1)
    return {i: str(i)[:length] for i in ids}


def plural(n: int, word: str, many: str | None = None) -> str:
    return f"{n} {word if n == 1 else (many or word + 's')}"


def plain(value: object) -> str:
    """A value from the store, for text that is not markup (a prompt, a click message):
    control characters escaped, at most `TEXT_LIMIT` characters."""
    return terminal_text(bounded(str(value)))


NESTING_LIMIT = 100
"""The deepest JSON `nested` places in a document: the output's encoders (YAML, the
sanitising of text) recurse, and Python's recursion stops near 1,000."""


def nested(text: str) -> Any:
    """Stored JSON text as the value it holds (a step's `data`, a run's output), nested in a
    JSON document rather than a string inside it; text that is not JSON, or nested deeper
    than `NESTING_LIMIT`, as stored."""
    try:
        value = orjson.loads(text)
    except orjson.JSONDecodeError:
        return text
    return value if _depth_within(value, NESTING_LIMIT) and not _has_wide_int(text) else text


_LONG_DIGITS = re.compile(r"\d{20,}")
"""A run of digits that may be an integer beyond 64 bits (2**64 has 20)."""


def _has_wide_int(text: str) -> bool:
    """Whether the JSON text holds an integer beyond 64 bits, which orjson reads as a
    rounded float (and cannot write): such a value is shown as stored, whole. The full
    parse runs only for text with 20 digits in a row."""
    if not _LONG_DIGITS.search(text):
        return False
    wide = False

    def integer(literal: str) -> int:
        nonlocal wide
        number = int(literal)
        wide = wide or not -(2**63) <= number < 2**64
        return 0

    try:
        json.loads(text, parse_int=integer)
    except (ValueError, RecursionError):
        return True
    return wide


def _depth_within(value: Any, limit: int) -> bool:
    """A loop, not a recursion: orjson reads values nested up to 1,024 deep."""
    stack = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict | list):
            if depth > limit:
                return False
            stack += [(inner, depth + 1) for inner in (item.values() if isinstance(item, dict) else item)]
    return True


def stored(value: object) -> str:
    """A value from the store, to place in rich markup: shown as it is, never as markup,
    and at most `TEXT_LIMIT` characters (`-o json` has it whole)."""
    return escape(plain(value))


class _Console(Console):
    def __init__(self, **kwargs: Any) -> None:
        # rich replaces `:lock:`-style codes in every string it renders: a stored type name
        # `T :white_heavy_check_mark: committed` would print a check mark. procstore's own
        # text uses none.
        super().__init__(**{"emoji": False, **kwargs})

    def render_str(self, text: str, **kwargs: Any) -> Text:
        # The one way a string reaches the terminal: control characters are escaped here,
        # whatever called print; markup that does not parse (a stored value placed in it
        # without `stored()`) is shown as text rather than stopping the command.
        text = terminal_text(text, keep_newlines=True)
        try:
            return super().render_str(text, **kwargs)
        except MarkupError:
            return super().render_str(text, **{**kwargs, "markup": False})

    def on_broken_pipe(self) -> None:
        # rich exits with 1 here; a reader that went away (`| head -1`) is no error.
        raise BrokenPipeError


def output_console() -> Console:
    """stdout, as wide as the terminal; when piped, `COLUMNS` wide if set, else wide enough
    for full ids (rich would assume 80 columns)."""
    console = _Console()
    if console.is_terminal:
        return console
    columns = os.environ.get("COLUMNS", "")
    return _Console(width=int(columns) if columns.isdigit() and int(columns) > 0 else 220)


def wide_console(parts: Iterable[RenderableType]) -> Console:
    """`output_console()`, made as wide as the widest of `parts` needs (`--wide`): every
    column shows in full, and a terminal wraps the lines instead."""
    console = output_console()
    unbounded = console.options.update_width(1_000_000)
    need = max((Measurement.get(console, unbounded, part).maximum for part in parts), default=0)
    return console if need <= console.width else _Console(width=need)


def error_console() -> Console:
    """stderr (progress bars, notes beside the data), with the same escaping as stdout."""
    return _Console(stderr=True)


def warn(message: str) -> None:
    """A warning, on stderr: never mixed into the data on stdout (control characters escaped)."""
    click.echo(f"warning: {terminal_text(message)}", err=True)


def emit(
    fmt: Format,
    document: dict[str, Any],
    table: Callable[[], Iterable[RenderableType]],
    *,
    rows: str | None = None,
    warnings: list[str] | tuple[str, ...] = (),
    wide: bool = False,
) -> None:
    """Print `document` in `fmt`: `table()` renders it for people (`wide`: however wide it
    is); `rows` names the list that `jsonl` prints one item per line (else the document is
    the one line)."""
    document = _valid_unicode(document)
    if fmt == "table":
        parts = list(table())
        console = wide_console(parts) if wide else output_console()
        for part in parts:
            console.print(part)
    elif fmt == "jsonl":
        for item in document[rows] if rows is not None else [document]:
            sys.stdout.write(json_inert(orjson.dumps(item).decode()) + "\n")
    else:
        full = {**document, "warnings": list(warnings)} if warnings else document
        if fmt == "json":
            sys.stdout.write(json_inert(orjson.dumps(full, option=orjson.OPT_INDENT_2).decode()) + "\n")
        else:
            sys.stdout.write(_yaml(full))
    if fmt != "json" and fmt != "yaml":
        for message in warnings:
            warn(message)


def _valid_unicode(value: Any) -> Any:
    """`value` with every string `valid_unicode`: a key name that is not UTF-8, or a lone
    surrogate in a stored JSON string, is shown escaped rather than failing the encoder."""
    if isinstance(value, str):
        return valid_unicode(value)
    if isinstance(value, dict):
        return {_valid_unicode(k): _valid_unicode(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_valid_unicode(v) for v in value]
    return value


def _yaml(document: dict[str, Any]) -> str:
    """YAML, every string that holds a control character double-quoted, where `json_inert`
    escapes it as YAML reads it back (in another style the escape would be text)."""
    try:
        import yaml  # type: ignore[import-untyped]
    except ImportError as e:  # pragma: no cover - PyYAML is a dependency
        raise click.UsageError("-o yaml needs PyYAML: pip install pyyaml") from e

    class InertDumper(getattr(yaml, "CSafeDumper", yaml.SafeDumper)):  # type: ignore[misc]
        def represent_str(self, data: str) -> Any:
            quoted = '"' if has_control(data) else None
            return self.represent_scalar("tag:yaml.org,2002:str", data, style=quoted)

    InertDumper.add_representer(str, InertDumper.represent_str)
    text: str = yaml.dump(msgspec.to_builtins(document), Dumper=InertDumper, allow_unicode=True, sort_keys=False)
    return json_inert(text)
