"""The `procstore` command group; each subcommand lives in its own module."""

from __future__ import annotations

import click

from procstore.cli.demo import demo


@click.group()
@click.version_option(package_name="procstore")
def cli() -> None:
    """Crash-safe multi-step procedures on any fsspec store."""


cli.add_command(demo)


def main() -> None:
    cli()
