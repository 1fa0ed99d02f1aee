"""Simulated time and seeded schedules for tests (Temporal's time skipping, FoundationDB's
deterministic simulation, in the small).

`SimulatedLoop` is an asyncio event loop with two changes:

- **Virtual time.** Its clock starts at 0 and, whenever nothing is ready to run, jumps to
  the next timer instead of waiting for it: retry backoffs, the retry budget, durable
  timers (`Status.sleep`, read from `wall_time()`) and a test's own `asyncio.sleep` take no
  real time, and their order is kept; so do leases (their
  clock is this loop's here, the machine's boot-time clock everywhere else).
- **A seeded schedule.** Given a seed, the callbacks ready at each turn of the loop run in
  an order drawn from it, and some are held back a turn, as if their task were slower
  (asyncio promises no order between independent tasks); and
  `ProcedureId.random()` and the retry jitter draw from it too: the same seed replays the
  same interleaving of concurrent procedures, another seed tries another.

Both hold for code that does no real I/O: use the `memory://` store. A backend that works in
threads (a local directory, S3) still runs, but time then jumps past work a thread is
still doing, so timeouts and waits lose their meaning there.

    run_simulated(main(), seed=7)     # instead of asyncio.run(main())
"""

from __future__ import annotations

import asyncio
import random
import time
import uuid
from collections.abc import Coroutine
from typing import Any, TypeVar

from procstore import ids

T = TypeVar("T")

DEFER = 0.3
"""How often a seeded schedule holds a ready callback back a turn."""


class SimulatedLoop(asyncio.SelectorEventLoop):
    """An event loop with virtual time and, given a seed, a seeded order of ready callbacks."""

    virtual_time = True
    """Read by the lease's clock: on this loop, TTLs pass in virtual time too."""

    def __init__(self, seed: int | None = None) -> None:
        # Set before the base loop's __init__, which may fail half way (no more file
        # descriptors, say): its __del__ then calls close(), which reads these.
        self._now = 0.0
        self._wall_origin = time.time()
        self._schedule: random.Random | None = None
        self._saved_uuid = ids.new_uuid
        self._saved_random: object = None
        self.seed: int | None = None
        super().__init__()
        self.reseed(seed)

    def reseed(self, seed: int | None) -> None:
        """Draw the schedule (and ids and jitter) from `seed` from now on; None: FIFO, as asyncio."""
        self.seed = seed
        if seed is None:
            self._schedule = None
            return
        self._schedule = random.Random(seed)
        draws = random.Random(seed + 1)
        ids.new_uuid = lambda: uuid.UUID(int=draws.getrandbits(128), version=4)
        if self._saved_random is None:
            self._saved_random = random.getstate()
        random.seed(seed + 2)  # the retry backoff's jitter draws from the module's generator

    def time(self) -> float:
        return self._now

    def wall_time(self) -> float:
        """The wall clock on this loop (seconds since the epoch): the real time when the loop
        was made, plus the virtual time since. A manager's durable timers read it."""
        return self._wall_origin + self._now

    async def settle(self, turns: int = 1000) -> None:
        """Let what is ready run out, in FIFO order, for up to `turns` turns: what came
        before then does not share the next seed's draws."""
        schedule, self._schedule = self._schedule, None
        try:
            for _ in range(turns):
                if not self._ready:  # type: ignore[attr-defined]
                    return
                await asyncio.sleep(0)
        finally:
            self._schedule = schedule

    def _run_once(self) -> None:
        ready = self._ready  # type: ignore[attr-defined]
        deferred: list[Any] = []
        if self._schedule is not None and len(ready) > 1:
            # Shuffle what is ready, and hold some of it back a turn: as if those tasks
            # were slower this time. Every turn runs at least one callback.
            order = list(ready)
            self._schedule.shuffle(order)
            now = [cb for cb in order if self._schedule.random() >= DEFER] or order[:1]
            deferred = [cb for cb in order if not any(cb is n for n in now)]
            ready.clear()
            ready.extend(now)
        scheduled = self._scheduled  # type: ignore[attr-defined]
        if not ready and scheduled:
            # Nothing can run before the next timer: be there at once.
            self._now = max(self._now, scheduled[0].when())
        super()._run_once()  # type: ignore[misc]
        ready.extend(deferred)

    def close(self) -> None:
        ids.new_uuid = self._saved_uuid
        if self._saved_random is not None:
            random.setstate(self._saved_random)  # type: ignore[arg-type]
            self._saved_random = None
        super().close()


def derived_seed(seed: int, *about: object) -> int:
    """A seed drawn from `seed` and `about` (say, a crash point), the same in every process
    (unlike `hash()` of a string)."""
    return random.Random("/".join(map(str, (seed, *about)))).getrandbits(32)


def run_simulated(main: Coroutine[Any, Any, T], *, seed: int | None = None) -> T:
    """`asyncio.run(main)` on a `SimulatedLoop`: virtual time, and a seeded schedule if `seed`."""
    loop = SimulatedLoop(seed)
    try:
        asyncio.set_event_loop(loop)
        return loop.run_until_complete(main)
    finally:
        try:
            loop.run_until_complete(loop.shutdown_asyncgens())
        finally:
            asyncio.set_event_loop(None)
            loop.close()
