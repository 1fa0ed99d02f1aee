"""`ProcedureMeta`: what the manager keeps in memory about one procedure."""

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


class ProcedureMeta:
    """A procedure's identity, current state and children, with change notification.

    Each state change sets the current `asyncio.Event` and replaces it, so a waiter that
    took the event before the change is always woken (no lost wake-ups).
    """

    # Slots: one is kept per procedure, for as long as it runs and for the metadata TTL.
    __slots__ = (
        "_changed", "_ended", "_on_end", "_requested", "_state", "abandoned", "cancelled", "children", "end_stored",
        "end_time", "ended_at", "ended_by", "id", "inherited", "is_root", "keep_keys", "lock_key", "parent_id",
        "retries", "rolled_back", "run", "start_time", "started", "steps", "terminal_keys", "type_name", "waiting",
        "wrote_every_key",
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
        procedures have none, and recovery makes thousands of these at once)."""
        self.start_time: datetime | None = None
        self.end_time: datetime | None = None
        self.ended_at: float | None = None
        """`time.monotonic()` when it ended, for the metadata TTL."""
        self.abandoned = False
        """Set by `stop()`: no more state changes will come from this process."""
        self.inherited = False
        """Resumed from the store at start (not submitted to this manager): a former leader
        may still have a write of it in flight, so its keys are deleted after a grace period."""
        self.keep_keys = False
        """Its stored keys must survive the tree's deletion (rollback failed, unreadable)."""
        self.rolled_back = False
        """Its rollback ran to the end (its FAILED state is a rolled-back one)."""
        self.cancelled = False
        """It failed because an operator cancelled it or an ancestor (not a `fail` request)."""
        self.started: Action | None = None
        """How this run started, for its history record: a submit here, or an operator's
        resume or rewind (None: taken over from the store, its start not seen)."""
        self.ended_by: Action | None = None
        """The operator request (cancel, fail) that ended it, for its history record."""
        self.steps = 0
        """The highest step number it stored, as of its end (for its history record)."""
        self.retries = 0
        """Retries of its steps and rollback in this process (for its history record)."""
        self.wrote_every_key = False
        """Set for a procedure this term created (a submit, a child): every key it has is one
        its runner wrote and saw land, so its end deletes them without listing the folder.
        Cleared by any write whose outcome is unknown."""
        self.terminal_keys: tuple[tuple[int, KeyType], ...] = ()
        """The `.rollback` and `.commit` keys its runner wrote, by step."""
        self.waiting: str | None = None
        """Why it waits, if it does: flow control, a durable timer or a signal (`ProcedureInfo.waiting`)."""
        self.end_stored = False
        """Its run's `.commit` is stored: the run has ended for good, and only then is its end
        record written (an end not stored, such as a rollback to run again at the next
        start, must never be taken for one)."""

        self._state = state
        # Events are made on first wait: most procedures are never watched, and recovery
        # builds thousands of these at once.
        self._changed: asyncio.Event | None = None
        self._requested: asyncio.Event | None = None
        self._ended: asyncio.Event | None = None
        self._on_end = on_end
        if state.is_ended():
            self._mark_ended()

    def outcome(self, state: ProcedureState | None = None) -> Outcome:
        """How it ended (its state, or `state`): the metrics' and history's outcome."""
        state = self._state if state is None else state
        if state.kind is ProcedureStateKind.DONE:
            return "done"
        if state.kind is ProcedureStateKind.POISONED:
            return "poisoned"
        if self.cancelled:
            return "cancelled"
        return "rolled back" if self.rolled_back else "failed"

    def known_keys(self, prefix: str) -> list[ParsedKey] | None:
        """Every key it has, if this term wrote them all (see `wrote_every_key`): the steps
        below its first terminal key, and the terminal keys."""
        if not (self.wrote_every_key and self.terminal_keys):
            return None
        first_end = min(step for step, _ in self.terminal_keys)
        steps = [ParsedKey(prefix, self.id, step, KeyType.STEP) for step in range(first_end)]
        return steps + [ParsedKey(prefix, self.id, step, kind) for step, kind in self.terminal_keys]

    @property
    def state(self) -> ProcedureState:
        return self._state

    def set_state(self, state: ProcedureState) -> None:
        if self._state.is_ended():
            return  # final states are final; a late writer must not resurrect it
        self._state = state
        if state.is_ended():
            self._mark_ended()
        self._notify()

    def _mark_ended(self) -> None:
        self.end_time = datetime.now(UTC)
        self.ended_at = time.monotonic()
        if self._ended is not None:
            self._ended.set()
        if self._on_end is not None:
            self._on_end(self)

    def mark_started(self) -> None:
        self.start_time = datetime.now(UTC)

    def requested(self) -> asyncio.Event:
        """Set once an operator's request (cancel, fail) applies to this procedure: its
        runner's waits (a retry's backoff, a lock) end early, so that the request is honoured
        within a poll interval however long the wait."""
        if self._requested is None:
            self._requested = asyncio.Event()
        return self._requested

    def abandon(self) -> None:
        """The manager stopped: wake every waiter so none hangs on a state that will not change."""
        self.abandoned = True
        self._notify()

    def _notify(self) -> None:
        changed, self._changed = self._changed, None
        if changed is not None:
            changed.set()

    async def wait_state_change(self) -> ProcedureState:
        """Wait for the next state change (or for the manager to stop) and return the state."""
        if not self.abandoned:
            if self._changed is None:
                self._changed = asyncio.Event()
            await self._changed.wait()
        return self._state

    async def wait_ended(self) -> None:
        """Wait until the procedure reaches a final state (not woken by `abandon()`)."""
        if self._state.is_ended():
            return
        if self._ended is None:
            self._ended = asyncio.Event()
        await self._ended.wait()

    def add_child(self, child_id: ProcedureId) -> None:
        if child_id in self.children:
            return
        if isinstance(self.children, list):
            self.children.append(child_id)
        else:
            self.children = [*self.children, child_id]

    def info(self) -> ProcedureInfo:
        return ProcedureInfo(
            id=self.id,
            type_name=self.type_name,
            state=self._state,
            start_time=self.start_time,
            end_time=self.end_time,
            lock_keys=list(self.lock_key.keys_to_lock()),
            parent_id=self.parent_id,
            waiting=self.waiting,
        )
