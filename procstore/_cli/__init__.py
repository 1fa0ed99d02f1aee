"""The `procstore` command line."""

from procstore._cli.app import cli, main

__all__ = ["cli", "main"]
