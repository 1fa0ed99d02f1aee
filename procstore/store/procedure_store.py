"""`ProcedureStore`: procedures' steps, commits and rollbacks on a `StateStore`.

The layout and the rules are GreptimeDB's (see docs/stores.md, "The layout"): one folder per
procedure, one key per persisted step, and the highest step decides what a procedure is
on recovery. A value that cannot be read is reported with its key and skipped; it is never
deleted and never stops the others from loading.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Coroutine, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from operator import itemgetter
from typing import Any

from procstore._aio import gather_settled
from procstore._bulk import collector_paused
from procstore._logs import get_logger, procedure_fields
from procstore.errors import Fenced, ListingIncomplete, ProcedureError, StoreError
from procstore.ids import ProcedureId
from procstore.store.activity import ActivityStore
from procstore.store.deletes_in_doubt import DeletesInDoubt
from procstore.store.folder import ProcedureKeys, decode_or_problem, latest_first, latest_key
from procstore.store.history import History, HistoryStore
from procstore.store.keys import (
    MAX_STEP,
    PROC_PATH,
    FolderLatest,
    KeysByProcedure,
    KeyType,
    ParsedKey,
    StepAndType,
    key_text,
    latest_in_sorted,
    parent_folder,
    procedure_dir,
    procedure_of_dir,
)
from procstore.store.message import NO_WAIT, ProcedureMessage, StepWait, decoded_directly
from procstore.store.rate_starts import RateStartsStore
from procstore.store.requests import RESUME_PATH, RequestStore
from procstore.store.signals import SignalStore
from procstore.store.state_store import StateStore

logger = get_logger("procstore.store")

_DELETE_CONCURRENCY = 32
_REREAD_DELAYS = (0.05, 0.5, 2.0)


@dataclass(frozen=True, slots=True)
class LoadProblem:
    """A procedure that could not be loaded, and what an operator can do about it."""

    key: str
    procedure_id: ProcedureId | None
    reason: str
    hint: str
    type_name: str | None = None

    def __str__(self) -> str:
        who = f"procedure {self.procedure_id}" if self.procedure_id else "a key"
        kind = f" ({self.type_name})" if self.type_name else ""
        return f"{who}{kind} at {self.key}: {self.reason}. {self.hint}"

    def log_fields(self) -> dict[str, object]:
        """`extra=` for a record about it: the fields of `procstore._logs` (none for a key
        that names no procedure)."""
        if self.procedure_id is None:
            return {}
        number = self.key.rsplit("/", 1)[-1].split(".", 1)[0]
        step = int(number) if number.isdigit() else None
        return {"procedure_id": str(self.procedure_id), "type_name": self.type_name, "step": step}


UNREADABLE_HINT = (
    "It was skipped and left untouched: inspect the key, then restore a good value or delete "
    "the procedure's folder, and restart"
)


UNLISTED_HINT = (
    "Nothing in it, nor any descendant of it, was read, run or deleted, but a parent that waits "
    "for it fails, as for an unreadable value: fix the folder's permissions, then restart"
)


@dataclass(slots=True)
class ProcedureMessages:
    """What `load_messages` found, by the suffix of each procedure's highest key."""

    messages: dict[ProcedureId, ProcedureMessage] = field(default_factory=dict)
    """Unfinished procedures (highest key `.step`), to resume."""
    rollback_messages: dict[ProcedureId, ProcedureMessage] = field(default_factory=dict)
    """Failed procedures (highest key `.rollback`), whose rollback must be (re)run."""
    finished_ids: list[ProcedureId] = field(default_factory=list)
    """Finished procedures (highest key `.commit`), whose keys are to be deleted."""
    commit_steps: dict[ProcedureId, int] = field(default_factory=dict)
    """Each finished procedure's `.commit` step, the `through_step` of its deletion: a key
    above it is a restart's copy written since (`delete_procedure`)."""
    finished_messages: dict[ProcedureId, ProcedureMessage | None] = field(default_factory=dict)
    """Each finished procedure's highest message below its `.commit` (its parent, type and,
    if it rolled back, its error); None only when it has no such key at all. A value that
    exists but cannot be read is a problem instead: the procedure is not listed here, so
    nothing deletes it without knowing whose child it is."""
    rolled_back_ids: set[ProcedureId] = field(default_factory=set)
    """Finished procedures whose message below the `.commit` is a `.rollback`: they failed
    and their rollback ran to its end (the `.commit` above it says nothing more is to run)."""
    problems: list[LoadProblem] = field(default_factory=list)
    """Procedures skipped because their highest value could not be read."""
    stray_ids: list[ProcedureId] = field(default_factory=list)
    """Unfinished-looking procedures with no key at step 0 (with `skip_strays`): keys of a
    finished, deleted procedure re-created by a late write of a paused former leader."""

    @property
    def unreadable_ids(self) -> set[ProcedureId]:
        return {p.procedure_id for p in self.problems if p.procedure_id is not None}

    def unfinished(self) -> dict[ProcedureId, ProcedureMessage]:
        """Every unfinished procedure's latest message: `messages`, then `rollback_messages`."""
        return self.messages | self.rollback_messages


def _set_strays_apart(result: ProcedureMessages, candidates: list[ProcedureId]) -> list[ProcedureId]:
    """Of the unfinished-looking folders without a step 0, the strays: keys a paused former
    leader re-created after the run had ended and been deleted. A folder whose latest
    message is of a restarted run (`run` above 1) is not one: a resume or rewind by another
    process (`procstore rewind`) wrote its copy while the ended run's keys were being
    deleted, and that copy is all the new run needs (a copy of a run that ended too is
    known by its end record, see `procstore.store.history`)."""
    strays: list[ProcedureId] = []
    for pid in candidates:
        message = result.messages.get(pid) or result.rollback_messages.get(pid)
        if message is not None and message.run > 1:
            continue
        result.messages.pop(pid, None)
        result.rollback_messages.pop(pid, None)
        result.problems = [p for p in result.problems if p.procedure_id != pid]
        strays.append(pid)
    return strays


class ProcedureStore:
    """Reads and writes procedures under `{parent_path}procedure/` of a `StateStore`."""

    def __init__(
        self,
        store: StateStore,
        parent_path: str = "",
        *,
        skip_strays: bool = False,
        history: History | None = None,
        deletes_in_doubt: DeletesInDoubt | None = None,
    ) -> None:
        parent_path = parent_folder(parent_path)
        self.store = store
        self.parent_path = parent_path
        self.proc_path = f"{parent_path}{PROC_PATH}"
        self.requests = RequestStore(store, parent_path)
        """Operator requests (`fail`, `cancel`) for the procedures of this store."""
        self.resumes = RequestStore(store, parent_path, RESUME_PATH)
        """Nudges to load a restarted procedure again (`procstore resume`, `rewind`)."""
        self.signals = SignalStore(store, parent_path)
        """Signals sent to the procedures of this store (`ProcedureManager.signal`)."""
        self.rate_starts = RateStartsStore(store, parent_path)
        """The recent starts of rate-limited types, counted across restarts and takeovers."""
        self.activities = ActivityStore(store, parent_path)
        """What running procedures do between their steps, for operators to read."""
        self.history = HistoryStore(store, parent_path, history)
        """Where each ended run's end record (its history record) is written."""
        self.skip_strays = skip_strays
        """Whether `load_messages` sets apart unfinished-looking procedures with no key at
        step 0 (`ProcedureMessages.stray_ids`) and deletes empty latest keys (torn creates).
        Only managers sharing a store by lease leave those; a single manager reports them as
        usual (a store written by hand, say)."""
        self.deletes_in_doubt = DeletesInDoubt() if deletes_in_doubt is None else deletes_in_doubt
        """Folders not to create again yet: a request of their deletion may still land. The
        manager's, shared by its terms: a request its earlier term sent may land in this one."""
        self.unknown_fields: dict[ProcedureId, bytes] = {}
        """The message fields procstore does not know (`ProcedureMessage.extra`) of each
        procedure read that has any, written back on every message written for it after:
        what another writer (GreptimeDB's `context`) added survives procstore's writes."""

    def keep_unknown_fields(self, procedure_id: ProcedureId, message: ProcedureMessage) -> None:
        """Write `message`'s unknown fields back on every later message of the procedure."""
        if message.extra:
            self.unknown_fields[procedure_id] = message.extra

    def key(self, procedure_id: ProcedureId, step: int, key_type: KeyType) -> str:
        return key_text(self.proc_path, procedure_id, step, key_type)

    def _key_to_write(self, procedure_id: ProcedureId, step: int, key_type: KeyType) -> str:
        """`key`, for a write: `ProcedureError` (not retried: nothing is written) above
        `MAX_STEP`, where a key is no procedure's and every reader ignores it (a state stored
        there would be lost, and the step that made it would run again)."""
        if step > MAX_STEP:
            raise ProcedureError(
                f"procedure {procedure_id}: step {step} is above the largest a key can carry ({MAX_STEP}): "
                "its next key cannot be written"
            )
        return self.key(procedure_id, step, key_type)

    def store_procedure(
        self,
        procedure_id: ProcedureId,
        step: int,
        type_name: str,
        data: str,
        parent_id: ProcedureId | None,
        run: int = 1,
        wait: StepWait | None = None,
    ) -> Coroutine[Any, Any, None]:
        """Create `{step}.step` holding one persisted state of `run`; `Fenced` if another writer got there first.
        `wait`: the durable wait the step ends with, and the signals it consumed.

        Not a coroutine of its own (one frame fewer in every step's write): the key and the
        bytes are made at the call, the write when the coroutine it returns is awaited."""
        wait = wait or NO_WAIT
        message = ProcedureMessage(
            type_name,
            data,
            parent_id,
            step,
            None,
            run,
            wait.wake_at,
            wait.signal,
            wait.consumed,
            self.unknown_fields.get(procedure_id, b"") if self.unknown_fields else b"",
        )
        key = self._key_to_write(procedure_id, step, KeyType.STEP)
        return self._create_or_fence(procedure_id, key, message.encode())

    async def _create(self, key: str, value: bytes) -> bool | None:
        """Create `key`, never overwriting it, saying who wrote it: True, this call; None, it
        held these bytes already (our earlier write whose answer was lost, or a write of the
        same bytes before); False, it holds another writer's bytes."""
        if await self.store.put_if_absent(key, value):
            return True
        return None if await self.store.get(key) == value else False

    async def _create_or_fence(self, procedure_id: ProcedureId, key: str, value: bytes) -> None:
        """`_create`, raising `Fenced` if another writer got there first. Its body written
        out: every step's write awaits this, and `_create` would be one more coroutine."""
        if not await self.store.put_if_absent(key, value) and await self.store.get(key) != value:
            raise Fenced(key, procedure_id)

    async def create_procedure(
        self,
        procedure_id: ProcedureId,
        type_name: str,
        data: str,
        parent_id: ProcedureId | None,
        run: int = 1,
    ) -> bool:
        """Write a new procedure's submitted state as `0.step` (of `run`: a child's is its
        parent's), only if it does not exist.

        Returns `False` if that key already holds something else. A value equal to ours
        counts as written: it is our own earlier write whose answer was lost.
        """
        self.unknown_fields.pop(procedure_id, None)  # an earlier procedure's of the same id
        value = ProcedureMessage(type_name, data, parent_id, 0, None, run).encode()
        if self.deletes_in_doubt:
            await self.deletes_in_doubt.settled(procedure_id)
        return await self._create(self.key(procedure_id, 0, KeyType.STEP), value) is not False

    async def create_submitted(self, procedure_id: ProcedureId, type_name: str, data: str) -> bool | None:
        """`create_procedure` for a submit, saying who wrote the key (see `_create`)."""
        self.unknown_fields.pop(procedure_id, None)  # an earlier procedure's of the same id
        return await self._create(
            self.key(procedure_id, 0, KeyType.STEP), ProcedureMessage(type_name, data, None, 0).encode()
        )

    def commit_procedure(self, procedure_id: ProcedureId, step: int) -> Coroutine[Any, Any, None]:
        """Mark the procedure finished: an empty `{step}.commit` (create-only, as every step
        key). As `store_procedure`, the coroutine that writes it."""
        return self._create_or_fence(procedure_id, self._key_to_write(procedure_id, step, KeyType.COMMIT), b"")

    async def rollback_procedure(self, procedure_id: ProcedureId, message: ProcedureMessage) -> None:
        """Mark the procedure failed: `{message.step}.rollback` holding `message` (with `error`,
        and the procedure's unknown fields if `message` has none of its own)."""
        key = self._key_to_write(procedure_id, message.step, KeyType.ROLLBACK)
        if not message.extra and (extra := self.unknown_fields.get(procedure_id)):
            message = dataclasses.replace(message, extra=extra)
        await self._create_or_fence(procedure_id, key, message.encode())

    async def holds_keys(self, procedure_id: ProcedureId) -> bool:
        """Whether the store holds any key of the procedure; True if its folder cannot be
        listed (what may be there is kept as if it were: its request, say)."""
        try:
            return bool(await self.store.walk(procedure_dir(self.proc_path, procedure_id)))
        except StoreError:
            return True

    async def procedure_keys(self, procedure_id: ProcedureId) -> list[ParsedKey]:
        """Every key of one procedure, by step."""
        keys = await self.store.walk(procedure_dir(self.proc_path, procedure_id))
        parsed = [ParsedKey.parse(self.proc_path, k) for k in keys]
        return sorted((p for p in parsed if p is not None), key=lambda p: p.step)

    async def check_unfinished(self, procedure_id: ProcedureId, doing: str) -> None:
        """Raise `ProcedureError` (saying there is nothing to do `doing`) unless the store holds
        the procedure and its latest key is not its end: what an operator's request and a
        signal need of a procedure no manager here runs."""
        keys = await self.procedure_keys(procedure_id)
        if not keys:
            raise ProcedureError(
                f"procedure {procedure_id} is not in the store (finished and deleted, or never submitted): "
                f"nothing to {doing}"
            )
        if (latest := latest_key(keys)).key_type is KeyType.COMMIT:
            raise ProcedureError(
                f"procedure {procedure_id} has already ended (its latest key is {latest.step}.commit): "
                f"nothing to {doing}"
            )

    async def delete_procedure(
        self,
        procedure_id: ProcedureId,
        keys: Sequence[ParsedKey] | None = None,
        *,
        through_step: int | None = None,
        everything: bool = False,
    ) -> None:
        """Delete a procedure's keys in the stages of `_deletion_stages`, then the folder.

        Each stage is verified gone before the next starts (a store that cannot delete a key
        raises), so a crash or an error part way leaves the highest terminal key and the
        procedure still reads as finished with the same outcome, never as unfinished or as
        rolling back.
        `keys`, when the caller knows every key the procedure has (it wrote them all), saves
        the listing; a key it does not name would be left behind, so only a writer sure of
        every write passes them.

        `through_step`: the highest step of the run that ended. A listed key above it belongs
        to a later run of the same id (an operator's resume or rewind writes its copy above
        every key, and may copy the earlier steps again): the folder is the later run's then,
        and nothing is deleted. Without `through_step`, a key above the highest `.commit`
        whose message is of a later run than the key below that commit (or that cannot be
        read) is such a key. `everything` deletes every key, a later run's too (an operator's
        `procstore delete`).
        """
        folder = procedure_dir(self.proc_path, procedure_id)
        if keys is None:
            listed = await self.store.walk(folder)
            if not everything and await self._later_run_in(listed, through_step):
                logger.info(
                    "procedure %s runs again (a later run's keys are in its folder): its keys stay",
                    procedure_id,
                    extra=procedure_fields(procedure_id),
                )
                return
            keys = [parsed for key in listed if (parsed := self._parsed_or_warned(procedure_id, key)) is not None]
        self.unknown_fields.pop(procedure_id, None)
        try:
            await self.store.delete_in_order(*_deletion_stages(keys), folder)
        except BaseException:
            self.deletes_in_doubt.note(procedure_id)
            raise

    def _parsed_or_warned(self, procedure_id: ProcedureId, key: str) -> ParsedKey | None:
        parsed = ParsedKey.parse(self.proc_path, key)
        if parsed is None:
            about = procedure_fields(procedure_id)
            logger.warning("unknown key while deleting procedure %s: %s", procedure_id, key, extra=about)
        return parsed

    async def _later_run_in(self, keys: Sequence[str], through_step: int | None) -> bool:
        """Whether a listed key belongs to a run after the one being deleted (see
        `delete_procedure`)."""
        parsed = [p for key in keys if (p := ParsedKey.parse(self.proc_path, key)) is not None]
        if through_step is not None:
            return any(p.step > through_step for p in parsed)
        top = max((p.step for p in parsed if p.key_type is KeyType.COMMIT), default=None)
        above = [p for p in parsed if top is not None and p.step > top]
        if top is None or not above:
            return False
        under = [p for p in parsed if p.step < top]
        if not under:
            return True  # which run the keys above are cannot be told: they stay
        below = latest_key(under)
        runs = [_run_of(v) for v in await self._read_all([str(below), *(str(p) for p in above)])]
        return runs[0] is None or any(run is None or run > runs[0] for run in runs[1:])

    async def delete_procedures(
        self,
        procedure_ids: Iterable[ProcedureId],
        known: Mapping[ProcedureId, Sequence[ParsedKey]] | None = None,
        through: Mapping[ProcedureId, int] | None = None,
    ) -> None:
        """`delete_procedure` for each id, several at a time, in no particular order (with
        the keys of those in `known`, and no key above the step `through` gives)."""
        limit = asyncio.Semaphore(_DELETE_CONCURRENCY)
        known = known or {}
        through = through or {}

        async def one(pid: ProcedureId) -> None:
            async with limit:
                await self.delete_procedure(pid, known.get(pid), through_step=through.get(pid))

        await gather_settled(*(one(pid) for pid in procedure_ids))

    async def list_keys(self) -> tuple[list[str], list[LoadProblem]]:
        """Every key under `procedure/`, sorted, and a problem for each folder in it that
        could not be listed (`ListingIncomplete`): a procedure whose folder cannot be read
        is unreadable, kept and reported like one whose value cannot be read."""
        try:
            return await self.store.walk(self.proc_path), []
        except ListingIncomplete as e:
            problems = [self._unlisted(folder, why) for folder, why in sorted(e.unlisted.items())]
            return sorted(e.listed), [p for p in problems if p is not None]

    def _unlisted(self, folder: str, why: str) -> LoadProblem | None:
        """The problem of a procedure whose folder could not be listed; None (a warning) for
        a folder that is no procedure's: keys in it would not be a procedure's either."""
        pid = procedure_of_dir(self.proc_path, folder)
        if pid is None:
            logger.warning("cannot list %s (%s), left out: not a procedure's folder", folder, why)
            return None
        problem = LoadProblem(folder, pid, f"its folder cannot be listed ({why})", UNLISTED_HINT)
        logger.error("skipping %s", problem, extra=problem.log_fields())
        return problem

    async def load_messages(self) -> ProcedureMessages:
        """Scan every procedure and classify it by its highest key (the latest-step rule)."""
        keys, unlisted = await self.list_keys()
        with collector_paused():
            latest_of, texts, stray, below_commit = self._latest_keys(keys)
        values = await self._read_all(texts)
        if self.skip_strays:
            to_read = _keys_read(latest_of, below_commit)
            # Only a latest key is stepped over; a message below a `.commit` is read for its
            # parent alone, and an empty one there is an unreadable value like any other.
            torn = [
                i
                for i, ((pid, _, kt), v) in enumerate(zip(to_read, values, strict=True))
                if v == b"" and kt is not KeyType.COMMIT and pid not in below_commit
            ]
            if torn and await self._step_over_torn(to_read, values, torn, keys):
                return await self.load_messages()
            latest_of.update((to_read[i][0], to_read[i][1:]) for i in torn)
        with collector_paused():
            result = self._classify(latest_of, below_commit, values)
        result.stray_ids = _set_strays_apart(result, stray)
        result.problems.extend(unlisted)
        return result

    async def _step_over_torn(
        self,
        to_read: list[_Key],
        values: list[bytes | Exception | None],
        torn: list[int],
        keys: list[str],
    ) -> bool:
        """Resume past empty latest keys: creates cut off by a killed writer.

        Every message is non-empty JSON, so an empty latest `.step` or `.rollback` holds
        nothing (a test S3 server can store one; real S3 and a local directory cannot). The
        key is kept, since a create-only key is never written twice, and the procedure resumes
        from the nearest readable step below it: `values[i]` becomes that step's bytes, under
        the torn key's step number, so the next write goes one above. A torn step 0 (a submit
        cut off before it returned) has nothing below: it is deleted, and True says to list
        again. Only the `.step` keys listed below it are read: keys below the latest are
        never created later, and a torn key can sit billions of step numbers above the rest.
        """
        listed = KeysByProcedure.group(self.proc_path, keys).steps
        unsubmitted = [self.key(*to_read[i]) for i in torn if to_read[i][1] == 0]
        for i in torn:
            pid, torn_step, _ = to_read[i]
            for step in sorted({s for s, kt in listed[pid] if kt is KeyType.STEP and s < torn_step}, reverse=True):
                below = await self.store.get(self.key(pid, step, KeyType.STEP))
                if below:
                    values[i] = below
                    to_read[i] = (pid, torn_step, KeyType.STEP)
                    break
        logger.warning(
            "%d empty latest keys left by killed writers (resuming from the step below; deleting those at step 0): %s",
            len(torn),
            ", ".join(self.key(*to_read[i]) for i in torn[:10]),
        )
        if unsubmitted:
            await self.store.batch_delete(unsubmitted)
        return bool(unsubmitted)

    async def _read_all(self, keys: list[str]) -> list[bytes | Exception | None]:
        """`get_many`, reading again what failed (a 503, a reset): a procedure skipped for a
        transient error would wait for the next start."""
        values = await self.store.get_many(keys)
        for delay in _REREAD_DELAYS:
            failed = [i for i, v in enumerate(values) if isinstance(v, Exception)]
            if not failed:
                break
            await asyncio.sleep(delay)
            again = await self.store.get_many([keys[i] for i in failed])
            for i, value in zip(failed, again, strict=True):
                values[i] = value
        return values

    def _latest_keys(
        self, keys: list[str]
    ) -> tuple[dict[ProcedureId, StepAndType], list[str], list[ProcedureId], dict[ProcedureId, StepAndType]]:
        """Each procedure's latest key, the texts of the keys to read (`_keys_read`: the
        latest, or for a committed procedure its last `.step`: its parent and type), the
        stray procedures, and of the keys read those below a `.commit`.

        Steps are numbered from 0 without gaps and only a finished procedure loses keys, so an
        unfinished one always has a key at step 0 (GreptimeDB's too)."""
        folders = self._each_latest(keys)
        skip_strays = self.skip_strays
        if not skip_strays and KeyType.COMMIT not in map(_KEY_TYPE, map(_LATEST, folders)):
            # Nothing finished, no strays looked for: each latest key is read as listed.
            return dict(map(_ID_AND_LATEST, folders)), list(map(_LATEST_TEXT, folders)), [], {}
        texts: list[str] = []
        latest_of: dict[ProcedureId, StepAndType] = {}
        stray: list[ProcedureId] = []
        below_commit: dict[ProcedureId, StepAndType] = {}
        for pid, latest, latest_text, below, below_key, lowest in folders:
            latest_of[pid] = latest
            if latest[1] is not KeyType.COMMIT:
                texts.append(latest_text)
                if skip_strays and latest[0] > 0 and lowest > 0:
                    stray.append(pid)  # read all the same: its run decides (`_set_strays_apart`)
            elif below is not None:
                # A finished procedure's parent, type and outcome are in its highest message
                # below the commit: a `.step` (it succeeded) or a `.rollback` (it rolled back).
                texts.append(below_key or self.key(pid, *below))
                below_commit[pid] = below
        return latest_of, texts, stray, below_commit

    def _each_latest(self, keys: list[str]) -> list[FolderLatest]:
        """Per procedure: its latest key and that key's text, the highest key below a latest
        `.commit` (and its text, or None to format it), and its lowest step (with
        `skip_strays` only; 0 without, on either path)."""
        if (fast := latest_in_sorted(self.proc_path, keys, lowest=self.skip_strays)) is not None:
            return fast
        grouped = KeysByProcedure.group(self.proc_path, keys)
        for key in grouped.others:
            logger.warning(
                "ignoring a key that is not a procedure key (of another shape or above step %d): %s", MAX_STEP, key
            )
        out: list[FolderLatest] = []
        for pid, found in grouped.steps.items():
            folder = ProcedureKeys.of(found)
            lowest = folder.lowest if self.skip_strays else 0
            out.append((pid, folder.latest, self.key(pid, *folder.latest), folder.below_commit, None, lowest))
        return out

    def _classify(
        self,
        latest_of: dict[ProcedureId, StepAndType],
        below_commit: dict[ProcedureId, StepAndType],
        values: list[bytes | Exception | None],
    ) -> ProcedureMessages:
        """Sort the procedures by their latest keys; `values` are the keys read
        (`_keys_read`), in the order of `latest_of` (a `.commit` with no message below it was
        not read)."""
        result = ProcedureMessages()
        read = iter(values)
        for pid, (step, key_type) in latest_of.items():
            if key_type is KeyType.COMMIT:
                result.commit_steps[pid] = step
                below = below_commit.get(pid)
                self._classify_finished(pid, below, None if below is None else next(read), result)
                continue
            raw = next(read)
            if step == MAX_STEP:  # a key above it is no procedure's (`ParsedKey.parse`)
                # Resuming writes at step + 1, which no message could hold: every write of
                # the procedure would fail. A problem now, not a failure at every start.
                reason = f"its step number {step} is the largest a procedure can write: it could write no other"
                self._report((pid, step, key_type), reason, result.problems)
                continue
            # A value of known fields only (no unknown fields to keep), at its key's step,
            # decoded in one call (recovery reads thousands); any other goes through
            # `_decode`, which keeps its unknown fields or reports it.
            message = decoded_directly(raw) if type(raw) is bytes else None
            if message is None or message.step != step:
                message = self._decode((pid, step, key_type), raw, result.problems)
                if message is None:
                    continue
            (result.messages if key_type is KeyType.STEP else result.rollback_messages)[pid] = message
        return result

    def _classify_finished(
        self,
        pid: ProcedureId,
        below: StepAndType | None,
        raw: bytes | Exception | None,
        result: ProcedureMessages,
    ) -> None:
        """A procedure whose highest key is `.commit`: finished, unless we cannot tell whose.

        Its keys are deleted later only if its parent is known to be gone; so a message below
        the commit that exists but cannot be read (a 503 past the re-reads, a corrupt value)
        is a load problem and the procedure is kept, never taken for a root and deleted.
        """
        message = None
        if below is not None:
            message = self._decode((pid, *below), raw, result.problems, finished=True)
            if message is None:
                return
            if below[1] is KeyType.ROLLBACK:
                result.rolled_back_ids.add(pid)
        result.finished_ids.append(pid)
        result.finished_messages[pid] = message

    def _decode(
        self,
        key: _Key,
        raw: bytes | Exception | None,
        problems: list[LoadProblem],
        *,
        finished: bool = False,
    ) -> ProcedureMessage | None:
        if raw is None:
            logger.info("key %s vanished while loading (deleted by another manager?)", self.key(*key))
            return None
        read = decode_or_problem(raw, key[1])
        if isinstance(read, ProcedureMessage):
            self.keep_unknown_fields(key[0], read)
            return read
        reason = read
        if finished:
            reason += " (the procedure finished, but whose subprocedure it was is unknown, so its keys are kept)"
        self._report(key, reason, problems)
        return None

    def _report(self, key: _Key, reason: str, problems: list[LoadProblem]) -> None:
        problem = LoadProblem(self.key(*key), key[0], reason, UNREADABLE_HINT)
        logger.error("skipping %s", problem, extra=problem.log_fields())
        problems.append(problem)


_LATEST, _LATEST_TEXT, _ID_AND_LATEST, _KEY_TYPE = itemgetter(1), itemgetter(2), itemgetter(0, 1), itemgetter(1)
"""Parts of a `FolderLatest` (and a `StepAndType`'s key type), taken by C calls."""

_Key = tuple[ProcedureId, int, KeyType]
"""A key while loading, as its parts: formatted (`ProcedureStore.key`) only to be read or reported."""


def _keys_read(latest_of: dict[ProcedureId, StepAndType], below_commit: dict[ProcedureId, StepAndType]) -> list[_Key]:
    """The keys `load_messages` reads, in the order of `_latest_keys`'s texts: each latest key,
    but for a latest `.commit` the message below it (none if it has none)."""
    return [
        (pid, *latest) if latest[1] is not KeyType.COMMIT else (pid, *below_commit[pid])
        for pid, latest in latest_of.items()
        if latest[1] is not KeyType.COMMIT or pid in below_commit
    ]


def _run_of(value: bytes | Exception | None) -> int | None:
    """The run of a stored message; None if it cannot be read."""
    read = decode_or_problem(value)
    return read.run if isinstance(read, ProcedureMessage) else None


def _deletion_stages(keys: Sequence[ParsedKey]) -> tuple[list[str], list[str]]:
    """The keys a deletion removes at once, then those it removes one at a time, in order:
    what a crash leaves part way reads as finished, as the last run ended while the message
    that says so is there.

    Without a `.commit`: every `.step`, then the `.rollback` keys from the lowest. With one
    `.commit` and no `.rollback`: every `.step`, then the commit (whatever part of the first
    stage is left reads as done). Otherwise: first every key but the highest `.commit` and
    the message it ends, then those two, the commit last. Any other `.rollback` goes in the
    first stage: an earlier run's (one a forced rewind left below its copy), or a former
    leader's that landed late beside the commit (see `procstore.store.folder`); left alone
    with the commit, it would be read as the end. The message the commit ends stays to the
    second stage even when it is a `.step`: a bulk delete may remove any part of the first
    (S3's DeleteObjects keeps the keys it lists under `Errors`), and a `.rollback` it keeps
    would be read as the end once that `.step` is gone."""
    ordered = sorted(keys, key=lambda k: latest_first((k.step, k.key_type)))
    commits = [k for k in ordered if k.key_type is KeyType.COMMIT]
    if not commits:
        return [str(k) for k in ordered if k.key_type is KeyType.STEP], [
            str(k) for k in ordered if k.key_type.is_terminal
        ]
    top = commits[-1]
    if len(commits) == 1 and all(k.key_type is not KeyType.ROLLBACK for k in ordered):
        return [str(k) for k in ordered if k is not top], [str(top)]
    ends = ProcedureKeys.of((k.step, k.key_type) for k in ordered).newest_message
    last = [k for k in ordered if k is top or (k.step, k.key_type) == ends]
    return [str(k) for k in ordered if k not in last], [str(k) for k in last]
