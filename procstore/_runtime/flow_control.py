"""Flow control in a term: concurrency slots per key, and the rate of first starts per type.

A procedure that declares a `Concurrency` or whose type has a `RateLimit` is admitted
before its first step (before its locks, so a procedure waiting here holds none). While it
waits, its metadata says why (`ProcedureInfo.waiting`). Among the waiters of one key (or
one type), the highest `priority()` goes first, then the earliest.

A procedure resumed past its first step (after a restart or a takeover) was running
already: it takes its slot at once, even above the limit, and counts against it until it
ends; it is no new start for the rate. The rate counts the starts this term admitted.
"""

from __future__ import annotations

import asyncio
import itertools
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from procstore.flow import Concurrency, RateLimit
from procstore.ids import ProcedureId


@dataclass(frozen=True, slots=True)
class Admission:
    """What one procedure asks of flow control: its slot and its type's rate."""

    type_name: str
    concurrency: Concurrency | None
    rate: RateLimit | None
    priority: int = 0

    @property
    def limited(self) -> bool:
        return self.concurrency is not None or self.rate is not None


@dataclass(slots=True)
class _Waiter:
    pid: ProcedureId
    admission: Admission
    order: tuple[int, int] = field(default=(0, 0))

    def ahead_of(self, other: _Waiter) -> bool:
        return self.order < other.order


class FlowControl:
    """The slots held per concurrency key, the recent starts per type, and who waits."""

    __slots__ = ("_changed", "_counter", "_held_key", "_holders", "_starts", "_waiters")

    def __init__(self) -> None:
        self._holders: dict[str, set[ProcedureId]] = {}
        self._held_key: dict[ProcedureId, str] = {}
        self._starts: dict[str, deque[float]] = {}
        """Per type with a rate limit: the loop times of the starts admitted in its last period."""
        self._waiters: list[_Waiter] = []
        self._counter = itertools.count()
        self._changed = asyncio.Event()

    async def admit(
        self,
        pid: ProcedureId,
        admission: Admission,
        *,
        started: bool,
        unless: asyncio.Event,
        report: Callable[[str | None], None],
    ) -> bool:
        """Wait until `pid` may run: a slot of its key free and its type's rate allowing a
        start (`started`: it ran before, and takes its slot at once). False, with nothing
        taken, if `unless` is set first (an operator's request). `report` is told why it
        waits, and None once it does not."""
        if not admission.limited or pid in self._held_key:
            return True
        if started:
            self.take_started(pid, admission)
            return True
        waiter = _Waiter(pid, admission, (-admission.priority, next(self._counter)))
        self._waiters.append(waiter)
        try:
            while True:
                reason, retry_in = self._blocked(waiter)
                if reason is None:
                    self._take(pid, admission, rate=True)
                    return True
                report(reason)
                if unless.is_set():
                    return False
                await _either(self._changed, unless, seconds=retry_in)
        finally:
            self._waiters.remove(waiter)
            report(None)
            self._notify()

    def take_started(self, pid: ProcedureId, admission: Admission) -> None:
        """A procedure that ran before (resumed by a recovery) takes its slot now, even above the limit."""
        if admission.limited and pid not in self._held_key:
            self._take(pid, admission, rate=False)

    def release(self, pid: ProcedureId) -> None:
        """The procedure ended here (or its runner stopped): its slot is free."""
        key = self._held_key.pop(pid, None)
        if key is not None:
            holders = self._holders[key]
            holders.discard(pid)
            if not holders:
                del self._holders[key]
            self._notify()

    def _take(self, pid: ProcedureId, admission: Admission, *, rate: bool) -> None:
        if (concurrency := admission.concurrency) is not None:
            self._holders.setdefault(concurrency.key, set()).add(pid)
            self._held_key[pid] = concurrency.key
        if rate and admission.rate is not None:
            self._starts.setdefault(admission.type_name, deque()).append(asyncio.get_running_loop().time())

    def _blocked(self, waiter: _Waiter) -> tuple[str | None, float | None]:
        """Why `waiter` cannot start now (None: it can), and in how many seconds the rate
        allows another start (None: when something changes)."""
        admission = waiter.admission
        if (concurrency := admission.concurrency) is not None:
            running = len(self._holders.get(concurrency.key, ()))
            if running >= concurrency.limit:
                return (
                    f"waiting for a concurrency slot of {concurrency.key!r} "
                    f"({running} running, limit {concurrency.limit})",
                    None,
                )
            ahead = [w for w in self._waiters if w.ahead_of(waiter) and _same_key(w, concurrency.key)]
            if len(ahead) + running >= concurrency.limit:
                return f"waiting behind {len(ahead)} procedures of higher priority for {concurrency.key!r}", None
        if (rate := admission.rate) is not None:
            now = asyncio.get_running_loop().time()
            window = self._starts.setdefault(admission.type_name, deque())
            while window and window[0] <= now - rate.per:
                window.popleft()
            if len(window) >= rate.starts:
                return (
                    f"waiting for the rate limit of {admission.type_name!r} ({rate.starts} starts per {rate.per:g}s)",
                    window[0] + rate.per - now,
                )
            ahead = [w for w in self._waiters if w.ahead_of(waiter) and w.admission.type_name == admission.type_name]
            if len(ahead) + len(window) >= rate.starts:
                return f"waiting behind {len(ahead)} procedures of higher priority of {admission.type_name!r}", None
        return None, None

    def _notify(self) -> None:
        changed, self._changed = self._changed, asyncio.Event()
        changed.set()


def _same_key(waiter: _Waiter, key: str) -> bool:
    concurrency = waiter.admission.concurrency
    return concurrency is not None and concurrency.key == key


async def _either(changed: asyncio.Event, unless: asyncio.Event, *, seconds: float | None) -> None:
    """Wait until either event is set, or for `seconds` (None: no limit)."""
    waits = [asyncio.ensure_future(changed.wait()), asyncio.ensure_future(unless.wait())]
    try:
        await asyncio.wait(waits, timeout=seconds, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for wait in waits:
            wait.cancel()
        await asyncio.gather(*waits, return_exceptions=True)
