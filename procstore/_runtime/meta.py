"""`ProcedureMeta`: what the manager keeps in memory about one procedure, in three parts:
the state its waiters watch (`WatchedState`), what its run did (`RunRecord`) and what its
runner knows of its stored keys (`WrittenKeys`)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence
from datetime import UTC, datetime

from procstore.ids import ProcedureId
from procstore.lock_key import LockKey
from procstore.state import ProcedureInfo, ProcedureState, ProcedureStateKind
from procstore.store.history import Action, Outcome
from procstore.store.keys import KeyType, ParsedKey


class RunRecord:
    """What this run did and does, for its history record, its metrics and `ProcedureInfo`.

    Its fields are class attributes until first set: recovery makes thousands of these at
    once, and most are never written (an `__init__` setting ten fields doubled a meta's cost).
    """

    started: Action | None = None
    """How this run started: a submit here, or an operator's resume or rewind (None: taken
    over from the store, its start not seen)."""
    start_time: datetime | None = None
    steps: int = 0
    """The highest step number it stored, as of its end."""
    retries: int = 0
    """Retries of its steps and rollback in this process."""
    waiting: str | None = None
    """Why it waits, if it does: flow control, a durable timer or a signal (`ProcedureInfo.waiting`)."""
    ended_by: Action | None = None
    """The operator request (cancel, fail) that ended it."""
    cancelled: bool = False
    """It failed because an operator cancelled it or an ancestor (not a `fail` request)."""
    rolled_back: bool = False
    """Its rollback ran to the end (its FAILED state is a rolled-back one)."""
    end_time: datetime | None = None
    ended_at: float | None = None
    """`time.monotonic()` when it ended, for the metadata TTL."""


class WrittenKeys:
    """What this run's runner knows of its keys in the store: it decides how, when and
    whether the tree's deletion removes them. Class attributes until first set, as `RunRecord`'s."""

    every: bool = False
    """Set for a procedure this term created (a submit, a child): every key it has is one
    its runner wrote and saw land, so its end deletes them without listing the folder.
    Cleared by any write whose outcome is unknown."""
    terminal: tuple[tuple[int, KeyType], ...] = ()
    """The `.rollback` and `.commit` keys its runner wrote, by step."""
    end_stored: bool = False
    """Its run's `.commit` is stored: the run has ended for good, and only then is its end
    record written (an end not stored, such as a rollback to run again at the next start,
    must never be taken for one)."""
    keep: bool = False
    """Its stored keys must survive the tree's deletion (rollback failed, unreadable)."""
    inherited: bool = False
    """Resumed from the store at start (not submitted to this manager): a former leader may
    still have a write of it in flight, so its keys are deleted after a grace period."""

    def known(self, prefix: str, procedure_id: ProcedureId) -> list[ParsedKey] | None:
        """Every key it has, if this term wrote them all (see `every`): the steps below its
        first terminal key, and the terminal keys."""
        if not (self.every and self.terminal):
            return None
        first_end = min(step for step, _ in self.terminal)
        steps = [ParsedKey(prefix, procedure_id, step, KeyType.STEP) for step in range(first_end)]
        return steps + [ParsedKey(prefix, procedure_id, step, kind) for step, kind in self.terminal]


class WatchedState:
    """A procedure's state, the events its waiters sleep on and the callback told of its end.

    Each state change sets the current `changed` event and replaces it, so a waiter that
    took the event before the change is always woken (no lost wake-ups). Events are made on
    first wait, and the fields but the state are class attributes until first set: most
    procedures are never watched, and recovery builds thousands at once.
    """

    abandoned: bool = False
    """Set by `stop()`: no more state changes will come from this process."""
    changed: asyncio.Event | None = None
    ended: asyncio.Event | None = None
    requested: asyncio.Event | None = None

    def __init__(self, state: ProcedureState, on_end: Callable[[ProcedureMeta], None] | None) -> None:
        self.state = state
        self.on_end = on_end
        """The registry's: called once, when the state becomes final."""

    def notify(self) -> None:
        changed, self.changed = self.changed, None
        if changed is not None:
            changed.set()


class ProcedureMeta:
    """A procedure's identity, current state and children, with change notification."""

    # One is kept per procedure, for as long as it runs and for the metadata TTL.
    __slots__ = (
        "_watched", "children", "id", "is_root", "keys", "lock_key", "parent_id", "record", "run", "type_name",
    )  # fmt: skip

    def __init__(
        self,
        procedure_id: ProcedureId,
        type_name: str,
        parent_id: ProcedureId | None,
        lock_key: LockKey,
        state: ProcedureState,
        on_end: Callable[[ProcedureMeta], None] | None = None,
        run: int = 1,
    ) -> None:
        self.id = procedure_id
        self.run = run
        """Which run of the id this is (`ProcedureMessage.run`): every key it writes carries
        it, and whatever is remembered or postponed for it acts on this run only. A resume or
        rewind makes a new meta with the next run; this one stays as it ended."""
        self.type_name = type_name
        self.parent_id = parent_id
        self.lock_key = lock_key
        self.is_root = parent_id is None
        """Whether it ends its own tree (a root, or an orphan resumed as one)."""
        self.children: Sequence[ProcedureId] = ()
        """Its subprocedures, in the order they were added: a list once it has one (most
        procedures have none)."""
        self.record = RunRecord()
        self.keys = WrittenKeys()
        self._watched = WatchedState(state, on_end)
        if state.is_ended():
            self._mark_ended()

    def outcome(self, state: ProcedureState | None = None) -> Outcome:
        """How it ended (its state, or `state`): the metrics' and history's outcome."""
        state = self._watched.state if state is None else state
        if state.kind is ProcedureStateKind.DONE:
            return "done"
        if state.kind is ProcedureStateKind.POISONED:
            return "poisoned"
        if self.record.cancelled:
            return "cancelled"
        return "rolled back" if self.record.rolled_back else "failed"

    @property
    def state(self) -> ProcedureState:
        return self._watched.state

    @property
    def abandoned(self) -> bool:
        """`stop()` ran: no more state changes will come from this process."""
        return self._watched.abandoned

    def set_state(self, state: ProcedureState) -> None:
        watched = self._watched
        if watched.state.is_ended():
            return  # final states are final; a late writer must not resurrect it
        watched.state = state
        if state.is_ended():
            self._mark_ended()
        watched.notify()

    def _mark_ended(self) -> None:
        self.record.end_time = datetime.now(UTC)
        self.record.ended_at = time.monotonic()
        watched = self._watched
        if watched.ended is not None:
            watched.ended.set()
        if watched.on_end is not None:
            watched.on_end(self)

    def mark_started(self) -> None:
        self.record.start_time = datetime.now(UTC)

    def requested(self) -> asyncio.Event:
        """Set once an operator's request (cancel, fail) applies to this procedure: its
        runner's waits (a retry's backoff, a lock) end early, so that the request is honoured
        within a poll interval however long the wait."""
        watched = self._watched
        if watched.requested is None:
            watched.requested = asyncio.Event()
        return watched.requested

    def abandon(self) -> None:
        """The manager stopped: wake every waiter so none hangs on a state that will not change."""
        self._watched.abandoned = True
        self._watched.notify()

    async def wait_state_change(self) -> ProcedureState:
        """Wait for the next state change (or for the manager to stop) and return the state."""
        watched = self._watched
        if not watched.abandoned:
            if watched.changed is None:
                watched.changed = asyncio.Event()
            await watched.changed.wait()
        return watched.state

    async def wait_ended(self) -> None:
        """Wait until the procedure reaches a final state (not woken by `abandon()`)."""
        watched = self._watched
        if watched.state.is_ended():
            return
        if watched.ended is None:
            watched.ended = asyncio.Event()
        await watched.ended.wait()

    def add_child(self, child_id: ProcedureId) -> None:
        if child_id in self.children:
            return
        if isinstance(self.children, list):
            self.children.append(child_id)
        else:
            self.children = [*self.children, child_id]

    def info(self) -> ProcedureInfo:
        record = self.record
        return ProcedureInfo(
            id=self.id,
            type_name=self.type_name,
            state=self._watched.state,
            start_time=record.start_time,
            end_time=record.end_time,
            lock_keys=list(self.lock_key.keys_to_lock()),
            parent_id=self.parent_id,
            waiting=record.waiting,
        )
