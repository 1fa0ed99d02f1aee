"""Operator requests in a cluster simulation: through the public API and the CLI's code.

The CLI's commands run their own `asyncio.run`; the simulation calls the coroutine each
wraps instead (the same code, on the simulation's loop), with the store they open replaced
by the operator's `ProcessStore`, so that their writes are logged like a manager's.
"""

from __future__ import annotations

import contextlib
import inspect
import io
from collections.abc import Awaitable, Callable
from typing import Any

import click

from procstore._cli import common as cli_common
from procstore._cli.maintenance import cancel as cli_cancel
from procstore._cli.maintenance import delete as cli_delete
from procstore._cli.maintenance import fail as cli_fail
from procstore._cli.maintenance import gc as cli_gc
from procstore._cli.operations import resume as cli_resume
from procstore._cli.operations import rewind as cli_rewind
from procstore.store.state_store import StateStore

OPENER = "open_state_store"
"""The name through which the CLI's commands open a store from its URL."""


def _body(command: click.Command) -> Callable[..., Awaitable[Any]]:
    """The coroutine function a CLI command runs under `asyncio.run`."""
    assert command.callback is not None
    return inspect.unwrap(command.callback)  # type: ignore[no-any-return]


COMMANDS: dict[str, click.Command] = {
    "cancel": cli_cancel,
    "fail": cli_fail,
    "resume": cli_resume,
    "rewind": cli_rewind,
    "delete": cli_delete,
    "gc": cli_gc,
}


async def run_cli(store: StateStore, name: str, **arguments: Any) -> str:
    """Run CLI command `name` on `store` (as its URL would open it); returns what it
    printed. A refusal raises `click.ClickException` as the command would exit with it."""
    opened = getattr(cli_common, OPENER)
    setattr(cli_common, OPENER, lambda *_: store)
    out = io.StringIO()
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
            await _body(COMMANDS[name])(url=store.url, storage_options=(), parent_path="", **arguments)
    finally:
        setattr(cli_common, OPENER, opened)
    return " ".join(out.getvalue().split())
