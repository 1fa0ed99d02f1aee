"""How the public names present themselves: under the package that exports them.

A class or function defined in `procstore._runtime.manager` but exported by `procstore`
reports `__module__ == "procstore"` (as httpx does), so reprs, tracebacks, docs and pickles
name the import path users write, never an internal one that may move. Pickling still
works: it looks the name up in the exporting package, which holds it.
"""

from __future__ import annotations

from typing import Any


def present_under(package: str, namespace: dict[str, Any]) -> None:
    """Set `__module__` to `package` on each class and function named in `namespace["__all__"]`.

    Constants (strings, tuples, sets) have no `__module__` of their own and are left alone.
    """
    for name in namespace["__all__"]:
        value = namespace[name]
        if isinstance(value, type) or (callable(value) and hasattr(value, "__qualname__")):
            value.__module__ = package
