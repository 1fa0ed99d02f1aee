"""History: a small record of every procedure that ended, kept after its keys are deleted.

Opt-in (`ProcedureManager(history=History())`): GreptimeDB keeps nothing once a procedure
has ended, and a store without `history/` reads as before. Layout, outside `procedure/` so
that GreptimeDB's loader never sees it:

    {parent_path}history/{ended_at_ms:013d}-{procedure_id}.json    a HistoryRecord

The end time leads the name, so the oldest records come first in a listing and a sweep
deletes them without reading any value. A record is written before the procedure's keys
are deleted; a crash in between leaves finished keys that the next start deletes, writing
the record first if none exists. A record may therefore be written twice (same id, two
end times) but never be missing for a procedure whose keys were deleted by a manager
with history on.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Literal

import msgspec

from procstore._logs import get_logger
from procstore.ids import ProcedureId
from procstore.store.message import UNDECODABLE
from procstore.store.state_store import StateStore, walk_readable

logger = get_logger("procstore.store")

HISTORY_PATH = "history/"
"""The folder under a store's root that holds history records."""

Outcome = Literal["done", "failed", "rolled back", "cancelled", "poisoned"]
"""How a procedure ended; `cancelled`: an operator cancelled it or an ancestor (after its
rollback, if it has one), where a `fail` request gives `failed` or `rolled back`."""


@dataclass(frozen=True, slots=True)
class History:
    """Keep a record of each ended procedure: `ProcedureManager(history=History())`.

    Args:
        retention: seconds a record is kept after its procedure ended (7 days by default).
        max_records: the most records kept; the oldest go first beyond it.
    """

    retention: float = 7 * 24 * 3600.0
    max_records: int = 10_000

    def __post_init__(self) -> None:
        if not self.retention > 0 or self.max_records < 1:
            raise ValueError(f"History needs retention > 0 and max_records >= 1, not {self!r}")


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


_decoder = msgspec.json.Decoder(HistoryRecord)


def iso(moment: datetime | None) -> str | None:
    return None if moment is None else moment.astimezone(UTC).isoformat(timespec="milliseconds")


class HistoryStore:
    """Reads, writes and sweeps history records under `{parent_path}history/`."""

    def __init__(self, store: StateStore, parent_path: str = "", settings: History | None = None) -> None:
        self.store = store
        self.prefix = f"{parent_path}{HISTORY_PATH}"
        self.settings = settings or History()

    def key(self, record: HistoryRecord) -> str:
        ended = datetime.fromisoformat(record.ended_at)
        return f"{self.prefix}{int(ended.timestamp() * 1000):013d}-{record.id}.json"

    async def put_many(self, records: list[HistoryRecord]) -> None:
        """Write `records` (plain puts: a record written twice is the same record)."""
        for record in records:
            await self.store.put(self.key(record), msgspec.json.encode(record))

    async def keys(self) -> list[str]:
        """Every record's key, oldest first. Keys of another shape are not ours: never listed
        (or swept)."""
        return sorted(k for k in await walk_readable(self.store, self.prefix) if _is_record_key(k))

    async def recorded_ids(self) -> set[str]:
        return {_id_of(key) for key in await self.keys()}

    async def read(self, keys: Sequence[str]) -> list[HistoryRecord]:
        """The readable records under `keys` (from `keys()`), in their order; a value that
        is not a record is logged and skipped, a key deleted since is skipped."""
        records: list[HistoryRecord] = []
        for key, raw in zip(keys, await self.store.get_many([*keys]), strict=True):
            if isinstance(raw, bytes):
                try:
                    records.append(_decoder.decode(raw))
                except UNDECODABLE as e:
                    logger.warning("skipping the history record at %s: %s; delete the key", key, e)
        return records

    async def list(self) -> list[HistoryRecord]:
        """Every readable record, oldest first; a value that is not a record is logged and skipped."""
        return await self.read(await self.keys())

    async def find(self, procedure_id: ProcedureId | str) -> HistoryRecord | None:
        """The newest record of `procedure_id`, or None."""
        wanted = str(procedure_id)
        for key in reversed(await self.keys()):
            if _id_of(key) == wanted and (raw := await self.store.get(key)) is not None:
                try:
                    return _decoder.decode(raw)
                except UNDECODABLE as e:
                    logger.warning("skipping the history record at %s: %s; delete the key", key, e)
        return None

    async def sweep(self, now: float | None = None) -> int:
        """Delete records past the retention, then the oldest beyond `max_records`; returns how many."""
        now = time.time() if now is None else now
        keys = await self.keys()
        cutoff_ms = int((now - self.settings.retention) * 1000)
        doomed = [k for k in keys if _ended_ms(k) < cutoff_ms]
        kept = keys[len(doomed) :]
        if len(kept) > self.settings.max_records:
            doomed += kept[: len(kept) - self.settings.max_records]
        if doomed:
            await self.store.batch_delete(doomed)
        return len(doomed)


def _name(key: str) -> str:
    return key.rsplit("/", 1)[-1].removesuffix(".json")


def _id_of(key: str) -> str:
    return _name(key).partition("-")[2]


def _ended_ms(key: str) -> int:
    return int(_name(key).partition("-")[0])


def _is_record_key(key: str) -> bool:
    head, dash, pid = _name(key).partition("-")
    return key.endswith(".json") and len(head) == 13 and head.isdigit() and bool(dash) and bool(pid)
