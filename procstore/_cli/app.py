"""The `procstore` command group; each subcommand lives in its own module."""

from __future__ import annotations

import os
import sys

import click

from procstore._cli.common import DECLINED, ExitCode, quiet_closed_pipe
from procstore._cli.demo import demo
from procstore._cli.history import history
from procstore._cli.lease import lease
from procstore._cli.listing import ls, tree
from procstore._cli.maintenance import cancel, delete, fail, gc
from procstore._cli.operations import export, resume, rewind
from procstore._cli.serve import serve
from procstore._cli.settings import settings
from procstore._cli.show import show
from procstore._cli.signal import signal
from procstore._cli.watch import watch
from procstore._text import terminal_text


@click.group()
@click.version_option(package_name="procstore")
def cli() -> None:
    """Crash-safe multi-step procedures on any fsspec store."""


COMMANDS = (
    ls,
    show,
    history,
    tree,
    watch,
    lease,
    gc,
    fail,
    cancel,
    signal,
    resume,
    rewind,
    delete,
    settings,
    export,
    serve,
    demo,
)
for command in COMMANDS:
    cli.add_command(command)


def main() -> None:
    """The `procstore` entry point: unexpected errors are one line too (PROCSTORE_DEBUG=1 shows the traceback)."""
    try:
        cli(standalone_mode=False)
        sys.stdout.flush()  # a closed pipe shows here, not in Python's own flush at exit
    except click.exceptions.Exit as e:
        sys.exit(e.exit_code)
    except KeyboardInterrupt:
        sys.exit(130)
    except BrokenPipeError:
        quiet_closed_pipe()
    except click.Abort:
        click.echo(f"Error: {DECLINED}", err=True)
        sys.exit(ExitCode.REFUSED)
    except click.ClickException as e:
        e.show()
        sys.exit(e.exit_code)
    except Exception as e:
        if isinstance(e.__context__, BrokenPipeError) or isinstance(e.__cause__, BrokenPipeError):
            quiet_closed_pipe()
        if os.environ.get("PROCSTORE_DEBUG"):
            raise
        click.echo(
            f"Error: internal error: {type(e).__name__}: {terminal_text(str(e))} (rerun with PROCSTORE_DEBUG=1 for the "
            "traceback)",
            err=True,
        )
        sys.exit(ExitCode.INTERNAL)
