"""`FaultyFileSystem`: the same faults at the fsspec level, reachable by URL.

    plan = FaultPlan([Fault("transient", kinds=frozenset({"put"}), times=3)])
    manager = ProcedureManager(
        "faulty://store/", storage_options={"fs": fsspec.filesystem("memory"), "path": "/cp", "plan": plan}
    )

It wraps any fsspec filesystem (`fs`), rooted at `path`, through fsspec's `DirFileSystem`.
Operations map to the store's kinds: `pipe_file` is `put` (`put_if_absent` with
`mode="create"`), `cat_file` is `get`, `find` is `walk`, `rm`/`rm_file` are `delete`.
"""

from __future__ import annotations

import time
from typing import Any

import fsspec
from fsspec.implementations.dirfs import DirFileSystem

from procstore.testing.plan import FaultPlan, torn


class FaultyFileSystem(DirFileSystem):  # type: ignore[misc] # fsspec is untyped
    protocol = "faulty"
    procstore_inline = True
    """Called on the event loop, not in a thread: the plan's crash event is not thread-safe.
    Fine for the memory:// and local filesystems tests wrap."""

    def __init__(self, path: str = "", fs: Any = None, plan: FaultPlan | None = None, **kwargs: Any) -> None:
        super().__init__(path=path, fs=fs, **kwargs)
        self.plan = plan or FaultPlan()

    def _around(self, kind: str, key: str, call: Any, value: bytes | None = None) -> Any:
        op, later = self.plan.begin(kind, key)
        for fault in later:
            if fault.action == "delay":
                time.sleep(fault.seconds)
            elif fault.action == "tear" and value is not None:
                super().pipe_file(key, torn(value))
                raise self.plan.crash(f"torn write of {key}")
        result = call()
        self.plan.end(op, later, kind, key)
        return result

    def pipe_file(self, path: str, value: bytes, mode: str = "overwrite", **kwargs: Any) -> Any:
        kind = "put_if_absent" if mode == "create" else "put"
        return self._around(
            kind, path, lambda: super(FaultyFileSystem, self).pipe_file(path, value, mode=mode, **kwargs), value
        )

    def cat_file(self, path: str, *args: Any, **kwargs: Any) -> Any:
        return self._around("get", path, lambda: super(FaultyFileSystem, self).cat_file(path, *args, **kwargs))

    def find(self, path: str, *args: Any, **kwargs: Any) -> Any:
        return self._around("walk", path, lambda: super(FaultyFileSystem, self).find(path, *args, **kwargs))

    def rm(self, path: Any, *args: Any, **kwargs: Any) -> Any:
        key = ",".join(path) if isinstance(path, list) else str(path)
        return self._around("batch_delete", key, lambda: super(FaultyFileSystem, self).rm(path, *args, **kwargs))

    def rm_file(self, path: str, *args: Any, **kwargs: Any) -> Any:
        return self._around("delete", path, lambda: super(FaultyFileSystem, self).rm_file(path, *args, **kwargs))


def register() -> None:
    """Make `faulty://` URLs reach `FaultyFileSystem` (done on import of procstore.testing)."""
    fsspec.register_implementation("faulty", FaultyFileSystem, clobber=True)


register()
