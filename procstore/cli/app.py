"""The `procstore` command group; each subcommand lives in its own module."""

from __future__ import annotations

import os
import sys

import click

from procstore.cli.common import ExitCode
from procstore.cli.demo import demo
from procstore.cli.lease import lease
from procstore.cli.listing import ls, tree, watch
from procstore.cli.maintenance import cancel, delete, fail, gc
from procstore.cli.operations import resume, rewind
from procstore.cli.show import show


@click.group()
@click.version_option(package_name="procstore")
def cli() -> None:
    """Crash-safe multi-step procedures on any fsspec store."""


for command in (ls, show, tree, watch, lease, gc, fail, cancel, resume, rewind, delete, demo):
    cli.add_command(command)


def main() -> None:
    """The `procstore` entry point: unexpected errors are one line too (PROCSTORE_DEBUG=1 shows the traceback)."""
    try:
        cli(standalone_mode=False)
    except click.exceptions.Exit as e:
        sys.exit(e.exit_code)
    except KeyboardInterrupt:
        sys.exit(130)
    except click.Abort:
        click.echo("Aborted: nothing was changed.", err=True)
        sys.exit(ExitCode.REFUSED)
    except click.ClickException as e:
        e.show()
        sys.exit(e.exit_code)
    except Exception as e:
        if os.environ.get("PROCSTORE_DEBUG"):
            raise
        click.echo(
            f"Error: internal error: {type(e).__name__}: {e} (rerun with PROCSTORE_DEBUG=1 for the traceback)", err=True
        )
        sys.exit(ExitCode.INTERNAL)
