"""The `procstore` command line."""

from procstore.cli.app import cli, main

__all__ = ["cli", "main"]
