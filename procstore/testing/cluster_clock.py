"""The wall and monotonic clocks of a cluster simulation: the loop's virtual time.

The runtime reads `time.time()` and `time.monotonic()` for deadlines the lease's clock
does not cover (the deletion a takeover postpones by `late_write_grace`, garbage
collection, the age of operator requests and keys). In a simulation both follow the
`SimulatedLoop`'s clock, so those deadlines pass in virtual time, and the wall clock can be
moved forward (an NTP step, a VM restored) without moving the monotonic one.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from contextlib import contextmanager


class VirtualClocks:
    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        # The real wall clock at virtual time 0: history records carry `datetime.now()`,
        # which cannot be replaced, and their retention is measured on `time.time()`.
        self.epoch = time.time()
        self.wall_offset = 0.0

    def monotonic(self) -> float:
        return self.loop.time()

    def wall(self) -> float:
        return self.epoch + self.wall_offset + self.loop.time()

    def move_wall_forward(self, seconds: float) -> None:
        self.wall_offset += seconds

    @contextmanager
    def installed(self) -> Iterator[VirtualClocks]:
        """Make `time.time()` and `time.monotonic()` read these clocks until the block ends."""
        saved = time.time, time.monotonic
        time.time, time.monotonic = self.wall, self.monotonic
        try:
            yield self
        finally:
            time.time, time.monotonic = saved
