"""Operator requests and signals in a cluster simulation: through the public API and the CLI's code.

The CLI's commands run their own `asyncio.run`; the simulation calls the coroutine each
wraps instead (the same code, on the simulation's loop), with the store they open replaced
by the operator's `ProcessStore`, so that their writes are logged like a manager's, and
what they print kept (several run at once: see `_in_this_task`).
"""

from __future__ import annotations

import contextlib
import inspect
import io
import sys
from collections.abc import Awaitable, Callable, Iterator
from contextvars import ContextVar
from typing import Any

import click

from procstore._cli import common as cli_common
from procstore._cli.maintenance import cancel as cli_cancel
from procstore._cli.maintenance import delete as cli_delete
from procstore._cli.maintenance import fail as cli_fail
from procstore._cli.maintenance import gc as cli_gc
from procstore._cli.operations import resume as cli_resume
from procstore._cli.operations import rewind as cli_rewind
from procstore._cli.signal import signal as cli_signal
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
    "signal": cli_signal,
}


async def run_cli(store: StateStore, name: str, /, **arguments: Any) -> str:
    """Run CLI command `name` on `store` (as its URL would open it); returns what it
    printed. A refusal raises `click.ClickException` as the command would exit with it."""
    out = io.StringIO()
    with _in_this_task(store, out):
        await _body(COMMANDS[name])(url=store.url, storage_options=(), parent_path="", **arguments)
    return " ".join(out.getvalue().split())


_store: ContextVar[StateStore] = ContextVar("procstore_sim_cli_store")
_output: ContextVar[io.StringIO | None] = ContextVar("procstore_sim_cli_output", default=None)
_running: list[tuple[Any, Any, Any]] = []
"""The opener and the streams the commands running now replaced (one entry per command)."""


class _TaskStream:
    """stdout or stderr: the running command's buffer in its task, the stream it replaced elsewhere."""

    def __init__(self, replaced: Any) -> None:
        self.replaced = replaced

    def write(self, text: str) -> int:
        out = _output.get()
        return int((out if out is not None else self.replaced).write(text))

    def flush(self) -> None:
        (_output.get() or self.replaced).flush()

    def isatty(self) -> bool:
        return False

    def __getattr__(self, name: str) -> Any:
        return getattr(self.replaced, name)


@contextlib.contextmanager
def _in_this_task(store: StateStore, out: io.StringIO) -> Iterator[None]:
    """Within the block, in this task only, the CLI opens `store` and prints to `out`.

    Several commands run at once in a simulation, each in its own task: swapping the
    module's opener and `sys.stdout` per command would hand one command's store or output
    to another, and leave a finished one's in place. The swap is made once, while any
    command runs, and each task's context says which store and buffer are its."""
    if not _running:
        saved = (getattr(cli_common, OPENER), sys.stdout, sys.stderr)
        setattr(cli_common, OPENER, lambda *_: _store.get())
        sys.stdout, sys.stderr = _TaskStream(sys.stdout), _TaskStream(sys.stderr)
    else:
        saved = _running[0]
    _running.append(saved)
    store_token, output_token = _store.set(store), _output.set(out)
    try:
        yield
    finally:
        _output.reset(output_token)
        _store.reset(store_token)
        _running.pop()
        if not _running:
            opener, sys.stdout, sys.stderr = saved
            setattr(cli_common, OPENER, opener)
