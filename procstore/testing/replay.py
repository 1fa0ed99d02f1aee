"""Upgrade safety: replay a real store's unfinished procedures with new code, in a sandbox.

Temporal's WorkflowReplayer for procstore: take a copy of a store (a live URL, or a snapshot
written by `procstore export`), load it into a fresh `memory://` store, start a manager on that
sandbox with your new code's loaders, and run every unfinished procedure to its end. The
report lists each procedure that could not be loaded (with the key and the reason), each
that failed (with its error and traceback), and each that did not end in time. The real
store is only read; what the procedures do outside the store is up to the `attach` you give
(point their clients at fakes).

    report = await replay("snapshot.tar.gz", attach=register_my_procedures)
    report.assert_ok()
"""

from __future__ import annotations

import asyncio
import io
import os
import tarfile
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from procstore._runtime.manager import ProcedureManager
from procstore.errors import ManagerStopped, ProcedureFailed
from procstore.state import ProcedureInfo
from procstore.store.folder import ProcedureKeys, StoredStatus
from procstore.store.history import History, HistoryStore
from procstore.store.keys import StepAndType, parent_folder, parse_key_name
from procstore.store.memory import MemoryStore
from procstore.store.open import open_state_store
from procstore.store.procedure_store import LoadProblem

SNAPSHOT_FOLDERS = ("procedure/", "requests/")
"""What a snapshot holds, under the store's parent path: the procedures and operator requests."""


@dataclass
class ReplayReport:
    """What replaying a store's unfinished procedures with new code found."""

    source: str
    procedures: int = 0
    """Unfinished procedures found (roots and children)."""
    done: list[str] = field(default_factory=list)
    failed: dict[str, str] = field(default_factory=dict)
    """Procedure id -> error (with traceback where the failure came from its code)."""
    not_loaded: list[LoadProblem] = field(default_factory=list)
    hung: list[str] = field(default_factory=list)
    rolled_back_as_before: dict[str, str] = field(default_factory=dict)
    """Procedure id -> its error: already failing in the snapshot (rolling back), and the new
    code completed its rollback. Not a problem: it failed in production, not here."""

    @property
    def ok(self) -> bool:
        """Every procedure found ran to its end; and some were found: a replay that found
        nothing (a wrong path, a store written under a `parent_path`) proves nothing."""
        return self.procedures > 0 and not (self.failed or self.not_loaded or self.hung)

    def assert_ok(self) -> None:
        if not self.ok:
            raise AssertionError(str(self))

    def __str__(self) -> str:
        lines = [
            f"replay of {self.source}: {self.procedures} unfinished procedures, {len(self.done)} ran to their end, "
            f"{len(self.failed)} failed, {len(self.not_loaded)} could not be loaded, {len(self.hung)} did not end"
            + (
                f", {len(self.rolled_back_as_before)} already failing in the snapshot finished their rollback"
                if self.rolled_back_as_before
                else ""
            )
        ]
        if not self.procedures:
            lines.append(
                "  nothing was replayed: no unfinished procedure found (a wrong source? a store written "
                "with a parent_path, which replay(parent_path=...) must name?)"
            )
        lines += [f"  not loaded: {problem}" for problem in self.not_loaded]
        lines += [f"  failed: {pid}: {error}" for pid, error in self.failed.items()]
        lines += [f"  did not end in time: {pid}" for pid in self.hung]
        lines += [
            f"  already failing in the snapshot; rollback completed: {pid}: {error.splitlines()[0] if error else ''}"
            for pid, error in self.rolled_back_as_before.items()
        ]
        return "\n".join(lines)


async def export_snapshot(
    url: str, path: str | os.PathLike[str], storage_options: dict[str, Any] | None = None, parent_path: str = ""
) -> int:
    """Write the procedures (and operator requests) of the store at `url` to a `.tar.gz`;
    returns how many keys. Keys are read as they are now: export from a stopped store, or
    accept a snapshot of a moment."""
    parent_path = parent_folder(parent_path)  # the managers' folder, `/` or not
    store = open_state_store(url, storage_options)
    try:
        keys = [k for folder in SNAPSHOT_FOLDERS for k in await store.walk(f"{parent_path}{folder}")]
        values = await store.get_many(keys)
    finally:
        await store.close()
    count = 0
    with tarfile.open(path, "w:gz") as archive:
        for key, value in zip(keys, values, strict=True):
            if isinstance(value, Exception):
                raise value
            if value is None:
                continue  # deleted while being read: the procedure ended meanwhile
            info = tarfile.TarInfo(key[len(parent_path) :])
            info.size, info.mtime = len(value), int(time.time())
            archive.addfile(info, io.BytesIO(value))
            count += 1
    return count


def _read_snapshot(source: str) -> list[tuple[str, bytes]] | None:
    """The keys of a snapshot file, or None if `source` is not one (a store URL, then)."""
    if not (source.endswith((".tar.gz", ".tgz", ".tar")) and os.path.isfile(source)):
        return None
    with tarfile.open(source, "r:*") as archive:
        files = [(m.name, archive.extractfile(m)) for m in archive.getmembers() if m.isfile()]
        return [(name, data.read()) for name, data in files if data is not None]


async def _load_into(
    sandbox: MemoryStore, source: str, storage_options: dict[str, Any] | None, parent_path: str
) -> None:
    snapshot = await asyncio.to_thread(_read_snapshot, source)
    if snapshot is not None:
        for key, value in snapshot:
            await sandbox.put(key, value)
        return
    parent_path = parent_folder(parent_path)  # the managers' folder, `/` or not
    store = open_state_store(source, storage_options)
    try:
        keys = [k for folder in SNAPSHOT_FOLDERS for k in await store.walk(f"{parent_path}{folder}")]
        for key, found in zip(keys, await store.get_many(keys), strict=True):
            if isinstance(found, bytes):
                await sandbox.put(key[len(parent_path) :], found)
    finally:
        await store.close()


async def replay(
    source: str,
    attach: Callable[[ProcedureManager], object],
    *,
    storage_options: dict[str, Any] | None = None,
    seconds_each: float = 60.0,
    manager_options: dict[str, Any] | None = None,
    parent_path: str = "",
) -> ReplayReport:
    """Run the unfinished procedures of `source` (a snapshot path or a store URL) to their
    end with the code `attach(manager)` registers, on a sandbox copy; see the module doc.
    A root that has not ended after `seconds_each` seconds is reported as hung.
    `parent_path` is the managers' own, for a store URL (a snapshot has it stripped already).
    A replay that finds no unfinished procedure is not `ok`."""
    sandbox = MemoryStore(f"replay-{uuid.uuid4().hex}")
    report = ReplayReport(source)
    try:
        await _load_into(sandbox, source, storage_options, parent_path)
        failing = _rolling_back(await sandbox.walk("procedure/"))
        # History records say which failures completed their rollback (`rolled back`).
        options = {"retry_delay": 0.01, "max_retry_delay": 0.5, "history": History(), **(manager_options or {})}
        manager = ProcedureManager(sandbox, **options)
        attach(manager)
        async with manager:
            report.not_loaded = list(manager.recovery_problems)
            unreadable = len(report.not_loaded)  # roots: not listed as procedures
            infos = [i for i in manager.list_procedures() if not i.state.is_ended()]
            roots = [i.id for i in infos if i.parent_id is None]
            await asyncio.gather(*(_run_one(manager, sandbox, pid, seconds_each, report, failing) for pid in roots))
            # Children are loaded by their parent as it resumes: look at each, once the roots ended.
            children = [i for i in manager.list_procedures() if i.parent_id is not None]
            for child in children:
                await _check_child(sandbox, child, report, failing)
            unfinished = {i.id for i in infos} | {c.id for c in children}
            report.procedures = len(unfinished) + unreadable
    finally:
        MemoryStore.forget(sandbox.name)
    return report


def _rolling_back(keys: list[str]) -> set[str]:
    """The procedures whose latest key is a `.rollback`: failing already, in production,
    before the snapshot (a rewound one keeps its old `.rollback` below its newer steps)."""
    found: dict[str, list[StepAndType]] = {}
    for key in keys:
        parts = key.split("/")
        if len(parts) == 3 and (parsed := parse_key_name(parts[2])) is not None:  # procedure/ID/NAME
            found.setdefault(parts[1], []).append(parsed)
    return {pid for pid, folder in found.items() if ProcedureKeys.of(folder).status is StoredStatus.ROLLING_BACK}


async def _failed(report: ReplayReport, sandbox: MemoryStore, pid: str, error: str, failing: set[str]) -> None:
    """A failure; or, for one already rolling back in the snapshot whose rollback the new
    code completed (its history record says `rolled back`), what it was before."""
    record = await HistoryStore(sandbox).find(pid) if pid in failing else None
    if record is not None and record.outcome == "rolled back":
        report.rolled_back_as_before[pid] = error
    else:
        report.failed[pid] = error


async def _check_child(sandbox: MemoryStore, child: ProcedureInfo, report: ReplayReport, failing: set[str]) -> None:
    """A child that ended under the new code, failed, could not be loaded, or is still running."""
    pid, state = str(child.id), child.state
    if state.is_poisoned:
        keys = await sandbox.walk(f"procedure/{pid}/")
        key = keys[-1] if keys else f"procedure/{pid}/"
        hint = "Make the new code load it (old data must keep loading), or fix the stored value"
        report.not_loaded.append(LoadProblem(key, child.id, state.error or "poisoned", hint, child.type_name))
    elif state.is_failed:
        error = f"{child.type_name}, a child of {child.parent_id}: {state.error}\n{state.traceback or ''}"
        await _failed(report, sandbox, pid, error.rstrip(), failing)
    elif not state.is_ended():
        report.hung.append(pid)
    elif pid not in report.done:
        report.done.append(pid)


async def _run_one(
    manager: ProcedureManager, sandbox: MemoryStore, pid: Any, seconds: float, report: ReplayReport, failing: set[str]
) -> None:
    watcher = manager.procedure_watcher(pid)
    if watcher is None:
        return
    try:
        await asyncio.wait_for(watcher.wait(), seconds)
        report.done.append(str(pid))
    except ProcedureFailed as e:
        state = manager.procedure_state(pid)
        trace = state.traceback if state is not None and state.traceback else ""
        await _failed(report, sandbox, str(pid), f"{e}\n{trace}".rstrip(), failing)
    except (TimeoutError, ManagerStopped):
        report.hung.append(str(pid))
