"""Durable waits in a term: the procedures parked on a timer or a signal, and the one task
that wakes them; and flow control (`Waits.flow`), what procedures wait for before they start.

A procedure whose step returned `Status.sleep`, `sleep_until` or `wait_for_signal` has its
state and wake-up time stored (`ProcedureMessage.wake_at`, `signal`), then parks: its
runner's task ends (its locks stay held) and only an entry here remains, so that 100,000
sleepers cost their records and no task each. One scheduler task sleeps until the earliest
wake-up time, by the manager's clock (`wall_clock`), and restarts the runners that are due.

What else wakes a parked procedure at once (`Waits.wake`): an operator's cancel or fail (its
runner then fails it at its next attempt), and a signal of the name it waits for sent by
`signal()` here, or one found by the watch of `requests/` that it has not read yet (its
runner then reads it, and parks again if it is of another name: a signal of another name
it has read never wakes it again). Recovery and a takeover read the stored time, so the
wait counts from when it began, not from the restart.
"""

from __future__ import annotations

import asyncio
import contextvars
import heapq
import itertools
import time
from collections.abc import Callable, Collection, Coroutine, Mapping
from dataclasses import dataclass
from typing import Any

from procstore._runtime.flow_control import FlowControl
from procstore.ids import ProcedureId
from procstore.store.rate_starts import RateStartsStore

_HEAP_SLACK = 64
"""Stale heap items kept before a rebuild beyond one per live item: each costs a tuple, not a procedure."""

Spawn = Callable[[Coroutine[Any, Any, None], str], asyncio.Task[None]]


def wall_clock() -> float:
    """The manager's clock, in seconds since the epoch: the machine's wall clock, or on an
    event loop with virtual time (`procstore.testing.SimulatedLoop`) the loop's, so that a
    ten-minute sleep takes no real time in a test."""
    loop = asyncio.get_running_loop()
    wall_time: Callable[[], float] | None = getattr(loop, "wall_time", None)
    return wall_time() if wall_time is not None else time.time()


@dataclass(slots=True)
class _Parked:
    """One parked procedure: when it wakes by itself, what it waits for, how to resume it,
    and which of its stored signals are not the one it waits for."""

    wake_at: float | None
    signal: str | None
    resume: Callable[[], None]
    not_for_it: frozenset[str]


class Waits:
    """The parked procedures of a term, and the one task that wakes them on time."""

    __slots__ = ("_changed", "_counter", "_heap", "_parked", "_reading", "_spawn", "_task", "flow")

    def __init__(self, spawn: Spawn, rate_starts: RateStartsStore) -> None:
        self._spawn = spawn
        self.flow = FlowControl(rate_starts, wall_clock)
        """Concurrency slots and rate limits: what a procedure waits for before its first step."""
        self._parked: dict[ProcedureId, _Parked] = {}
        # Invariant: every entry of `_parked` with a wake-up time has a heap item of that time.
        # An item names the procedure only, never its entry: the entry of one woken early
        # (signalled, cancelled) holds its runner, and with it the procedure's state, which
        # must go when it ends, not when its timeout would have passed. An item whose time
        # is not its procedure's (woken early, or parked again) is skipped when popped, and
        # the heap is rebuilt once such items outnumber the live ones.
        self._heap: list[tuple[float, int, ProcedureId]] = []
        self._counter = itertools.count()
        self._changed: asyncio.Event | None = None
        self._task: asyncio.Task[None] | None = None
        self._reading: dict[ProcedureId, bool] = {}
        """The procedures reading their signals before they park, and whether a signal was
        sent to them through this manager since they began (their read may have missed it)."""

    def __len__(self) -> int:
        return len(self._parked)

    def __contains__(self, procedure_id: object) -> bool:
        return procedure_id in self._parked

    def park(
        self,
        procedure_id: ProcedureId,
        wake_at: float | None,
        signal: str | None,
        resume: Callable[[], None],
        not_for_it: frozenset[str] = frozenset(),
    ) -> None:
        """Hold the procedure until `wake_at` (epoch seconds; None: no timer) or until `wake`;
        `resume` is called once, then, to run it again. `not_for_it`: the keys of its stored
        signals that it read and that are not `signal`'s (or were consumed): a listing that
        shows only those does not wake it."""
        self._parked[procedure_id] = _Parked(wake_at, signal, resume, not_for_it)
        if wake_at is None:
            return
        earliest = self._heap[0][0] if self._heap else None
        heapq.heappush(self._heap, (wake_at, next(self._counter), procedure_id))
        if self._task is None:
            self._changed = asyncio.Event()
            # In a context of its own, not the first sleeper's: it wakes every procedure.
            self._task = contextvars.Context().run(self._spawn, self._wake_on_time(), "procstore:timers")
            self._task.add_done_callback(self._ended)
        elif (earliest is None or wake_at < earliest) and self._changed is not None:
            self._changed.set()

    def wake(self, procedure_id: ProcedureId) -> bool:
        """Resume a parked procedure now; False if it is not parked here."""
        entry = self._parked.pop(procedure_id, None)
        if entry is None:
            return False
        if len(self._heap) > 2 * len(self._parked) + _HEAP_SLACK:
            self._drop_stale_items()
        entry.resume()
        return True

    def _drop_stale_items(self) -> None:
        """Rebuild the heap from the parked entries (in place: the timer task holds it)."""
        self._heap[:] = [
            (entry.wake_at, next(self._counter), pid)
            for pid, entry in self._parked.items()
            if entry.wake_at is not None
        ]
        heapq.heapify(self._heap)

    def begin_reading(self, procedure_id: ProcedureId) -> None:
        """The procedure is about to read its signals, and then to park if none is the one it waits for."""
        self._reading[procedure_id] = False

    def end_reading(self, procedure_id: ProcedureId) -> bool:
        """Its read is over; whether a signal was sent to it meanwhile (read again before parking)."""
        return self._reading.pop(procedure_id, False)

    def signalled(self, procedure_id: ProcedureId, name: str) -> None:
        """A signal `name` for the procedure was stored: wake it if it is parked waiting for
        that name, or tell its read under way to read again."""
        if procedure_id in self._reading:
            self._reading[procedure_id] = True
        elif (entry := self._parked.get(procedure_id)) is not None and entry.signal == name:
            self.wake(procedure_id)

    def waiting_for_signals(self, listed: Mapping[ProcedureId, Collection[str]]) -> list[ProcedureId]:
        """The procedures parked here waiting for a signal, whose signal keys `listed` include
        one they have not read (it may be the one they wait for)."""
        return [
            pid
            for pid, keys in listed.items()
            if (entry := self._parked.get(pid)) is not None
            and entry.signal
            and any(key not in entry.not_for_it for key in keys)
        ]

    async def _wake_on_time(self) -> None:
        heap = self._heap
        while True:
            now = wall_clock()
            while heap and heap[0][0] <= now:
                _, _, pid = heapq.heappop(heap)
                entry = self._parked.get(pid)
                if entry is not None and entry.wake_at is not None and entry.wake_at <= now:
                    del self._parked[pid]
                    entry.resume()
            changed = self._changed
            assert changed is not None
            changed.clear()
            # The loop's clock times the sleep: a virtual one jumps to the wake-up at once.
            try:
                async with asyncio.timeout(heap[0][0] - now if heap else None):
                    await changed.wait()
            except TimeoutError:
                pass

    def _ended(self, task: asyncio.Task[None]) -> None:
        if self._task is task:
            self._task = None
