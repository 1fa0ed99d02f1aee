"""History: one record of every run of a procedure that ended, kept after its keys go.

A record is also the run's *end record* (a tombstone): it is written, create-only, before
any key of the run is deleted, and recovery never runs a run that has one. Deleting a
finished procedure's keys makes a create-only write succeed again (a paused former
leader's retried `0.step` landing late, say); the end record says that such a key belongs
to a run that ended, so it is removed instead of run a second time. History is therefore
always kept; `History` sets how long. Layout, outside `procedure/` so that GreptimeDB's
loader never sees it:

    {parent_path}history/{procedure_id}.{run:010d}.json        a HistoryRecord (the end record)
    {parent_path}history/{ended_at_ms:013d}-{procedure_id}.json a record of an earlier release

The name is the run's, not the end time's: whoever records an end (the manager that ran
it, a paused former leader whose write lands late, the next start after a crash between
the record and the deletion) writes the same key, and only the first write counts. So
there is exactly one record per ended run. Records of an earlier release are read, listed
and swept as before, but are no end records (their run is not known).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Literal

import msgspec
import orjson

from procstore._aio import gather_settled
from procstore._logs import get_logger
from procstore.errors import ListingIncomplete
from procstore.ids import ProcedureId
from procstore.store.finite import has_non_finite
from procstore.store.message import UNDECODABLE, ProcedureMessage
from procstore.store.state_store import StateStore, walk_readable

logger = get_logger("procstore.store")

_READ_CHUNK = 100
"""Records `HistoryStore.newest` reads at a time."""

HISTORY_PATH = "history/"
"""The folder under a store's root that holds history records."""

RunKey = tuple[str, int]
"""A run of a procedure: its id (as text) and its run number."""

Outcome = Literal["done", "failed", "rolled back", "cancelled", "poisoned"]
"""How a procedure ended; `cancelled`: an operator cancelled it or an ancestor (after its
rollback, if it has one), where a `fail` request gives `failed` or `rolled back`."""


OUTPUT_LIMIT = 64 * 1024
"""The most bytes of JSON an end record keeps of a `Status.done(output=...)`: a larger
output is not kept (`HistoryRecord.output_not_kept` says so), and the procedure is done
all the same."""


@dataclass(frozen=True, slots=True)
class History:
    """How long the records of ended runs are kept: `ProcedureManager(history=History(...))`.

    History is always kept (each record is its run's end record); this sets its size.

    Args:
        retention: seconds a record is kept after its procedure ended (7 days by default).
        max_records: the most records kept; the oldest go first beyond it.
        output_limit: bytes of a done procedure's output (as JSON) its record keeps
            (`OUTPUT_LIMIT` by default); a larger one is not kept, and the record says why.
    """

    retention: float = 7 * 24 * 3600.0
    max_records: int = 10_000
    output_limit: int = OUTPUT_LIMIT

    def __post_init__(self) -> None:
        if not self.retention > 0 or self.max_records < 1 or self.output_limit < 0:
            raise ValueError(f"History needs retention > 0, max_records >= 1 and output_limit >= 0, not {self!r}")


class Action(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """Who did what to a procedure, when and why: how a run started (`submit`, `resume`,
    `rewind`), or the operator request that ended it (`cancel`, `fail`)."""

    kind: str
    by: str = ""
    """`user@host` of the process that asked (empty when not known)."""
    at: str | None = None
    """ISO 8601 in UTC."""
    reason: str = ""
    to_step: int | None = None
    """A rewind's step."""


class HistoryRecord(msgspec.Struct, frozen=True, kw_only=True):
    """What is kept of one ended procedure."""

    id: str
    type_name: str
    parent_id: str | None
    outcome: Outcome
    error: str | None = None
    started_at: str | None = None
    """ISO 8601 in UTC; None when the manager that ended it did not run it from the start."""
    ended_at: str
    """ISO 8601 in UTC."""
    steps: int = 0
    """The highest step number stored for it."""
    retries: int = 0
    """Retries of its steps (and rollback) in the run that ended it."""
    run: int = 1
    """Which run of the id ended: 1 for a submit, one more for each resume or rewind."""
    output: str | None = None
    """What `Status.done(output=...)` returned, as JSON text (None for no output, or one
    not kept: see `output_not_kept`)."""
    output_not_kept: str | None = None
    """Why a done run's output is not in `output`: larger than `OUTPUT_LIMIT` as JSON, or
    not JSON-serialisable."""
    started: Action | None = None
    """How the run started (`submit`, `resume`, `rewind`: who, when, why); None when the
    manager that ended it did not see its start (it took it over from the store)."""
    ended_by: Action | None = None
    """The operator request (`cancel`, `fail`) that ended the run, if one did."""
    rolled_back: bool = False
    """Its rollback ran to its end (a `rolled back` outcome, or a `cancelled` one that
    rolled back): resuming it would run its later steps over undone work."""


def kept_output(output: object, limit: int = OUTPUT_LIMIT) -> tuple[str | None, str | None]:
    """`(output, output_not_kept)` of an end record for a run's output: JSON text within
    `limit` bytes (the store's `result_limit`, else `OUTPUT_LIMIT`), else the reason it is
    not kept. Never raises: a procedure's end is recorded whatever its output."""
    if output is None:
        return None, None
    try:
        encoded = orjson.dumps(output)
    except Exception as e:  # orjson.JSONEncodeError, or any error of the object's own hooks
        return None, f"not JSON-serialisable ({type(e).__name__}: {e})"
    if len(encoded) > limit:
        return None, f"{len(encoded)} bytes as JSON, above the {limit} bytes history keeps"
    if b"null" in encoded and has_non_finite(output):
        return None, "it holds a NaN or an infinity, which JSON cannot (orjson writes null)"
    return encoded.decode(), None


OUTPUT_FROM_KEYS = (
    "its end record was written from its keys, which hold no output: the manager that ran it stopped "
    "between its end and its record, or a procstore gc or delete recorded it first"
)
"""Why a done run's record written from its keys keeps no output: it had one, or None, and
nothing tells which (a record saying `None` would answer for an output it never saw)."""


def record_from_keys(
    procedure_id: ProcedureId,
    message: ProcedureMessage,
    *,
    rolled_back: bool,
    ended_at: str,
    started: Action | None,
    ended_by: Action | None = None,
) -> HistoryRecord:
    """The end record of a finished run known only from its keys (`message`: its highest
    message below the `.commit`; `started`: how the run started, as its messages say:
    `procstore.store.run_origin`): written by whoever deletes such a run (recovery, `procstore
    gc` and `delete`), unless the manager that ran it wrote a fuller one first. The keys do
    not say whether it rolled back or had no rollback: either is `failed` (`cancelled` if
    `ended_by`, the operator request that ended it, is a cancel); nor what a done run's
    output was: `output_not_kept` says so."""
    return HistoryRecord(
        id=str(procedure_id),
        type_name=message.type_name,
        parent_id=None if message.parent_id is None else str(message.parent_id),
        outcome=("cancelled" if ended_by is not None and ended_by.kind == "cancel" else "failed")
        if rolled_back
        else "done",
        error=message.error if rolled_back else None,
        ended_at=ended_at,
        steps=message.step,
        run=message.run,
        started=started,
        output_not_kept=None if rolled_back else OUTPUT_FROM_KEYS,
        ended_by=ended_by if rolled_back else None,
    )


_decoder = msgspec.json.Decoder(HistoryRecord)


def iso(moment: datetime | None) -> str | None:
    """ISO 8601 in UTC with `Z`, as every time procstore writes, to the millisecond."""
    if moment is None:
        return None
    return moment.astimezone(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


@dataclass(slots=True)
class Recorded:
    """The ends history holds (`HistoryStore.recorded`)."""

    runs: set[RunKey] = field(default_factory=set)
    """The runs with an end record."""
    before_runs: set[str] = field(default_factory=set)
    """Ids with a record of an earlier release, which did not number runs: taken as a
    record of run 1 when deciding what to record, never as an end record."""

    def has(self, procedure_id: ProcedureId | str, run: int) -> bool:
        return (str(procedure_id), run) in self.runs or (run == 1 and str(procedure_id) in self.before_runs)


class HistoryStore:
    """Reads, writes and sweeps history records under `{parent_path}history/`."""

    def __init__(self, store: StateStore, parent_path: str = "", settings: History | None = None) -> None:
        self.store = store
        self.prefix = f"{parent_path}{HISTORY_PATH}"
        self.settings = settings or History()

    def key(self, record: HistoryRecord) -> str:
        """The run's end-record key: the same whoever writes it."""
        return self.run_key(record.id, record.run)

    def run_key(self, procedure_id: ProcedureId | str, run: int) -> str:
        return f"{self.prefix}{procedure_id}.{run:010d}.json"

    async def put_many(self, records: Sequence[HistoryRecord]) -> None:
        """Write each record unless its run has one (create-only): the first record of a run
        is its record, a later writer's (a late or repeated end) changes nothing."""
        await gather_settled(*(self.store.put_if_absent(self.key(r), msgspec.json.encode(r)) for r in records))

    async def _listed(self) -> dict[str, float | None]:
        """Every record key with its last-modified time where the store gives one. Keys of
        another shape are not ours: never listed (or swept)."""
        try:
            found = await self.store.walk_modified(self.prefix)
        except ListingIncomplete as e:
            found = e.listed
            await walk_readable(self.store, self.prefix)  # the warning, once per folder
        return {k: t for k, t in found.items() if _shape(k) is not None}

    async def _by_end(self) -> list[tuple[int, str]]:
        """`(ended_at_ms, key)` of every record, oldest first. A record of this release has
        its end in its value: the listing's modified time stands in where the store gives
        one (written at the end, within a retry's backoff), else the value is read."""
        listed = await self._listed()
        out: list[tuple[int, str]] = []
        unknown: list[str] = []
        for key, modified in listed.items():
            shape = _shape(key)
            if isinstance(shape, int):
                out.append((shape, key))
            elif modified is not None:
                out.append((int(modified * 1000), key))
            else:
                unknown.append(key)
        for key, record in zip(unknown, await self.read_each(unknown), strict=True):
            out.append((_ms(record.ended_at) if record is not None else 0, key))
        out.sort()
        return out

    async def keys(self) -> list[str]:
        """Every record's key, oldest first."""
        return [key for _, key in await self._by_end()]

    async def ranked_keys(self) -> dict[str, list[str]]:
        """Each recorded id's record keys, oldest first: its runs by number above its records
        of an earlier release, those by the end in their names, from one
        listing and no read. The newest is last."""
        ranked: dict[str, list[tuple[tuple[int, int], str]]] = {}
        for key in await self._listed():
            shape = _shape(key)  # once: it parses the id, and a history may hold millions
            pid, rank = (shape[0], (1, shape[1])) if isinstance(shape, tuple) else (_id_of(key), (0, shape or 0))
            ranked.setdefault(pid, []).append((rank, key))
        return {pid: [key for _, key in sorted(keys)] for pid, keys in ranked.items()}

    async def newest_readable(
        self, ids: Collection[str], ranked: Mapping[str, Sequence[str]] | None = None
    ) -> dict[str, HistoryRecord]:
        """Each of `ids`' newest record that can be read, from `ranked`
        (`ranked_keys`), or one listing of the history: the newest of each is read, and for
        those that cannot be, the rest of theirs at once (each record read once at most)."""
        ranked = await self.ranked_keys() if ranked is None else ranked
        mine = {pid: keys for pid in ids if (keys := ranked.get(pid))}
        out: dict[str, HistoryRecord] = {}
        newest = [(pid, keys[-1]) for pid, keys in mine.items()]
        for (pid, _), record in zip(newest, await self.read_each([key for _, key in newest]), strict=True):
            if record is not None:
                out[pid] = record
        rest = [(pid, key) for pid, keys in mine.items() if pid not in out for key in keys[:-1]]
        for (pid, _), record in zip(rest, await self.read_each([key for _, key in rest]), strict=True):
            if record is not None:
                out[pid] = record  # oldest first: the newest readable is the last one kept
        return out

    async def recorded_ids(self) -> set[str]:
        """The ids with a record (of any run, or of an earlier release)."""
        return {_id_of(key) for key in await self._listed()}

    async def recorded(self) -> Recorded:
        """What history holds, in one listing: the end records, and the ids with a record
        of an earlier release."""
        out = Recorded()
        for key in await self._listed():
            shape = _shape(key)
            if isinstance(shape, tuple):
                out.runs.add(shape)
            else:
                out.before_runs.add(_id_of(key))
        return out

    async def put_unrecorded(self, records: Sequence[HistoryRecord], recorded: Recorded | None = None) -> None:
        """`put_many` of the records whose end history does not hold yet (`recorded`, or
        listed now): a record an earlier release wrote of the same end counts."""
        recorded = await self.recorded() if recorded is None else recorded
        await self.put_many([r for r in records if not recorded.has(r.id, r.run)])

    async def has_ended(self, procedure_id: ProcedureId | str, run: int) -> bool:
        """Whether run `run` of the procedure has its end record (one read)."""
        return await self.store.get(self.run_key(procedure_id, run)) is not None

    async def find_newest_run(self, procedure_id: ProcedureId | str) -> HistoryRecord | None:
        """`find`, without listing the whole history: reads run 1, 2, ... while each has a
        record (runs are numbered one after another, and each ended run is recorded), so
        two or three reads for most ids. With no record of run 1 (a record of an earlier
        release, or none at all), or a run's that cannot be read (a later one may be), `find`."""
        newest = None
        run = 1
        while (raw := (await self.store.get_many([key := self.run_key(procedure_id, run)]))[0]) is not None:
            if (record := _decoded(key, raw)) is None:
                return await self.find(procedure_id)
            newest, run = record, run + 1
        return newest if newest is not None else await self.find(procedure_id)

    async def read_ends(
        self,
        runs: Sequence[tuple[ProcedureId | str, int | None]],
        ranked: Mapping[str, Sequence[str]] | None = None,
    ) -> list[HistoryRecord | None]:
        """The end record of each (procedure, run), None where there is none (one read each).
        A run of None is the procedure's newest recorded one: a finished folder with no
        message left (its deletion under way, at its last `.commit`) does not say which run
        ended, and one that ran again ended last. `ranked`: `ranked_keys`, listed already by
        a caller that reads many such runs a chunk at a time (else one listing a chunk)."""
        known = [(i, self.run_key(pid, run)) for i, (pid, run) in enumerate(runs) if run is not None]
        out: list[HistoryRecord | None] = [None] * len(runs)
        for (i, _), record in zip(known, await self.read_each([key for _, key in known]), strict=True):
            out[i] = record
        unnamed = [(i, pid) for i, (pid, run) in enumerate(runs) if run is None]
        if len(unnamed) == 1 and ranked is None:
            out[unnamed[0][0]] = await self.find_newest_run(unnamed[0][1])
        elif unnamed:
            # One listing for all: each `find_newest_run` may list the whole history, and
            # anyone who can write the store can leave thousands of folders of a `.commit` alone.
            newest = await self.newest_readable({str(pid) for _, pid in unnamed}, ranked)
            for i, pid in unnamed:
                out[i] = newest.get(str(pid))
        return out

    async def read_each(self, keys: Sequence[str]) -> list[HistoryRecord | None]:
        """The record under each key, in order: None for a key deleted since or a value
        that is not a record (logged)."""
        return [
            None if raw is None else _decoded(key, raw)
            for key, raw in zip(keys, await self.store.get_many([*keys]), strict=True)
        ]

    async def newest(
        self, keep: Callable[[HistoryRecord], bool], limit: int, procedure_id: str | None = None
    ) -> list[HistoryRecord]:
        """Up to `limit` records that `keep` accepts, newest end first (of one procedure's
        runs, with `procedure_id`): read a chunk at a time from the newest, not all of them."""
        keys = await self.keys()
        if procedure_id is not None:
            keys = [k for k in keys if _id_of(k) == procedure_id]
        chunk = max(limit, _READ_CHUNK)
        out: list[HistoryRecord] = []
        for end in range(len(keys), 0, -chunk):
            for record in reversed(await self.read(keys[max(0, end - chunk) : end])):
                if keep(record):
                    out.append(record)
                    if len(out) >= limit:
                        return out
        return out

    async def read(self, keys: Sequence[str]) -> list[HistoryRecord]:
        """The readable records under `keys` (from `keys()`), in their order; a value that
        is not a record is logged and skipped, a key deleted since is skipped."""
        return [r for r in await self.read_each(keys) if r is not None]

    async def list(self) -> list[HistoryRecord]:
        """Every readable record, oldest first; a value that is not a record is logged and skipped."""
        return await self.read(await self.keys())

    async def find(self, procedure_id: ProcedureId | str) -> HistoryRecord | None:
        """The record of the procedure's latest ended run that can be read, or None."""
        wanted = str(procedure_id)
        return (await self.newest_readable([wanted])).get(wanted)

    async def sweep(self, now: float | None = None) -> int:
        """Delete records past the retention, then the oldest beyond `max_records`; returns how many.

        The end records of one id go together, when its newest passes: while any run of an
        id is remembered, its first run's record is too, which is what a submit looks for
        (`has_ended(id, 1)`), so an id is never taken for a new one while history knows it.
        """
        now = time.time() if now is None else now
        by_end = await self._by_end()  # oldest first: each id's last is its newest
        newest = {_id_of(key): ended for ended, key in by_end}
        # Each record is judged by its id's newest end (a record of an earlier release, by its own).
        judged = sorted(
            ((newest[_id_of(key)] if isinstance(_shape(key), tuple) else ended), key) for ended, key in by_end
        )
        cutoff_ms = int((now - self.settings.retention) * 1000)
        doomed = [k for ended, k in judged if ended < cutoff_ms]
        kept = judged[len(doomed) :]
        if len(kept) > self.settings.max_records:
            cut = len(kept) - self.settings.max_records
            while cut < len(kept) and _id_of(kept[cut][1]) == _id_of(kept[cut - 1][1]):
                cut += 1  # an id's records go together (above)
            doomed += [k for _, k in kept[:cut]]
        if doomed:
            await self.store.batch_delete(doomed)
        return len(doomed)


def _ms(text: str) -> int:
    try:
        return int(datetime.fromisoformat(text).timestamp() * 1000)
    except ValueError:
        return 0


def _name(key: str) -> str:
    return key.rsplit("/", 1)[-1].removesuffix(".json")


def _decoded(key: str, raw: bytes | Exception) -> HistoryRecord | None:
    """The record read from `key` (its value, or why it could not be read); None for one
    that is not a record, logged."""
    if isinstance(raw, bytes):
        try:
            return _decoder.decode(raw)
        except UNDECODABLE as e:
            logger.warning("skipping the history record at %s: %s; delete the key", key, e)
    return None


def _shape(key: str) -> int | tuple[str, int] | None:
    """A record key's shape: `(id, run)` for an end record, the end time in ms for a record
    of an earlier release, None for a key that is not a record."""
    if not key.endswith(".json"):
        return None
    name = _name(key)
    pid, dot, run = name.rpartition(".")
    if dot and len(run) == 10 and run.isdigit() and pid and ProcedureId.parse_canonical(pid) is not None:
        return (pid, int(run))
    head, dash, old_id = name.partition("-")
    if len(head) == 13 and head.isdigit() and dash and old_id:
        return int(head)
    return None


def ended_run(key: str) -> tuple[str, int] | None:
    """The procedure id and run an end record's key names; None for any other key."""
    shape = _shape(key)
    return shape if isinstance(shape, tuple) else None


def _id_of(key: str) -> str:
    shape = _shape(key)
    if isinstance(shape, tuple):
        return shape[0]
    return _name(key).partition("-")[2]
