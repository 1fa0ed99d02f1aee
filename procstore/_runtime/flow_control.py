"""Flow control in a term: concurrency slots per key, and the rate of first starts per type.

A procedure that declares a `Concurrency` or whose type has a `RateLimit` is admitted
before its first step (before its locks, so a procedure waiting here holds none). While it
waits, its metadata says why (`ProcedureInfo.waiting`). Among the waiters of one key (or
one type), the highest `priority()` goes first, then the earliest.

A procedure resumed past its first step by a restart or a takeover was running already:
it takes its slot at once, even above the limit, and counts against it until it ends; it
is no new start for the rate. One an operator resumes or rewinds after it ended held no
slot, and waits for one as a new procedure does. The rate counts the starts stored by
earlier terms (`RateStartsStore`, read at the first admission of the type) and those this
term admitted, each stored before its procedure runs.
"""

from __future__ import annotations

import asyncio
import bisect
import contextlib
import itertools
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field

from procstore._aio import unless_set
from procstore._logs import get_logger
from procstore.errors import describe
from procstore.flow import Concurrency, RateLimit
from procstore.ids import ProcedureId
from procstore.store.rate_starts import RateStartsStore

logger = get_logger("procstore.runtime")


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
    order: tuple[int, int]
    """(-priority, arrival): the waiters of a key or a type start in this order."""
    woken: asyncio.Event = field(default_factory=asyncio.Event)
    timed: bool = False
    """Its last look set it a timer (its rate's next start): a release need not wake it."""


def _order(waiter: _Waiter) -> tuple[int, int]:
    return waiter.order


class FlowControl:
    """The slots held per concurrency key, the recent starts per type, and who waits.

    Invariant: `_by_key[k]` holds the waiters with concurrency key `k`, and `_by_type[t]`
    those of a type `t` with a rate limit, each sorted by `order`; a change wakes only the
    waiters at the head of the queues it concerns (as many as could start, and those ahead
    of them that its rate holds back with no timer yet), so a release costs what it frees,
    not a look at every waiter."""

    __slots__ = ("_by_key", "_by_type", "_clock", "_counter", "_held_key", "_holders", "_starts", "_stored", "_writing")

    def __init__(self, stored: RateStartsStore, clock: Callable[[], float]) -> None:
        self._stored = stored
        self._clock = clock
        """The manager's wall clock (epoch seconds): the stored starts are compared across managers."""
        self._holders: dict[str, set[ProcedureId]] = {}
        self._held_key: dict[ProcedureId, str] = {}
        self._starts: dict[str, deque[float]] = {}
        """Per type with a rate limit, once read from the store: the times of its starts in
        its last period (stored ones, then those admitted here)."""
        self._writing: dict[str, asyncio.Lock] = {}
        """Per type: held while its stored starts are read, or written (one write at a time,
        each with every start admitted before it, so that none is lost to a reordered write)."""
        self._by_key: dict[str, list[_Waiter]] = {}
        self._by_type: dict[str, list[_Waiter]] = {}
        self._counter = itertools.count()

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
        if admission.rate is not None and admission.type_name not in self._starts:
            await self._read_starts(admission.type_name)
        waiter = _Waiter(pid, admission, (-admission.priority, next(self._counter)))
        queues = self._queues_of(admission)
        for queue in queues:
            bisect.insort(queue, waiter, key=_order)
        try:
            while True:
                reason, retry_in = self._blocked(waiter)
                if reason is None:
                    self._take(pid, admission, rate=True)
                    break
                report(reason)
                if unless.is_set():
                    return False
                waiter.woken.clear()
                waiter.timed = retry_in is not None
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(retry_in):
                        await unless_set(waiter.woken.wait, unless)
        finally:
            for queue in queues:
                queue.remove(waiter)
            report(None)
            self._wake_heads(admission)
        if admission.rate is not None:
            await self._write_starts(admission.type_name)
        return True

    async def _read_starts(self, type_name: str) -> None:
        """Count the starts of `type_name` that the store holds (by earlier managers), once a term.
        One it cannot read counts as none: the limit then holds from this term's starts. A
        time ahead of this manager's clock (a clock ahead, another writer) counts as now, so
        that it ends with a period as every start does."""
        async with self._writing.setdefault(type_name, asyncio.Lock()):
            if type_name in self._starts:
                return
            try:
                now = self._clock()
                stored = sorted(min(t, now) for t in await self._stored.get(type_name))
            except Exception as e:
                logger.warning("cannot read the recent starts of %s (%s): counting from now", type_name, describe(e))
                stored = []
            self._starts[type_name] = deque(stored)

    async def _write_starts(self, type_name: str) -> None:
        """Store the recent starts of `type_name`, before the one just admitted runs. One
        not stored is counted by this term only (logged)."""
        async with self._writing[type_name]:
            try:
                await self._stored.put(type_name, list(self._starts[type_name]))
            except Exception as e:
                logger.warning("cannot store the recent starts of %s (%s)", type_name, describe(e))

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
            self._wake_key(key)

    def _queues_of(self, admission: Admission) -> list[list[_Waiter]]:
        queues = []
        if admission.concurrency is not None:
            queues.append(self._by_key.setdefault(admission.concurrency.key, []))
        if admission.rate is not None:
            queues.append(self._by_type.setdefault(admission.type_name, []))
        return queues

    def _take(self, pid: ProcedureId, admission: Admission, *, rate: bool) -> None:
        if (concurrency := admission.concurrency) is not None:
            self._holders.setdefault(concurrency.key, set()).add(pid)
            self._held_key[pid] = concurrency.key
        if rate and admission.rate is not None:
            self._starts.setdefault(admission.type_name, deque()).append(self._clock())

    def _wake_heads(self, admission: Admission) -> None:
        if admission.concurrency is not None:
            self._wake_key(admission.concurrency.key)
        if (rate := admission.rate) is not None and (queue := self._by_type.get(admission.type_name)):
            # The first in line look again: they start, or sleep until the rate allows.
            free = max(rate.starts - len(self._starts.get(admission.type_name, ())), 1)
            for waiter in queue[:free]:
                waiter.woken.set()

    def _wake_key(self, key: str) -> None:
        queue = self._by_key.get(key)
        if not queue:
            self._by_key.pop(key, None)
            return
        concurrency = queue[0].admission.concurrency
        assert concurrency is not None
        free = max(concurrency.limit - len(self._holders.get(key, ())), 1)
        # Those its type's rate holds back let the next start; one of them that waited for a
        # slot has no timer, and looks again to sleep on its rate's (once: it then has one).
        for waiter in queue:
            if not self._rate_full(waiter.admission):
                waiter.woken.set()
                free -= 1
                if not free:
                    break
            elif not waiter.timed:
                waiter.woken.set()

    def _startable(self, queue: Iterable[_Waiter]) -> Iterator[_Waiter]:
        """The waiters of a key's queue, in order, but those whose type's rate allows no start now."""
        return (waiter for waiter in queue if not self._rate_full(waiter.admission))

    def _startable_ahead(self, queue: list[_Waiter], waiter: _Waiter, enough: int) -> int:
        """How many of those ahead of `waiter` in a key's queue could start now (counted up to `enough`)."""
        ahead = itertools.takewhile(lambda other: other is not waiter, queue)
        return sum(1 for _ in itertools.islice(self._startable(ahead), enough))

    def _rate_full(self, admission: Admission) -> bool:
        rate = admission.rate
        return rate is not None and len(self._recent_starts(admission.type_name, rate)) >= rate.starts

    def _recent_starts(self, type_name: str, rate: RateLimit) -> deque[float]:
        """The times of the starts of `type_name` in the last `rate.per` seconds."""
        now = self._clock()
        window = self._starts.get(type_name, deque())  # none read yet: none counted
        # The same sum as `_window_moves_in`'s: `window[0] <= now - per` can disagree with it
        # in the last bit, and a start kept here would be due in 0 seconds for ever.
        while window and window[0] + rate.per <= now:
            window.popleft()
        return window

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
            # Only those ahead that could start now count: one its type's rate holds back
            # does not keep a free slot idle.
            free = concurrency.limit - running
            ahead = self._startable_ahead(self._by_key[concurrency.key], waiter, free)
            if ahead >= free:
                return f"waiting behind {ahead} procedures of higher priority for {concurrency.key!r}", None
        if (rate := admission.rate) is not None:
            now = self._clock()
            window = self._recent_starts(admission.type_name, rate)
            if len(window) >= rate.starts:
                return (
                    f"waiting for the rate limit of {admission.type_name!r} ({rate.starts} starts per {rate.per:g}s)",
                    _window_moves_in(window, rate, now),
                )
            ahead = bisect.bisect_left(self._by_type[admission.type_name], waiter.order, key=_order)
            if len(window) + ahead >= rate.starts:
                # Those ahead may wait for a slot instead: look again when the window moves.
                retry_in = _window_moves_in(window, rate, now) if window else None
                return f"waiting behind {ahead} procedures of higher priority of {admission.type_name!r}", retry_in
        return None, None


_SOONEST_LOOK = 0.001
"""The shortest wait for a rate's window to move: a wait of less than the clock's resolution
(a start due within a few ulps of now) would not move a simulated loop's clock at all."""


def _window_moves_in(window: deque[float], rate: RateLimit, now: float) -> float:
    """Seconds until the oldest start in `window` leaves it (at least `_SOONEST_LOOK`)."""
    return max(window[0] + rate.per - now, _SOONEST_LOOK)
