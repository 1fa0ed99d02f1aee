"""`ProcedureStatus`: what the store tells of one procedure, live or ended, in the one
vocabulary of status words that `Client`, `procstore show` and `procstore history` share.

Built from the store alone (its keys, its history record, a pending request): any process
can read it, and no manager is asked.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from datetime import UTC, datetime

from procstore._client.inventory import StoredProcedure
from procstore._client.words import ENDED_WORDS, StatusWord, status_word
from procstore.ids import ProcedureId
from procstore.store.activity import Activity
from procstore.store.history import Action, HistoryRecord
from procstore.store.keys import KeyType
from procstore.store.requests import OperatorRequest
from procstore.wake_time import calendar_time


@dataclass(frozen=True, slots=True)
class ProcedureStatus:
    """One procedure as the store tells it: `Client.get()` and `Client.list()`.

    Times are aware datetimes in UTC. `pending` is an operator's request not yet honoured:
    a `cancel` or `fail`, or a `resume` or `rewind` the leader has not acted on yet.
    """

    id: ProcedureId
    type_name: str | None
    parent_id: ProcedureId | None
    status: StatusWord
    step: int | None
    """The latest step key stored (None: its keys are gone, it is known from history)."""
    run: int
    """1 for a submit, one more for each resume or rewind."""
    started_at: datetime | None
    """When this run's first key was written (or, once ended, as its history record says)."""
    ended_at: datetime | None
    updated_at: datetime | None
    """When its latest key was written, where the store says (the last step's end)."""
    error: str | None
    pending: Action | None
    started: Action | None
    """How this run started (`submit`, `resume`, `rewind`), where known."""
    problem: str | None = None
    """Why its latest value cannot be read, for `unreadable`."""
    waiting: str | None = None
    """How its latest stored step said it waits (`sleeping until …`, `waiting for signal
    'name' …`: a durable timer or signal), while it is unfinished; None otherwise."""
    activity: Activity | None = None
    """What the manager running it last published between steps (`procstore.store.activity`:
    backing off with its attempt, last error and next try; waiting on a lock and its
    holders; waiting on its children), for this run while it is alive; None for a
    procedure that only steps (its `updated_at` says since when it runs its step)."""
    no_manager: bool = False
    """The store's lease says no manager leads it now (released, or not renewed within its
    TTL): nothing runs this procedure until one starts or takes over. False where nothing
    tells (managers without `lease=` keep no lease)."""

    @property
    def is_ended(self) -> bool:
        return self.status in ENDED_WORDS

    @property
    def doing(self) -> str | None:
        """What an alive procedure does now: its `activity`'s `doing` (`backing off`,
        `waiting on a lock`, `waiting on children`, `running`...) where one is published,
        else `sleeping` or `waiting for a signal` (its stored step's durable wait), `running`
        (a step) or `rolling back`; `no manager` while the lease says none leads the store;
        None once it has ended."""
        if self.no_manager and not self.is_ended:
            return "no manager"
        if self.status == "unfinished":
            if self.activity is not None:
                return self.activity.doing
            if self.waiting is not None:
                return "sleeping" if self.waiting.startswith("sleeping") else "waiting for a signal"
            return "running"
        return "rolling back" if self.status == "rolling back" else None

    @property
    def outcome(self) -> StatusWord | None:
        """How it ended (the status of an ended procedure); None while it is alive."""
        return self.status if self.is_ended else None

    @property
    def duration(self) -> float | None:
        """Seconds from its start to its end, or to now while it is alive; None if its start is not known."""
        if self.started_at is None:
            return None
        end = self.ended_at.timestamp() if self.ended_at is not None else time.time()
        return max(0.0, end - self.started_at.timestamp())


def _time(stamp: float | None) -> datetime | None:
    return None if stamp is None else calendar_time(stamp)


def _parsed(text: str | None) -> datetime | None:
    if not text:
        return None
    try:
        moment = datetime.fromisoformat(text)
    except ValueError:
        return None
    return moment if moment.tzinfo is not None else moment.replace(tzinfo=UTC)


def pending_of(request: OperatorRequest | None, nudge: OperatorRequest | None) -> Action | None:
    """The request a manager has yet to honour: a cancel or fail first, else a resume nudge."""
    if request is not None:
        return request.action()
    return None if nudge is None else nudge.action()


def from_record(procedure_id: ProcedureId, record: HistoryRecord) -> ProcedureStatus:
    """An ended procedure known from its history record alone (its keys are gone); its id
    is the record key's (a value's own `id` is not trusted to be one)."""
    return ProcedureStatus(
        id=procedure_id,
        type_name=record.type_name,
        parent_id=None if record.parent_id is None else ProcedureId.parse_canonical(record.parent_id),
        status=record.outcome,
        step=None,
        run=record.run,
        started_at=_parsed(record.started_at) or _parsed(record.started.at if record.started else None),
        ended_at=_parsed(record.ended_at),
        updated_at=_parsed(record.ended_at),
        error=record.error,
        pending=None,
        started=record.started,
    )


def from_keys(
    p: StoredProcedure,
    modified: dict[str, float | None],
    record: HistoryRecord | None,
    pending: Action | None,
    activity: Activity | None = None,
    no_manager: bool = False,
) -> ProcedureStatus:
    """A procedure the store holds keys of; `record`: the end record of its latest run, if
    written (an ended one's outcome and times come from it); `modified`: its keys' times."""
    message = p.message
    # A finished folder whose messages are gone (its deletion under way) says no run: the
    # record, its newest, does.
    run = message.run if message is not None else record.run if record is not None and p.is_finished else 1
    status = status_word(p.status)
    if record is not None and record.run == run and p.is_finished:
        status = record.outcome
    started = None if record is None else record.started
    if started is None and run == 1:
        started = Action(kind="submit")
    return ProcedureStatus(
        id=p.procedure_id,
        type_name=p.type_name,
        parent_id=p.parent_id,
        status=status,
        step=p.latest.step,
        run=run,
        started_at=_run_start(p, modified) if record is None else _parsed(record.started_at) or _run_start(p, modified),
        ended_at=(_parsed(record.ended_at) if record is not None else _time(p.modified)) if p.is_finished else None,
        updated_at=_time(p.modified),
        error=(record.error if record is not None and p.is_finished else None) or p.error,
        pending=pending,
        started=started,
        problem=p.problem,
        waiting=p.waiting,
        # One of another run, or left behind by a procedure that has ended, says nothing.
        activity=activity if activity is not None and activity.run == run and not p.is_finished else None,
        no_manager=no_manager and not p.is_finished,
    )


def _run_start(p: StoredProcedure, modified: dict[str, float | None]) -> datetime | None:
    """When the latest run's first key was written: the lowest key above the last `.commit`
    below the latest key (a restart's copy starts a run above the ended run's `.commit`)."""
    first = p.keys[0]
    for at, key in enumerate(p.keys[:-1]):
        if key.key_type is KeyType.COMMIT:
            first = p.keys[at + 1]
    return _time(modified.get(str(first)))
