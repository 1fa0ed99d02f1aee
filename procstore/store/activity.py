"""What a running procedure is doing between its steps, for operators in other processes.

A step's keys say which step a procedure is at, and since when (the latest key's time). They
cannot say that it is backing off after its 22nd error, waiting for a lock another
procedure holds, or waiting for its children. The manager running it publishes that, one
small key per procedure, outside `procedure/` so that GreptimeDB's loader never sees it:

    {parent_path}activity/{procedure_id}.json   {"run":1,"doing":"backing off","attempt":3,...}

Written only on those transitions, at most once per procedure per `ActivityPublisher`
interval (the latest wins): a procedure that only steps never writes one. It describes the
run `run`, as of `published_at`: readers ignore one of another run, and one of a procedure
that has ended (its end record decides). The manager deletes it once the procedure has
ended; one left behind (a crash) describes an ended run and is read as nothing.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

import msgspec

from procstore._logs import get_logger, procedure_fields
from procstore.ids import ProcedureId
from procstore.store.message import UNDECODABLE
from procstore.store.state_store import KeyPerProcedure, StateStore

logger = get_logger("procstore.store")

ACTIVITY_PATH = "activity/"
"""The folder under a store's root that holds what running procedures are doing."""

RETRIES_KEPT = 10
"""Retries of a run kept in its activity's timeline (a view shows no more: anyone who can
write the bucket can store a million)."""

Doing = Literal["running", "backing off", "waiting on a lock", "waiting on children", "waiting to start", "waiting"]

ERROR_TEXT_LIMIT = 2000
"""Characters of an error's text kept in an activity (the whole text is in the log)."""


class Retry(msgspec.Struct, frozen=True, kw_only=True):
    """One retry of a step: when, which attempt failed, and why."""

    at: str
    """ISO 8601 in UTC."""
    attempt: int
    error: str


class Activity(msgspec.Struct, frozen=True, kw_only=True):
    """What the manager running a procedure last said it was doing."""

    run: int
    doing: Doing
    since: str
    """ISO 8601 in UTC: when it began doing it."""
    step: int
    """The step it is at (the number of the key its next write makes)."""
    manager: str = ""
    """The manager running it (its lease holder's name, or `host:pid`)."""
    attempt: int = 0
    """Backing off: the attempt that failed last (1 for the step's first)."""
    last_error: str | None = None
    next_try: str | None = None
    """Backing off: when the next attempt is due (ISO 8601 in UTC)."""
    lock: str | None = None
    """Waiting on a lock: its key."""
    held_by: list[str] = []
    """Waiting on a lock: the procedures holding it."""
    children: int = 0
    """Waiting on children: how many have not ended."""
    reason: str | None = None
    """Waiting to start: why (a concurrency slot, a rate limit; see `Procedure.concurrency`);
    waiting: for what (a time, a signal: its stored step says the same)."""
    retries: list[Retry] = []
    """The last few retries of this run, oldest first (a timeline of its attempts)."""


_decoder = msgspec.json.Decoder(Activity)
_reported: set[tuple[str, bytes]] = set()


class ActivityStore(KeyPerProcedure):
    """Reads and writes activities under `{parent_path}activity/` of a `StateStore`."""

    def __init__(self, store: StateStore, parent_path: str = "") -> None:
        super().__init__(store, f"{parent_path}{ACTIVITY_PATH}")

    async def put(self, procedure_id: ProcedureId, activity: Activity) -> None:
        await self.store.put(self.key(procedure_id), msgspec.json.encode(activity))

    async def get(self, procedure_id: ProcedureId) -> Activity | None:
        """The procedure's activity, or None: none stored, or one that is not an activity
        (logged once; anyone who can write the bucket can write anything there)."""
        key = self.key(procedure_id)
        raw = await self.store.get(key)
        return None if raw is None else _decoded(raw, key, procedure_id)

    async def get_many(self, procedure_ids: Sequence[ProcedureId]) -> list[Activity | None]:
        keys = [self.key(pid) for pid in procedure_ids]
        found = await self.store.get_many(keys)
        return [
            _decoded(raw, key, pid) if isinstance(raw, bytes) else None
            for key, pid, raw in zip(keys, procedure_ids, found, strict=True)
        ]


def _decoded(raw: bytes, key: str, procedure_id: ProcedureId) -> Activity | None:
    try:
        return _decoder.decode(raw)
    except UNDECODABLE as e:
        if (key, raw) not in _reported and len(_reported) < 1000:
            _reported.add((key, raw))
            logger.warning("ignoring %s: not an activity (%s)", key, e, extra=procedure_fields(procedure_id))
        return None
