"""Publish a version of a set of objects and flip a `current` pointer (compare-and-swap)."""

from procstore_machines.publish.machine import Publish, new_publish, read_current, register

__all__ = ["Publish", "new_publish", "read_current", "register"]
