"""`Client`: operate the procedures of a store from any process, without a manager.

A client reads the store and writes operator requests to it, nothing more: it never takes,
reads or waits for the lease, so it works beside managers under a lease (from a third
process, a web handler, a script), on a store no manager runs on, and while the leader
changes. What it asks (cancel, fail, resume, rewind) is carried out by the manager that
runs the procedure, within its `request_poll_interval`; the checks and writes are those of
the CLI (`procstore._client.operations`).

Its methods come in two groups: reading (`get`, `list`, `result`, `wait`, `history`), and
steering, each a request stored for the manager running the procedure to carry out
(`cancel`, `fail`, `resume`, `rewind`; a signal to a procedure belongs with these).
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Iterable
from types import TracebackType
from typing import Any, Self, get_args

import orjson

from procstore._client.inventory import read_inventory, read_procedure
from procstore._client.leader import no_manager_leads
from procstore._client.operations import (
    AlreadyRequested,
    carry_out_resume,
    carry_out_rewind,
    prepare_resume,
    prepare_rewind,
    stoppable,
    write_stop_request,
)
from procstore._client.status import ProcedureStatus, from_keys, from_record, pending_of
from procstore._client.words import STATUS_WORDS, StatusWord
from procstore.errors import (
    InvalidProcedureId,
    OperationRefused,
    ProcedureError,
    ProcedureFailed,
    ProcedureNotEnded,
    ProcedureNotFound,
    ResultNotKept,
    StoreError,
)
from procstore.ids import ProcedureId
from procstore.state import ProcedureState
from procstore.store.history import HistoryRecord, Outcome
from procstore.store.open import open_state_store
from procstore.store.procedure_store import ProcedureStore
from procstore.store.requests import RequestKind, checked_reason
from procstore.store.settings import SettingsStore, StoreSettings
from procstore.store.signals import encoded_payload, send_signal
from procstore.store.state_store import StateStore

Statuses = list[ProcedureStatus]
Records = list[HistoryRecord]
"""(Named here: inside `Client`, `list` is its method.)"""

_LIST_CHUNK = 100
"""Procedures `Client.list()` reads the records of at a time, until its page is full."""

DEFAULT_POLL_INTERVAL = 0.5
"""Seconds between two reads of the store while `Client.wait()` waits."""


class Client:
    """Reads and steers the procedures of one store, from any process; never takes the lease.

    Args:
        url: the store, as for `ProcedureManager` (an fsspec URL, a local path, `memory://`,
            or a `StateStore`, which the client then does not close).
        storage_options: fsspec options (credentials, `endpoint_url`).
        parent_path: the folder inside the store that holds `procedure/` (the managers'
            `parent_path`).
        poll_interval: seconds between two reads of the store in `wait()`.
    """

    def __init__(
        self,
        url: str | os.PathLike[str] | StateStore,
        storage_options: dict[str, Any] | None = None,
        *,
        parent_path: str = "",
        poll_interval: float = DEFAULT_POLL_INTERVAL,
    ) -> None:
        if not poll_interval > 0:
            raise ValueError(f"poll_interval must be > 0 seconds, not {poll_interval!r}")
        self._owns_store = not isinstance(url, StateStore)
        state_store = url if isinstance(url, StateStore) else open_state_store(url, storage_options)
        self._store = ProcedureStore(state_store, parent_path)
        # The store's own, under its `parent_path` read as a folder (`parent_folder`): where
        # the managers write them, whether or not the path ends with `/`.
        self._history = self._store.history
        self._activities = self._store.activities
        self.parent_path = parent_path
        self.poll_interval = poll_interval

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()

    async def close(self) -> None:
        """Release the store's connections (a `StateStore` passed in is left open)."""
        if self._owns_store:
            await self._store.store.close()

    # -- reading ---------------------------------------------------------------------

    async def get(self, procedure_id: ProcedureId | str) -> ProcedureStatus:
        """The procedure's status now, live or ended (while history keeps its record).

        Raises `ProcedureNotFound` for an id the store knows neither by its keys nor in its
        history, `InvalidProcedureId` for text that is not a procedure id.
        """
        status, _ = await self._read(_id(procedure_id))
        return status

    async def _read(self, pid: ProcedureId) -> tuple[ProcedureStatus, HistoryRecord | None]:
        """The status and, for an ended run, its end record (None if not written yet)."""
        # The nudge first: the leader deletes one only once the copy it writes is stored, so
        # a nudge gone by now means keys listed after this read show that copy (a nudge read
        # after the listing could be gone while the listing shows the run before it ended).
        nudge = await self._store.resumes.get(pid)
        stored, modified = await read_procedure(self._store, pid)
        if stored is None:
            record = await self._history.find_newest_run(pid)
            if record is None:
                raise ProcedureNotFound(pid)
            return from_record(pid, record), record
        record = None
        if stored.is_finished:
            run = stored.message.run if stored.message is not None else None
            record = (await self._history.read_ends([(pid, run)]))[0]
        request = await self._store.requests.get(pid) if not stored.is_finished else None
        activity = await self._activities.get(pid) if not stored.is_finished else None
        leaderless = not stored.is_finished and await no_manager_leads(self._store)
        return from_keys(stored, modified, record, pending_of(request, nudge), activity, leaderless), record

    async def list(
        self,
        *,
        status: StatusWord | Iterable[StatusWord] | None = None,
        type_name: str | None = None,
        id_prefix: str | None = None,
        after: ProcedureId | str | None = None,
        limit: int = 100,
    ) -> Statuses:
        """The procedures the store holds and those its history remembers, by id.

        Filters: `status` (a word or several), `type_name`, `id_prefix` (of the canonical
        id). Paging: at most `limit` procedures, the ids above `after`; pass the last id of
        a page as `after` for the next one (an empty page is the end). Read from one
        listing of the store and one of its history and requests: `started_at` of a live
        procedure is `get()`'s alone (None here).
        """
        if limit < 1:
            raise ValueError(f"limit must be at least 1, not {limit!r}")
        wanted = _known_words(status, STATUS_WORDS, "status")
        prefix = (id_prefix or "").lower()
        start = "" if after is None else str(_id(after))
        nudges = await self._store.resumes.list_all()  # before the keys: see `_read`
        inventory = await read_inventory(self._store)
        held = {str(pid): p for pid, p in inventory.procedures.items()}
        ranked = await self._history.ranked_keys()  # one listing for every chunk's reads below
        ids = sorted(
            text
            for text in held.keys() | {i for i in ranked if ProcedureId.parse_canonical(i) is not None}
            if text > start and text.startswith(prefix)
        )
        if not ids:
            return []
        requests = await self._store.requests.list_all()
        active = await self._activities.stored_ids()
        leaderless = await no_manager_leads(self._store)
        out: Statuses = []
        # Records are read a page at a time, not all of them: a page of 100 over 10,000
        # ended procedures reads about 100.
        for at in range(0, len(ids), max(limit, _LIST_CHUNK)):
            chunk = ids[at : at + max(limit, _LIST_CHUNK)]
            finished = [held[i] for i in chunk if i in held and held[i].is_finished]
            runs = await self._history.read_ends(
                [(p.procedure_id, p.message.run if p.message else None) for p in finished], ranked
            )
            ends = {str(p.procedure_id): record for p, record in zip(finished, runs, strict=True)}
            gone = [i for i in chunk if i not in held]
            records = await self._history.newest_readable(gone, ranked)  # past a torn newest, as `get`
            alive = [held[i].procedure_id for i in chunk if i in held and held[i].procedure_id in active]
            activities = dict(zip(alive, await self._activities.get_many(alive), strict=True))
            for text in chunk:
                if (p := held.get(text)) is not None:
                    pending = pending_of(
                        None if p.is_finished else requests.get(p.procedure_id), nudges.get(p.procedure_id)
                    )
                    found = from_keys(p, {}, ends.get(text), pending, activities.get(p.procedure_id), leaderless)
                elif (record := records.get(text)) is not None:
                    found = from_record(ProcedureId.parse(text), record)
                else:
                    continue  # deleted since the listing, or not a record (logged)
                if (wanted is None or found.status in wanted) and (type_name is None or found.type_name == type_name):
                    out.append(found)
            if len(out) >= limit:
                break
        return out[:limit]

    async def result(self, procedure_id: ProcedureId | str) -> object:
        """The output of a procedure that ended `done` (`Status.done(output=...)`, as JSON
        gives it back: a dict, a list, text, a number), kept with its history record for
        the history's retention.

        Raises `ProcedureFailed` (with the stored error) for one that failed, was rolled
        back, cancelled or poisoned; `ProcedureNotEnded` while it runs (and in the moment
        between its end and its end record); `ResultNotKept` for an output history could
        not keep (see `OUTPUT_LIMIT` in docs/api.md); `ProcedureNotFound`.
        """
        pid = _id(procedure_id)
        status, record = await self._read(pid)
        return _result_of(pid, status, record)

    # A `timeout` rather than the caller's `asyncio.timeout()`: the deadline is checked between
    # two reads of the store, so that a read under way is never cut off by it.
    async def wait(self, procedure_id: ProcedureId | str, timeout: float | None = None) -> object:  # noqa: ASYNC109
        """Wait until the procedure has ended, from any process, and return its `result()`.

        Reads the store every `poll_interval` seconds. An ended procedure with a resume or
        rewind pending is waited for (its next run's end counts). Raises as `result()` does once it has
        ended, `TimeoutError` after `timeout` seconds, `ProcedureNotFound` for an unknown id.
        """
        pid = _id(procedure_id)
        deadline = None if timeout is None else time.monotonic() + timeout
        newest_run = 0
        while True:
            status, record = await self._read(pid)
            restarting = status.pending is not None and status.pending.kind in ("resume", "rewind")
            # The end of an earlier run than one seen running is not this wait's answer: its
            # keys may be gone a moment before the later run's end record can be read.
            newest_run = max(newest_run, status.run)
            current = status.run >= newest_run
            if status.is_ended and (record is not None or not _record_coming(status)) and not restarting and current:
                return _result_of(pid, status, record)
            if deadline is not None and time.monotonic() >= deadline:
                raise TimeoutError(f"procedure {pid} has not ended within {timeout} seconds ({status.status})")
            pause = self.poll_interval if deadline is None else min(self.poll_interval, deadline - time.monotonic())
            await asyncio.sleep(max(0.0, pause))

    async def settings(self) -> StoreSettings:
        """What the store says every manager must keep (`procstore settings` writes them):
        the defaults where none are stored."""
        return await SettingsStore(self._store.store, self.parent_path).read()

    async def history(
        self,
        *,
        procedure_id: ProcedureId | str | None = None,
        type_name: str | None = None,
        outcome: Outcome | Iterable[Outcome] | None = None,
        limit: int = 100,
    ) -> Records:
        """The records of ended runs (`HistoryRecord`), newest end first, at most `limit`:
        of one procedure (every run), one type, or one or several outcomes."""
        wanted = _known_words(outcome, get_args(Outcome), "outcome")
        pid = None if procedure_id is None else str(_id(procedure_id))
        if limit < 1:
            raise ValueError(f"limit must be at least 1, not {limit!r}")

        def keep(r: HistoryRecord) -> bool:
            return (type_name is None or r.type_name == type_name) and (wanted is None or r.outcome in wanted)

        return await self._history.newest(keep, limit, pid)

    # -- steering --------------------------------------------------------------------

    async def cancel(self, procedure_id: ProcedureId | str, reason: str | None = None) -> None:
        """Ask the manager running the procedure to stop it before its next step: it rolls
        back if it supports rollback (its history outcome is `cancelled`), and so do its
        unfinished subprocedures. Returns once the request is stored.

        Refused with `OperationRefused` for a procedure that has ended or whose latest state
        cannot be read, or that has a request of another kind already (a repeated cancel
        returns: the first request stands); `ProcedureNotFound`.
        """
        await self._request(_id(procedure_id), "cancel", reason)

    async def fail(self, procedure_id: ProcedureId | str, reason: str | None = None) -> None:
        """As `cancel`, but the outcome is `failed` (or `rolled back`), with `reason` as the error."""
        await self._request(_id(procedure_id), "fail", reason)

    async def _request(self, pid: ProcedureId, kind: RequestKind, reason: str | None) -> None:
        checked = checked_reason(reason)
        try:
            await stoppable(self._store, pid, kind)
        except ProcedureNotFound:
            record = await self._history.find_newest_run(pid)
            if record is None:
                raise
            raise OperationRefused(f"procedure {pid} has ended ({record.outcome}): nothing to {kind}") from None
        try:
            await write_stop_request(self._store, pid, kind, checked)
        except AlreadyRequested as e:
            if e.existing is None or e.existing.kind != kind:
                raise

    async def resume(self, procedure_id: ProcedureId | str, reason: str | None = None) -> None:
        """Run a root that ended failed (its keys kept: `keep_failed=True`) again from its
        last step; the leader does within its `request_poll_interval` (with none running,
        the next to start). `reason` is kept, with who and when, in the new run's history
        record. Returns once the request is stored. Refused (`OperationRefused`) as
        `procstore resume` refuses: a subprocedure, one done, rolled back (rewind it), or
        unfinished."""
        pid = _id(procedure_id)
        checked = checked_reason(reason)
        await carry_out_resume(self._store, await prepare_resume(self._store, pid), checked)

    async def rewind(self, procedure_id: ProcedureId | str, to_step: int, reason: str | None = None) -> None:
        """Make step `to_step`'s stored state the latest again (copied above the latest key),
        and have the leader run the root from there. Refused (`OperationRefused`) as
        `procstore rewind` refuses: an unfinished procedure (cancel it and wait first), a
        subprocedure, one done, a step not stored. Returns once the copy and the request are
        stored."""
        if isinstance(to_step, bool) or not isinstance(to_step, int) or to_step < 0:
            raise ValueError(f"to_step must be a step number (an int >= 0), not {to_step!r}")
        pid = _id(procedure_id)
        checked = checked_reason(reason)
        await carry_out_rewind(self._store, await prepare_rewind(self._store, pid, to_step), checked)

    async def signal(self, procedure_id: ProcedureId | str, name: str, payload: object = None) -> None:
        """Send the signal `name`, with a JSON `payload`, to a procedure that has not ended:
        stored create-only under the store's `requests/signals/`, where the manager running it
        finds it at its next look (`request_poll_interval`); a procedure waiting for it
        (`Status.wait_for_signal(name)`) sees `payload` in `ctx.signals[name]` at its next
        step. Returns once the signal is stored.

        Refused, nothing written: `OperationRefused` for a procedure that has ended,
        `ProcedureNotFound` for an id neither its keys nor history know, `TypeError` for a
        name that is not non-empty text or a payload JSON cannot hold, `ValueError` for a
        name with a lone surrogate. A store's error is
        raised as `StoreError`: the signal may have been stored (an answer lost), so a
        procedure may receive it; send again only if a second one does no harm.
        """
        pid = _id(procedure_id)
        encoded_payload(name, payload)
        if not await self._store.procedure_keys(pid):
            record = await self._history.find_newest_run(pid)
            if record is None:
                raise ProcedureNotFound(pid)
            raise OperationRefused(f"procedure {pid} has ended ({record.outcome}): no signal can reach it")
        try:
            await send_signal(self._store, pid, name, payload)
        except (ProcedureNotFound, StoreError):
            raise  # a store's error is no refusal: the signal may be stored (a lost answer)
        except ProcedureError as e:  # ended (or deleted) since the look above
            raise OperationRefused(str(e)) from None

    def __repr__(self) -> str:
        return f"Client({self._store})"


def _known_words(asked: str | Iterable[str] | None, words: tuple[str, ...], what: str) -> set[str] | None:
    """The words asked for (None: any); `ValueError` naming the words taken for any other,
    which would otherwise match nothing and answer an empty list."""
    if asked is None:
        return None
    wanted = {asked} if isinstance(asked, str) else set(asked)
    if unknown := sorted(wanted - set(words)):
        raise ValueError(f"unknown {what} {', '.join(map(repr, unknown))}: the words are {', '.join(words)}")
    return wanted


def _id(value: ProcedureId | str) -> ProcedureId:
    if isinstance(value, ProcedureId):
        return value
    if isinstance(value, str):
        try:
            return ProcedureId.parse(value)
        except ValueError:
            pass
    raise InvalidProcedureId(value)


SUBPROCEDURE_OUTPUT_LATER = (
    "it is a subprocedure whose parent still runs: its keys, and not its output, are kept until its "
    "root's tree ends, when its end record (with its output) is written; ask again then"
)


def _record_coming(status: ProcedureStatus) -> bool:
    """Whether `wait()` waits for an ended procedure's end record: a done root's (its output
    is kept there), written right after its `.commit` (its keys are still there). A failed
    one's answer, its error, is in its keys, and its record may never come while no manager
    runs (one killed between the two leaves it to the next start); a subprocedure's waits
    for its root's whole tree to end."""
    return status.step is not None and status.parent_id is None and status.status == "done"


def _result_of(pid: ProcedureId, status: ProcedureStatus, record: HistoryRecord | None) -> object:
    if not status.is_ended:
        raise ProcedureNotEnded(pid, status.status)
    if status.status != "done":
        raise ProcedureFailed(pid, ProcedureState.failed(status.error or status.status))
    if record is None and status.parent_id is not None:
        raise ResultNotKept(pid, SUBPROCEDURE_OUTPUT_LATER)
    if record is None:
        raise ProcedureNotEnded(pid, "done, its end record not written yet")
    if record.output_not_kept is not None:
        raise ResultNotKept(pid, record.output_not_kept)
    if record.output is None:
        return None
    try:
        return orjson.loads(record.output)
    except orjson.JSONDecodeError as e:  # a record written by hand: not JSON, or nested too deep
        raise ResultNotKept(pid, f"its stored output cannot be read as JSON ({e})") from None
