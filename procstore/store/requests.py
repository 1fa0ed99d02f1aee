"""Operator requests: a durable "stop this procedure" that reaches whichever manager runs it.

An operator (`procstore fail`, `procstore cancel`, `ProcedureManager.cancel`) writes one
small key per procedure, outside `procedure/` so that GreptimeDB's loader never sees it:

    {parent_path}requests/{procedure_id}.json   {"kind":"cancel","reason":"...","requested_at":...}

The manager that runs the procedure reads that key before every attempt at a step, and a
poll over `requests/` reaches procedures that wait (for children, a retry's backoff). A
procedure with a request stops executing and fails with the request's reason, rolling back
first if it supports rollback; its unfinished descendants do the same. The key is written
create-only (the first request wins) and deleted only after the procedure's keys are gone,
so a crash in between honours it again: failing is idempotent.

`procstore resume` and `procstore rewind` leave a nudge of their own, in a subfolder that
the ids above never collide with:

    {parent_path}requests/resume/{procedure_id}.json   {"kind":"resume",...,"step":5}

It tells the running leader to load a procedure it holds as ended or unloadable again
(`procstore.store.restart` wrote what to run from); the next start loads it anyway. Its
`step` is the procedure's latest step key when the nudge was meant (a rewind's copy, or the
`.commit` a resume restarts from): a store fact, so that the leader can tell a nudge it has
already acted on without comparing two machines' clocks (see `procstore._runtime.operator`).
"""

from __future__ import annotations

import getpass
import socket
import time
from collections.abc import Collection, Mapping
from typing import Literal

import msgspec

from procstore._logs import get_logger, procedure_fields
from procstore._text import storable
from procstore.errors import ProcedureError
from procstore.ids import ProcedureId
from procstore.store.history import Action, iso
from procstore.store.message import UNDECODABLE
from procstore.store.state_store import KeyPerProcedure, StateStore, walk_readable
from procstore.wake_time import calendar_time

logger = get_logger("procstore.store")

REQUESTS_PATH = "requests/"
"""The folder under a store's root that holds operator requests."""

RESUME_PATH = f"{REQUESTS_PATH}resume/"
"""The folder of resume nudges, under a store's root."""

RequestKind = Literal["fail", "cancel", "resume"]


class OperatorRequest(msgspec.Struct, frozen=True, kw_only=True):
    """What an operator asked of one procedure, and why."""

    kind: RequestKind
    reason: str
    requested_at: float
    """Seconds since the epoch, when the request was written."""
    requested_by: str = ""
    """Who wrote it (`user@host` for the CLI)."""
    step: int | None = None
    """A resume nudge's latest step key when written (None: a nudge of an older release)."""
    to_step: int | None = None
    """A rewind's nudge: the step it rewound to (None: a resume, or a nudge of an older release)."""

    @classmethod
    def new(
        cls, kind: RequestKind, reason: str | None, step: int | None = None, to_step: int | None = None
    ) -> OperatorRequest:
        """Raises `TypeError` for a reason that is neither text nor None (see `checked_reason`)."""
        return cls(
            kind=kind,
            reason=checked_reason(reason),
            requested_at=time.time(),
            requested_by=who(),
            step=step,
            to_step=to_step,
        )

    def action(self) -> Action:
        """The request as history keeps it: `cancel`, `fail`, or for a nudge `resume` or `rewind`."""
        kind = "rewind" if self.kind == "resume" and self.to_step is not None else self.kind
        at = iso(calendar_time(self.requested_at))  # None for a stored time no calendar holds
        return Action(kind=kind, by=self.requested_by, at=at, reason=self.reason, to_step=self.to_step)

    def describe(self) -> str:
        verb = {"cancel": "cancelled", "fail": "failed", "resume": "resumed"}[self.kind]
        by = f" ({self.requested_by})" if self.requested_by else ""
        return f"{verb} by an operator{by}: {self.reason or 'no reason given'}"


def checked_reason(reason: object) -> str:
    """An operator's reason as stored: text, with None meaning "no reason given" (""). Any
    other value raises `TypeError`, and text that is not valid Unicode (a lone surrogate,
    which UTF-8 cannot store) `ValueError`, before anything is written: every reader
    refuses a request whose reason is not text, so it would be lost at the next start."""
    if reason is None:
        return ""
    if not isinstance(reason, str):
        raise TypeError(f"the reason of an operator request must be a str (or None for none), not {reason!r}")
    return storable(reason, "the reason of an operator request")


class OperatorRequested(ProcedureError):
    """Raised inside a runner when its procedure has an operator request: not retried."""

    def __init__(self, request: OperatorRequest) -> None:
        self.request = request
        super().__init__(request.describe())


_decoder = msgspec.json.Decoder(OperatorRequest)


def _decode(raw: bytes) -> OperatorRequest:
    """Raises one of `UNDECODABLE` for a value that is not a request."""
    try:
        return _decoder.decode(raw)
    except msgspec.ValidationError:
        # `cancel(id, None)` of earlier releases stored `"reason": null`: no reason given.
        fields = msgspec.json.decode(raw)
        if not (isinstance(fields, dict) and "reason" in fields and fields["reason"] is None):
            raise
        return msgspec.convert({**fields, "reason": ""}, OperatorRequest)


_reported: set[tuple[str, bytes]] = set()
"""Unreadable requests already logged: polls read them every second, the log says it once."""


def decode_request(raw: bytes, key: str, procedure_id: ProcedureId) -> OperatorRequest | None:
    """The request for `procedure_id` under `key`, or None (logged once, key kept) for a
    value that is not one."""
    try:
        return _decode(raw)
    except UNDECODABLE as e:
        if (key, raw) in _reported:
            return None
        _reported.add((key, raw))
        again = (
            "procstore resume` or `procstore rewind" if "/resume/" in key else "procstore cancel` or `procstore fail"
        )
        logger.error(
            "ignoring the operator request at %s: %s; write it again with `%s`",
            key,
            e,
            again,
            extra=procedure_fields(procedure_id),
        )
        return None


class RequestStore(KeyPerProcedure):
    """Reads and writes operator requests under `{parent_path}requests/` of a `StateStore`."""

    def __init__(self, store: StateStore, parent_path: str = "", folder: str = REQUESTS_PATH) -> None:
        super().__init__(store, f"{parent_path}{folder}")

    async def put(self, procedure_id: ProcedureId, request: OperatorRequest) -> bool:
        """Write `request` unless a readable one exists: False if the procedure already had one.

        An unreadable value (a torn write) is no request: it is replaced, by compare-and-swap,
        so that it cannot block every later request. Returns only once `request` or the
        existing one is stored; raises `ProcedureError` naming the key if it kept changing.
        """
        key = self.key(procedure_id)
        value = msgspec.json.encode(request)
        for _ in range(5):
            if await self.store.put_if_absent(key, value):
                return True
            current = await self.store.get_versioned(key)
            if current is None:
                continue  # deleted in between: create it again
            raw, version = current
            if raw == value:
                return True  # ours, its answer lost
            try:
                _decode(raw)
                return False
            except UNDECODABLE as e:
                if await self.store.put_if_version(key, value, version):
                    about = procedure_fields(procedure_id)
                    logger.warning("replaced the unreadable operator request at %s (%s)", key, e, extra=about)
                    return True
        raise ProcedureError(f"the operator request at {key} kept changing while it was written; try again")

    async def get(self, procedure_id: ProcedureId) -> OperatorRequest | None:
        key = self.key(procedure_id)
        raw = await self.store.get(key)
        return None if raw is None else decode_request(raw, key, procedure_id)

    async def list_all(self, listed: Collection[str] | None = None) -> dict[ProcedureId, OperatorRequest]:
        """Every readable request in the store, by procedure id.

        `listed`: the keys of a listing of this folder or of a folder above it, begun after
        the caller's own starting point (a watch lists `requests/` once for both its request
        stores); None lists this folder now."""
        if listed is None:
            listed = await walk_readable(self.store, self.prefix)
        keys = [k for k in listed if k.startswith(self.prefix) and k.endswith(".json")]
        ids = {k: ProcedureId.parse_canonical(k[len(self.prefix) : -len(".json")]) for k in keys}
        wanted = [k for k, pid in ids.items() if pid is not None]
        found: dict[ProcedureId, OperatorRequest] = {}
        for key, raw in zip(wanted, await self.store.get_many(wanted), strict=True):
            pid = ids[key]
            if pid is not None and isinstance(raw, bytes) and (request := decode_request(raw, key, pid)) is not None:
                found[pid] = request
        return found

    async def that_ended(self, errors: Mapping[ProcedureId, str | None]) -> dict[ProcedureId, Action]:
        """The requests that ended runs known only from their keys (`errors`: each one's stored
        error), as history keeps them. A request is deleted only after its procedure's keys,
        so a run whose manager died before its end record still has it; one whose words are
        not in the run's error did not end it (written after the end, say)."""
        ended = {pid: error for pid, error in errors.items() if error}
        if not ended:
            return {}
        stored = await self.list_all()
        return {pid: action for pid, r in stored.items() if pid in ended and (action := ended_by(r, ended[pid]))}

    async def delete_present(self, procedure_ids: Collection[ProcedureId]) -> None:
        """`delete` for those of `procedure_ids` that have a request (readable or not), found by
        one listing: for many procedures, most without a request (recovery's deletions)."""
        wanted = {self.key(pid) for pid in procedure_ids}
        present = [key for key in await walk_readable(self.store, self.prefix) if key in wanted] if wanted else []
        if present:
            await self.store.batch_delete(present)


def ended_by(request: OperatorRequest | None, error: str | None) -> Action | None:
    """The request as history keeps it, if it ended the run whose stored error is `error`
    (its words are in it); None for one that did not (written after the end, say)."""
    if request is None or not error or request.describe() not in error:
        return None
    return request.action()


def who() -> str:
    """`user@host` of this process: who an operator's request or action says asked."""
    try:
        user = getpass.getuser()
    except Exception:
        user = "unknown"
    return f"{user}@{socket.gethostname()}"
