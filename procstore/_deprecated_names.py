"""A module-level `__getattr__` for names a package no longer exports.

A name removed from a package's surface keeps working for one release: importing it still
gives the object, from the module that now holds it, with a `DeprecationWarning` naming
that module.
"""

from __future__ import annotations

import importlib
import warnings
from collections.abc import Callable


def moved_names(package: str, moved: dict[str, str]) -> Callable[[str], object]:
    """A `__getattr__` for `package` that finds each name of `moved` in the module given for it."""

    def __getattr__(name: str) -> object:
        module = moved.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        warnings.warn(
            f"{package}.{name} is deprecated and goes in the next release: import it from {module}",
            DeprecationWarning,
            stacklevel=2,
        )
        return getattr(importlib.import_module(module), name)

    return __getattr__
