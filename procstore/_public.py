"""How the public names present themselves: under the package that exports them.

A class or function defined in `procstore._runtime.manager` but exported by `procstore`
reports `__module__ == "procstore"` (as httpx does), so reprs, tracebacks, docs and pickles
name the import path users write, never an internal one that may move. Pickling still
works: it looks the name up in the exporting package, which holds it.
"""

from __future__ import annotations

import inspect
import sys
from typing import Any


def present_under(package: str, namespace: dict[str, Any]) -> None:
    """Set `__module__` to `package` on each class and function named in `namespace["__all__"]`.

    Constants (strings, tuples, sets) have no `__module__` of their own and are left alone.
    """
    for name in namespace["__all__"]:
        value = namespace[name]
        if isinstance(value, type):
            _resolve_annotations(value)
        if isinstance(value, type) or (callable(value) and hasattr(value, "__qualname__")):
            value.__module__ = package


def _resolve_annotations(cls: type) -> None:
    """Turn the class's own annotations that are text (`from __future__ import annotations`)
    into the objects they name, while `__module__` still names the module that defines them.

    `typing.get_type_hints` (and msgspec, pydantic, dataclass tools built on it) resolves a
    class's text annotations in the module its `__module__` names: once that is the
    exporting package, names imported only by the defining module would no longer resolve.
    An annotation that cannot be resolved here (a name imported only for type checkers)
    stays text, as before.
    """
    annotations = inspect.get_annotations(cls)
    if not any(isinstance(hint, str) for hint in annotations.values()):
        return
    defining_module = vars(sys.modules[cls.__module__])
    for name, hint in annotations.items():
        if isinstance(hint, str):
            try:
                # What get_type_hints does with the text: evaluate it in the defining module,
                # with the class's own namespace for names defined in its body.
                annotations[name] = eval(hint, defining_module, dict(vars(cls)))
            except Exception:
                continue
    cls.__annotations__ = annotations
