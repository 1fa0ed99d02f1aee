"""What every store command shares: the URL and its options, opening the store read-only
first, exit codes, one-line errors, and resolving a procedure id."""

from __future__ import annotations

import asyncio
import contextlib
import enum
import functools
import inspect
import os
import re
import sys
from collections.abc import Awaitable, Callable, Collection, Coroutine, Iterator
from typing import Any, NoReturn, ParamSpec, TypeVar

import click
import orjson

from procstore._cli.output import FORMATS
from procstore._text import TEXT_LIMIT, bounded, storable, terminal_text
from procstore.errors import OperationRefused, ProcedureNotFound, StoreError
from procstore.ids import ProcedureId
from procstore.store import open_state_store
from procstore.store.keys import KeysByProcedure, parent_folder
from procstore.store.local import LocalDirStore
from procstore.store.procedure_store import ProcedureStore

P = ParamSpec("P")
T = TypeVar("T")


class ExitCode(enum.IntEnum):
    """The documented exit codes of the store commands (README, "Command line")."""

    OK = 0
    INTERNAL = 1
    """A bug in procstore: please report it (run with PROCSTORE_DEBUG=1 for the traceback)."""
    USAGE = 2
    """Bad arguments or options (click's own code)."""
    STORE_UNAVAILABLE = 3
    """Bad URL, missing bucket or directory, missing credentials, access denied, unreachable."""
    NOT_FOUND = 4
    """No procedure with that id (or prefix) in the store."""
    UNREADABLE = 5
    """A value in the store cannot be decoded (shown, left untouched)."""
    REFUSED = 6
    """The procedure is not in a state the command can act on, or the prompt was declined."""


DECLINED = "declined: nothing was changed"
"""What every command says when its prompt is declined or interrupted."""


class CommandError(click.ClickException):
    """A one-line error with one of the documented exit codes."""

    def __init__(self, message: str, code: ExitCode) -> None:
        # Messages name stored values (a request's reason, a key): no control character
        # from the store reaches the terminal through an error either.
        super().__init__(terminal_text(bounded(message, 4 * TEXT_LIMIT)))
        self.code = code
        # click exits with `exit_code`, declared on the class; typeshed forbids setting it directly.
        setattr(self, "exit_code", int(code))  # noqa: B010


@contextlib.contextmanager
def refused() -> Iterator[None]:
    """An operation the store refuses (`OperationRefused`, `ProcedureNotFound`) becomes
    the command's one-line error and exit code (6, 4)."""
    try:
        yield
    except ProcedureNotFound as e:
        raise CommandError(str(e), ExitCode.NOT_FOUND) from e
    except OperationRefused as e:
        raise CommandError(str(e), ExitCode.REFUSED) from e


def storage_option_flags(fn: Callable[..., T]) -> Callable[..., T]:
    """`-s/--storage-option KEY=VALUE` and `-o`, passed on together as `storage_options`:
    `-o FORMAT` is an output format (`procstore._cli.output`), and `-o KEY=VALUE`, the
    storage options' flag of earlier releases, still works for one release, with a warning."""

    prints_data = "output" in inspect.signature(fn).parameters  # the command has output formats

    @functools.wraps(fn)
    def wrapper(*args: Any, storage_option: tuple[str, ...], dash_o: tuple[str, ...], **kwargs: Any) -> T:
        for value in dash_o:
            if "=" in value:
                continue
            if not prints_data:
                raise click.BadParameter(
                    f"{value!r}: -o is an output format, and this command prints no data (storage options: -s)",
                    param_hint="'-o'",
                )
            if value not in FORMATS:
                raise click.BadParameter(
                    f"{value!r} is not an output format ({', '.join(FORMATS)})", param_hint="'-o' / '--output'"
                )
        if any("=" in value for value in dash_o):
            click.echo("warning: `-o KEY=VALUE` is deprecated for storage options: use `-s KEY=VALUE`", err=True)
        return fn(*args, storage_options=(*storage_option, *dash_o), **kwargs)

    wrapper = click.option(
        "-o",
        "dash_o",
        multiple=True,
        metavar="FORMAT",
        help="Output format, as --output (`-o json`); KEY=VALUE here is a storage option (deprecated: use -s).",
    )(wrapper)
    return click.option(
        "-s",
        "--storage-option",
        "storage_option",
        multiple=True,
        metavar="KEY=VALUE",
        help="fsspec storage option, repeatable (`-s endpoint_url=http://...`); values are JSON if they parse. "
        "For S3, AWS_ENDPOINT_URL (and the other AWS_* variables) work too.",
    )(wrapper)


def store_options(fn: Callable[P, T]) -> Callable[P, T]:
    """The URL argument, `-s/--storage-option k=v`, `-o FORMAT` and `--parent-path`."""
    fn = click.option(
        "--parent-path",
        default="",
        callback=_folder_in_store,
        help="Folder inside the store that holds `procedure/` (the manager's parent_path).",
    )(fn)
    return click.argument("url")(storage_option_flags(fn))


def _folder_in_store(_ctx: click.Context, _param: click.Parameter, parent_path: str) -> str:
    """`--parent-path` names a folder inside the store (see `parent_folder`), else a usage error."""
    try:
        parent_folder(parent_path)
    except ValueError as e:
        raise click.BadParameter(str(e)) from None
    return parent_path


def parse_storage_options(pairs: tuple[str, ...]) -> dict[str, Any]:
    options: dict[str, Any] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep and pair in FORMATS:
            continue  # `-o json`: an output format (procstore._cli.output), not a storage option
        if not sep or not key:
            raise click.BadParameter(
                f"expected KEY=VALUE (a storage option) or an output format ({', '.join(FORMATS)}), got {pair!r}",
                param_hint="'-s' / '--storage-option'",
            )
        try:
            options[key] = orjson.loads(value)
        except orjson.JSONDecodeError:
            options[key] = value
    return options


async def open_existing_store(url: str, storage_options: tuple[str, ...], parent_path: str) -> ProcedureStore:
    """Open the store without creating anything; `CommandError(STORE_UNAVAILABLE)` if unusable."""
    options = parse_storage_options(storage_options)
    try:
        state_store = open_state_store(url, options)
    except StoreError as e:
        raise CommandError(str(e), ExitCode.STORE_UNAVAILABLE) from e
    try:
        if isinstance(state_store, LocalDirStore) and not state_store.root.is_dir():
            raise CommandError(
                f"no such directory: {state_store.root} (check the path; nothing was created)",
                ExitCode.STORE_UNAVAILABLE,
            )
        await state_store.check_access()
    except BaseException as e:
        await state_store.close()
        if isinstance(e, StoreError):
            raise CommandError(str(e), ExitCode.STORE_UNAVAILABLE) from e
        raise
    return ProcedureStore(state_store, parent_path)


def storable_text(_ctx: click.Context, param: click.Parameter, text: str | None) -> str | None:
    """A click callback for text the command stores (a reason, a signal's name): an
    argument's byte that is not UTF-8 reaches Python as a lone surrogate, which the store
    cannot hold; refused as a usage error, naming the parameter, before anything is written."""
    if text is None:
        return None
    try:
        return storable(text, param.human_readable_name)
    except ValueError as e:
        raise click.BadParameter(str(e)) from None


def run_command(main: Callable[..., Coroutine[Any, Any, T]]) -> Callable[..., T]:
    """Run an async command body; store failures become one-line errors, never tracebacks."""

    @functools.wraps(main)
    def wrapper(*args: Any, **kwargs: Any) -> T:
        try:
            return asyncio.run(main(*args, **kwargs))
        except StoreError as e:
            raise CommandError(str(e), ExitCode.STORE_UNAVAILABLE) from e
        except BrokenPipeError:
            quiet_closed_pipe()  # here, before click's own handling (which exits with 1)
            raise

    return wrapper


def interrupt_ends(command: Callable[P, T | None]) -> Callable[P, T | None]:
    """For a command that runs until Ctrl-C (`watch`): Ctrl-C ends it as it should, exit
    code 0, rather than as an interrupted prompt (`declined`, exit 6)."""

    @functools.wraps(command)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> T | None:
        try:
            return command(*args, **kwargs)
        except KeyboardInterrupt:
            return None

    return wrapper


async def closing(store: ProcedureStore, body: Awaitable[T]) -> T:
    """Await `body`, then close the store whatever happened."""
    try:
        return await body
    finally:
        await store.store.close()


def resolve_id(known: Collection[ProcedureId], text: str, unlisted: Collection[ProcedureId] = ()) -> ProcedureId:
    """A full id, or a unique prefix of one (as with git's short hashes), among `known`;
    refused, naming it, if it is one of `unlisted` (procedures whose folder could not be listed)."""
    # The same rule as for `known` below: the id in any form, or a prefix of 4 or more.
    prefix = text.lower() if len(text) >= 4 else None
    for pid in unlisted:
        if (prefix is not None and str(pid).startswith(prefix)) or _same_id(pid, text):
            raise CommandError(
                f"the folder of procedure {pid} cannot be listed: fix its permissions, or replace a link with "
                "the folder it points to",
                ExitCode.STORE_UNAVAILABLE,
            )
    try:
        pid = ProcedureId.parse(text)
    except ValueError:
        matches = [p for p in known if str(p).startswith(text.lower())]
        if matches and len(text) < 4:
            raise CommandError(
                f"{text!r} is too short to name a procedure: give at least 4 characters of its id "
                f"({plural_matches(len(matches))} start with it)",
                ExitCode.NOT_FOUND,
            ) from None
        if len(matches) == 1:
            return matches[0]
        if len(matches) > 1:
            raise CommandError(
                f"{text!r} matches {len(matches)} procedures ({', '.join(map(str, matches[:3]))}...): give more of it",
                ExitCode.NOT_FOUND,
            ) from None
        raise CommandError(
            f"no procedure id starts with {text!r} in this store (`procstore ls URL` lists them)", ExitCode.NOT_FOUND
        ) from None
    if pid not in known:
        raise CommandError(f"no procedure {pid} in this store (`procstore ls URL` lists them)", ExitCode.NOT_FOUND)
    return pid


def plural_matches(count: int) -> str:
    return "one procedure's id does" if count == 1 else f"{count} procedures' ids"


def _same_id(pid: ProcedureId, text: str) -> bool:
    try:
        return ProcedureId.parse(text) == pid
    except ValueError:
        return False


async def listed_procedures(store: ProcedureStore) -> tuple[KeysByProcedure, set[ProcedureId]]:
    """The keys under `procedure/` by procedure, and the procedures whose folder could not be
    listed (for `resolve_id`: a folder of another procedure does not stop the command)."""
    keys, problems = await store.list_keys()
    unlisted = {p.procedure_id for p in problems if p.procedure_id is not None}
    return KeysByProcedure.group(store.proc_path, keys), unlisted


_DURATION = re.compile(r"(\d+(?:\.\d+)?)\s*(s|m|h|d|w)")
_SECONDS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}


def parse_age(text: str) -> float:
    """`90s`, `15m`, `12h`, `7d`, `2w`, or combinations (`1d12h`), in seconds."""
    parts = _DURATION.findall(text.replace(" ", ""))
    if not parts or "".join(n + u for n, u in parts) != text.replace(" ", ""):
        raise click.BadParameter(f"expected an age such as 90s, 15m, 12h, 7d or 1d12h, got {text!r}")
    return sum(float(n) * _SECONDS[u] for n, u in parts)


def quiet_closed_pipe() -> NoReturn:
    """The reader went away (`procstore ls | head -1`): what it wanted, it has. Exit 0,
    quietly, and send what is still buffered nowhere (Python would report it at exit)."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    sys.exit(0)
