"""`procstore demo`: placeholder until the demo lands."""

from __future__ import annotations

import click


@click.command()
def demo() -> None:
    """Run the demo."""
    click.echo("demo")
