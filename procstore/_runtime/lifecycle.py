"""How a manager's `start()` and `stop()` calls are ordered, whatever their callers do.

- Calls are serialised in the order they are made (two concurrent starts would recover
  everything twice), on one lock per event loop, so that a manager can serve two
  `asyncio.run`s one after the other.
- Each `stop()` call's shutdown is a task of its own, queued behind the calls made before
  it (stop, start, stop leaves the manager stopped), that a cancelled caller cannot
  interrupt half-way: runners left alive, the lease held. A procedure calling `stop()`
  from its own `execute()` is cancelled like every other runner, instead of waiting for
  itself.
- Writes that no term owns (a standby's cancel request) are tracked here, so that a
  shutdown cancels and waits for them too.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

from procstore._aio import LockPerLoop


class Lifecycle:
    def __init__(self) -> None:
        self.lock = LockPerLoop()
        """The lock that orders start() and stop() calls on the running loop."""
        self._stops: set[asyncio.Task[None]] = set()
        """Shutdowns under way: each stop() call's, queued on the lock."""
        self._outside_terms: dict[asyncio.Task[Any], None] = {}
        """Writes of no term, in the order begun: cancelled in that order (see `Term._tasks`)."""

    async def stop(self, shutdown: Callable[[], Awaitable[None]]) -> None:
        """Run `shutdown` under the lock in a task of its own; return once it has run."""

        async def locked() -> None:
            async with self.lock():
                await shutdown()

        stopping = asyncio.get_running_loop().create_task(locked(), name="procstore:stop")
        self._stops.add(stopping)
        stopping.add_done_callback(self._stops.discard)
        await asyncio.shield(stopping)

    def own(self, task: asyncio.Task[Any]) -> None:
        """Track a write that belongs to no term, for `cancel_outside_terms`."""
        self._outside_terms[task] = None
        task.add_done_callback(lambda done: self._outside_terms.pop(done, None))

    async def cancel_outside_terms(self) -> None:
        """Cancel the tracked writes and wait until each has stopped."""
        tasks = list(self._outside_terms)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
