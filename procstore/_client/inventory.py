"""`Inventory`: what a store holds, procedure by procedure, for operators and the CLI.

Read-only, and tolerant: a value that cannot be read makes its procedure `UNREADABLE` (with
the reason) and never stops the others from being listed. Works on any store in the format,
whoever wrote it (GreptimeDB or procstore).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

from procstore._client.words import StatusWord, status_word
from procstore._logs import get_logger
from procstore._text import valid_unicode
from procstore.errors import ListingIncomplete
from procstore.ids import ProcedureId
from procstore.store.folder import ProcedureKeys, StoredStatus, decode_or_problem, ended_as, latest_first
from procstore.store.history import HistoryStore, Outcome
from procstore.store.keys import KeysByProcedure, KeyType, ParsedKey, procedure_dir, procedure_of_dir
from procstore.store.message import ProcedureMessage, StepWait
from procstore.store.procedure_store import ProcedureStore
from procstore.store.tree import descendants, reachable, stuck_chains

logger = get_logger("procstore.store")

_READ_CHUNK = 256
"""Values read per batch: the unit of progress reports."""

Progress = Callable[[int, int], None]
"""Called with (values read so far, values to read)."""


ENDINGS = {
    StoredStatus.COMMITTED: "done: the procedure finished",
    StoredStatus.FAILED: "failed: the procedure failed and ended; its rollback, if it has one, ran to its end",
}
"""What a `.commit` key says, by the status it gives its procedure: one wording for `show`,
the web page and the status `ls` and `tree` print."""


def status_of_keys(keys: Iterable[ParsedKey]) -> StoredStatus:
    """The status these keys tell (`ProcedureKeys.status`)."""
    return ProcedureKeys.of((k.step, k.key_type) for k in keys).status


@dataclass(slots=True)
class StoredProcedure:
    """One procedure's keys and what its latest readable message says."""

    procedure_id: ProcedureId
    keys: list[ParsedKey]
    """Every key, oldest first; the last one decides the status."""
    status: StoredStatus
    modified: float | None
    """When its latest key was written (seconds since the epoch), if the store says."""
    message: ProcedureMessage | None = None
    """The latest readable message (for a committed procedure, its last `.step`)."""
    problem: str | None = None
    """Why the latest value could not be read (for `UNREADABLE`, and for a finished one whose
    message below its `.commit` could not be), or the parent cycle it is in."""
    children: list[ProcedureId] = field(default_factory=list)
    first_written: float | None = None
    """When its oldest key still stored was written (its run's start, unless a resume or a
    rewind started it again), if the store says."""

    @property
    def latest(self) -> ParsedKey:
        return self.keys[-1]

    @property
    def type_name(self) -> str | None:
        return None if self.message is None else self.message.type_name

    @property
    def parent_id(self) -> ProcedureId | None:
        return None if self.message is None else self.message.parent_id

    @property
    def error(self) -> str | None:
        failed = self.status in (StoredStatus.ROLLING_BACK, StoredStatus.FAILED)
        return self.message.error if failed and self.message else None

    @property
    def waiting(self) -> str | None:
        """How an unfinished procedure's latest step said it waits (`sleeping until ...`,
        `waiting for signal ...`), or None. A running manager may have ended the wait since."""
        if self.status is not StoredStatus.UNFINISHED or self.message is None:
            return None
        wait = StepWait.of(self.message)
        return wait.describe() if wait.waits else None

    @property
    def is_finished(self) -> bool:
        return self.status in (StoredStatus.COMMITTED, StoredStatus.FAILED)

    @property
    def is_alive(self) -> bool:
        """Whether a manager would still run something of it (or must not lose it)."""
        return not self.is_finished


@dataclass(slots=True)
class Inventory:
    """Every procedure under a store's `procedure/` folder, and the keys that are not ours."""

    procedures: dict[ProcedureId, StoredProcedure]
    other_keys: list[str]
    """Keys under `procedure/` that are not procedure keys, as text to show: a name that is
    not UTF-8 has its bytes escaped (`bad\\xff.txt`), so every output format takes it."""
    unlisted: dict[str, str] = field(default_factory=dict)
    """Folders under `procedure/` that could not be listed, and why: what they hold is not
    shown, and no procedure whose parent may be in one is taken for an orphan or collected."""
    unlisted_ids: set[ProcedureId] = field(default_factory=set)
    """The procedures whose folder is one of `unlisted`."""
    cycle_entries: set[ProcedureId] = field(default_factory=set)
    """One member of each parent cycle: where a tree of the store shows that cycle."""
    outcomes: dict[ProcedureId, Outcome] = field(default_factory=dict)
    """How the finished procedures the store still holds ended, as their end records say
    (`read_outcomes`): the keys alone do not tell a rolled-back or cancelled end from a failure."""

    pending: dict[ProcedureId, str] = field(default_factory=dict)
    """The kind (`cancel`, `fail`) of each unfinished procedure's operator request not yet
    honoured (`read_outcomes`)."""

    def word(self, p: StoredProcedure) -> StatusWord:
        """The procedure's status in the one vocabulary (`procstore._client.words`)."""
        return self.outcomes.get(p.procedure_id) or status_word(p.status)

    def is_orphan(self, p: StoredProcedure) -> bool:
        """Unfinished, with a parent that is not in the store: nothing will run it (a
        manager reports it as an orphaned subprocedure and keeps its keys)."""
        return (
            p.is_alive
            and p.parent_id is not None
            and p.parent_id not in self.procedures
            and p.parent_id not in self.unlisted_ids
        )

    def roots(self) -> list[StoredProcedure]:
        """Procedures without a parent, whose parent is no longer stored, and one member of
        each parent cycle (which has no root, and would be shown nowhere else; every member
        would show the whole cycle again)."""
        return [
            p
            for p in self.procedures.values()
            if p.parent_id is None or p.parent_id not in self.procedures or p.procedure_id in self.cycle_entries
        ]

    def ancestors(self, p: StoredProcedure) -> list[StoredProcedure]:
        """Its parent, grandparent... as stored, nearest first (each once: a cycle ends the walk)."""
        chain = reachable(p.procedure_id, self._stored_parent)
        return [self.procedures[pid] for pid in chain[1:]]

    def _stored_parent(self, procedure_id: ProcedureId) -> list[ProcedureId]:
        parent = self.procedures[procedure_id].parent_id
        return [parent] if parent is not None and parent in self.procedures else []

    def descendants(self, procedure_id: ProcedureId) -> list[StoredProcedure]:
        """Children, grandchildren... of a procedure, deepest first (each once, cycles too)."""
        below = descendants(procedure_id, lambda pid: self.procedures[pid].children)
        return [self.procedures[pid] for pid in reversed(below)]

    def collectable(self) -> list[StoredProcedure]:
        """Committed procedures a manager would delete: those without a live parent. One
        whose latest value below its `.commit` cannot be read is kept, as recovery keeps it:
        whose child it was is unknown (an earlier message may name another parent than the
        unreadable one did), so it may be the child a parent still waits for."""
        out = []
        for p in self.procedures.values():
            parent = self.procedures.get(p.parent_id) if p.parent_id is not None else None
            if (
                p.is_finished
                and p.problem is None
                and (parent is None or not parent.is_alive)
                and p.parent_id not in self.unlisted_ids
            ):
                out.append(p)
        return out


async def read_inventory(store: ProcedureStore, progress: Progress | None = None) -> Inventory:
    """List the store and read each procedure's latest message. Raises `StoreError` only if
    the listing itself fails; unreadable values are reported per procedure.

    The work over the listing and the values runs in a thread, between the reads: a store
    of many keys, a long chain or a big cycle must not hold up the event loop (`procstore
    serve` answers other requests meanwhile)."""
    unlisted: dict[str, str] = {}
    try:
        modified = await store.store.walk_modified(store.proc_path)
    except ListingIncomplete as e:
        modified, unlisted = e.listed, e.unlisted
    procedures, to_read, others = await asyncio.to_thread(_procedures_of, store.proc_path, modified)
    values = await _read_in_chunks(store, [str(key) for _, key in to_read], progress)
    for procedure, key in await asyncio.to_thread(_decode_latest, to_read, values):
        procedure.message = await _earlier_message(store, procedure, key)
    cycle_entries = await asyncio.to_thread(_link, procedures)
    ids = {folder_of for folder in unlisted if (folder_of := procedure_of_dir(store.proc_path, folder)) is not None}
    shown_unlisted = {valid_unicode(folder): valid_unicode(why) for folder, why in unlisted.items()}
    return Inventory(procedures, [valid_unicode(k) for k in others], shown_unlisted, ids, cycle_entries)


async def read_outcomes(store: ProcedureStore, inventory: Inventory) -> None:
    """Fill `inventory.outcomes` from the end records of its finished procedures' last runs
    (one read each: a store holds few, the failed roots kept for an operator), and
    `inventory.pending` from the operator requests (one listing, a read of each request)."""
    for pid, request in (await store.requests.list_all()).items():
        if (p := inventory.procedures.get(pid)) is not None and not p.is_finished:
            inventory.pending[pid] = request.kind
    finished = [p for p in inventory.procedures.values() if p.is_finished]
    history = HistoryStore(store.store, store.parent_path)
    records = await history.read_ends([(p.procedure_id, p.message.run if p.message else None) for p in finished])
    for p, record in zip(finished, records, strict=True):
        if record is not None:
            inventory.outcomes[p.procedure_id] = record.outcome


async def read_procedure(
    store: ProcedureStore, procedure_id: ProcedureId
) -> tuple[StoredProcedure | None, dict[str, float | None]]:
    """One procedure as `read_inventory` reads it, from a listing of its folder alone (None
    if the store holds no key of it), and each of its keys' last-modified time where known."""
    modified = await store.store.walk_modified(procedure_dir(store.proc_path, procedure_id))
    procedures, to_read, _ = _procedures_of(store.proc_path, modified)
    values = await store.store.get_many([str(key) for _, key in to_read])
    for procedure, key in _decode_latest(to_read, values):
        procedure.message = await _earlier_message(store, procedure, key)
    return procedures.get(procedure_id), modified


_Latest = tuple["StoredProcedure", ParsedKey]
"""A procedure and its latest key that holds a message."""


def _procedures_of(
    prefix: str, modified: dict[str, float | None]
) -> tuple[dict[ProcedureId, StoredProcedure], list[_Latest], list[str]]:
    """The procedures a listing holds, the key to read of each, and the keys that are none."""
    grouped = KeysByProcedure.group(prefix, modified)
    procedures: dict[ProcedureId, StoredProcedure] = {}
    to_read: list[_Latest] = []
    for pid, found in grouped.steps.items():
        keys = [ParsedKey(prefix, pid, step, kind) for step, kind in sorted(found, key=latest_first)]
        folder = ProcedureKeys.of(found)
        procedure = procedures[pid] = StoredProcedure(pid, keys, folder.status, modified.get(str(keys[-1])))
        procedure.first_written = modified.get(str(keys[0]))
        if folder.newest_message is not None:
            to_read.append((procedure, ParsedKey(prefix, pid, *folder.newest_message)))
    return procedures, to_read, grouped.others


def _decode_latest(to_read: list[_Latest], values: Sequence[bytes | Exception | None]) -> list[_Latest]:
    """Decode each latest message; returns the procedures whose latest could not be, whose
    type and parent an earlier message may tell."""
    unreadable: list[_Latest] = []
    for (procedure, key), raw in zip(to_read, values, strict=True):
        read = decode_or_problem(raw)
        if isinstance(read, ProcedureMessage):
            procedure.message = read
        else:
            procedure.problem = f"{key}: {read}"
            if not procedure.is_finished:  # finished is finished, readable or not
                procedure.status = StoredStatus.UNREADABLE
            unreadable.append((procedure, key))
    return unreadable


def _link(procedures: dict[ProcedureId, StoredProcedure]) -> set[ProcedureId]:
    """Each procedure's children, and its parent cycle if it is in one; returns one member
    of each cycle."""
    for procedure in procedures.values():
        parent = procedures.get(procedure.parent_id) if procedure.parent_id is not None else None
        if parent is not None:
            parent.children.append(procedure.procedure_id)
    return _flag_parent_cycles(procedures)


_CYCLE_SHOWN = 6
"""Ids of a parent cycle its problem text names; a longer cycle says how many more."""


def _flag_parent_cycles(procedures: dict[ProcedureId, StoredProcedure]) -> set[ProcedureId]:
    """Mark every procedure whose parent links loop back to it; returns one member of each
    cycle (where the walk that found it met it first)."""
    parent_of = {pid: p.parent_id for pid, p in procedures.items()}
    cycles = {stuck.culprit: list(stuck.cycle) for stuck in stuck_chains(parent_of).values()}
    for cycle in cycles.values():
        for at, pid in enumerate(cycle):
            _mark_cycle(procedures[pid], cycle, at)
    return set(cycles)


def _mark_cycle(procedure: StoredProcedure, cycle: list[ProcedureId], at: int) -> None:
    """`cycle` follows parent links and `procedure` is `cycle[at]`. Its text names the few
    ids from it on, never the whole cycle: one text per member of a cycle of N is N work,
    where N ids each would be N squared."""
    length = len(cycle)
    named = [cycle[(at + i) % length] for i in range(min(length, _CYCLE_SHOWN))]
    shown = " -> ".join(map(str, named))
    if length > _CYCLE_SHOWN:
        shown += f" -> ... {length - _CYCLE_SHOWN} more"
    procedure.status = StoredStatus.PARENT_CYCLE
    procedure.problem = f"its parent links form a cycle: {shown} -> {cycle[at]}; nothing resumes it"


async def read_history(
    store: ProcedureStore, procedure_id: ProcedureId
) -> list[tuple[ParsedKey, float | None, ProcedureMessage | None, str | None]]:
    """Every key of one procedure, oldest first: (key, modified, message, why unreadable)."""
    modified = await store.store.walk_modified(f"{store.proc_path}{procedure_id}/")
    grouped = KeysByProcedure.group(store.proc_path, modified)
    for other in grouped.others:
        logger.warning("not a procedure key, ignored: %s", valid_unicode(other))
    found = sorted(grouped.steps.get(procedure_id, []), key=latest_first)
    keys = [ParsedKey(store.proc_path, procedure_id, step, kind) for step, kind in found]
    values = await store.store.get_many([str(k) for k in keys])
    # Off the event loop: a procedure's steps can be megabytes each.
    return await asyncio.to_thread(_history_of, keys, values, modified)


def _history_of(
    keys: list[ParsedKey], values: Sequence[bytes | Exception | None], modified: dict[str, float | None]
) -> list[tuple[ParsedKey, float | None, ProcedureMessage | None, str | None]]:
    history: list[tuple[ParsedKey, float | None, ProcedureMessage | None, str | None]] = []
    for key, raw in zip(keys, values, strict=True):
        if key.key_type is KeyType.COMMIT:
            history.append((key, modified.get(str(key)), None, None))
            continue
        read = decode_or_problem(raw)
        if isinstance(read, ProcedureMessage):
            history.append((key, modified.get(str(key)), read, None))
        else:
            history.append((key, modified.get(str(key)), None, read))
    return history


def endings(history: Sequence[tuple[ParsedKey, object, object, object]]) -> list[StoredStatus | None]:
    """For each key of `read_history`'s list, the status a `.commit` there ends its procedure
    with (`committed`, or `failed` above a rollback); None for other keys. One pass: a
    folder of thousands of `.commit` keys (anyone who can write the bucket can add them)
    is as cheap as its keys."""
    out: list[StoredStatus | None] = []
    below: KeyType | None = None  # the latest message at a lower step than the key at hand
    beside: KeyType | None = None  # the latest message so far at the key's own step
    step = None
    for key, *_ in history:
        if key.step != step:
            below, beside, step = below if beside is None else beside, None, key.step
        if key.key_type is not KeyType.COMMIT:
            beside = key.key_type
            out.append(None)
        else:
            # The message a commit ends is below its step (`ProcedureKeys.newest_message`).
            out.append(ended_as(beside if below is None else below))
    return out


async def _earlier_message(
    store: ProcedureStore, procedure: StoredProcedure, failed: ParsedKey
) -> ProcedureMessage | None:
    """The newest readable message before `failed`, for the type and parent of an unreadable procedure."""
    below = procedure.keys[: procedure.keys.index(failed)]
    earlier = [k for k in below if k.key_type is not KeyType.COMMIT]
    for key in reversed(earlier[-3:]):  # a few tries: enough for a torn last write
        read = decode_or_problem(await store.store.get(str(key)))
        if isinstance(read, ProcedureMessage):
            return read
    return None


async def _read_in_chunks(
    store: ProcedureStore, keys: Sequence[str], progress: Progress | None
) -> list[bytes | Exception | None]:
    values: list[bytes | Exception | None] = []
    for start in range(0, len(keys), _READ_CHUNK):
        values += await store.store.get_many(keys[start : start + _READ_CHUNK])
        if progress is not None:
            progress(len(values), len(keys))
    return values
