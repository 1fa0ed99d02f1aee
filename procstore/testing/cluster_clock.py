"""The wall and monotonic clocks of a cluster simulation: the loop's virtual time.

The runtime reads `time.time()` and `time.monotonic()` for deadlines the lease's clock
does not cover (the deletion a takeover postpones by `late_write_grace`, garbage
collection, the age of operator requests and keys), and `datetime.now()` for the times
history records carry (and are named by); durable timers read the loop's `wall_time()`, and
a signal's key carries `time.time_ns()`. In a simulation all of them follow the
`SimulatedLoop`'s clock, so those deadlines pass in virtual time and two records written
a virtual minute apart carry times a minute apart; the wall clock can be moved forward (an
NTP step, a VM restored) without moving the monotonic one, and sleepers whose wake-up time
it passes are due at once.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from datetime import datetime, tzinfo
from types import ModuleType
from typing import Any, TypeVar

from procstore._cli import maintenance
from procstore._runtime import meta, runner
from procstore.store import restart, signals

T = TypeVar("T")

DATETIME_READERS: tuple[ModuleType, ...] = (meta, runner, restart, maintenance)
"""The runtime's modules that call `datetime.now()` (each through its own name `datetime`)."""


class VirtualClocks:
    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        # The real wall clock at virtual time 0, in whole seconds: history records carry
        # `datetime.now()`, and their retention is measured on `time.time()`. Whole, so
        # that times rounded to milliseconds (a request's, an end's) tie or differ alike at
        # every replay of a seed.
        self.epoch = float(int(time.time()))
        self.wall_offset = 0.0

    def monotonic(self) -> float:
        return self.loop.time()

    def wall(self) -> float:
        return self.epoch + self.wall_offset + self.loop.time()

    def wall_ns(self) -> int:
        return int(self.wall() * 1e9)

    def move_wall_forward(self, seconds: float) -> None:
        self.wall_offset += seconds

    @contextmanager
    def installed(self) -> Iterator[VirtualClocks]:
        """Make `time.time()`, `time.monotonic()` and the runtime's `datetime.now()` read
        these clocks until the block ends."""
        saved = time.time, time.monotonic, time.time_ns
        time.time, time.monotonic, time.time_ns = self.wall, self.monotonic, self.wall_ns
        clocks = self

        class VirtualDatetime(datetime):
            @classmethod
            def now(cls, tz: tzinfo | None = None) -> Any:
                return datetime.fromtimestamp(clocks.wall(), tz)

        try:
            with ExitStack() as undo:
                # The durable timers' clock (`waits.wall_clock`) is the wall clock too.
                self.loop.wall_time = self.wall  # type: ignore[attr-defined]
                undo.callback(delattr, self.loop, "wall_time")
                # A signal's key is later than the last one this process sent (a run before
                # this one, whose clock was moved hours ahead, say): each run starts afresh.
                undo.callback(setattr, signals, "_last_sent_ns", signals._last_sent_ns)
                signals._last_sent_ns = 0
                for module in DATETIME_READERS:
                    undo.callback(setattr, module, "datetime", module.datetime)
                    module.datetime = VirtualDatetime  # type: ignore[attr-defined]
                # Work the views hand to a thread (the inventory's) runs inline: a real
                # thread's timing would decide the schedule, and a seed must replay.
                undo.callback(setattr, asyncio, "to_thread", asyncio.to_thread)
                asyncio.to_thread = _inline
                yield self
        finally:
            time.time, time.monotonic, time.time_ns = saved


async def _inline(function: Callable[..., T], /, *args: Any, **kwargs: Any) -> T:
    """`asyncio.to_thread`, run in the caller's task (see `VirtualClocks.installed`)."""
    return function(*args, **kwargs)
