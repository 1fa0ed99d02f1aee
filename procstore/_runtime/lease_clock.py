"""`LeaseClock`: the lease's clock, which keeps counting while the machine is suspended.

A lease is a promise about real elapsed time: the standbys, on other machines, keep
counting while this one is suspended (a VM paused or live-migrated, a laptop's lid
closed). `time.monotonic()` stops then, so a holder counting on it would wake believing in
a lease that ran out long ago. Linux's `CLOCK_BOOTTIME` counts suspend; where it is
missing, the clock falls back to `time.monotonic()` (and cannot tell a suspend).

The gap between the two clocks grows only while the machine is suspended: a holder that
sees it grow since its last renewal treats the lease as lapsed, however short the suspend
(a write it had under way may have been delayed by it).

On a loop with virtual time (`procstore.testing.SimulatedLoop`) both read that loop's
clock, so that TTLs pass in no real time.
"""

from __future__ import annotations

import asyncio
import time

_BOOTTIME = getattr(time, "CLOCK_BOOTTIME", None)

SUSPEND_TOLERANCE = 0.1
"""Seconds the gap between the clocks may grow without being a suspend: two reads of the
pair are not one instant (the process can be preempted between them)."""
_PRECISE = 0.005
"""A read of the pair whose monotonic reads are further apart than this is taken again."""
_TRIES = 3


class LeaseClock:
    """The default lease clock; subclass it to inject another (`Lease(clock=...)`, tests).

    `now()` is elapsed seconds that count suspend; `suspended()` is the seconds the machine
    has spent suspended since some fixed moment (only its growth matters).
    """

    def now(self) -> float:
        loop = _virtual_loop()
        if loop is not None:
            return loop.time()
        return time.clock_gettime(_BOOTTIME) if _BOOTTIME is not None else time.monotonic()

    def suspended(self) -> float:
        if _BOOTTIME is None or _virtual_loop() is not None:
            return 0.0
        # Monotonic reads on both sides of the boot-time read: their midpoint is within half
        # their distance of the same instant. A preempted read (a loaded machine) is taken
        # again, so that a slow read is never mistaken for a suspend.
        for _ in range(_TRIES):
            before = time.monotonic()
            boot = time.clock_gettime(_BOOTTIME)
            after = time.monotonic()
            if after - before < _PRECISE:
                break
        return boot - (before + after) / 2


def _virtual_loop() -> asyncio.AbstractEventLoop | None:
    try:
        loop = asyncio.get_running_loop()
    except RuntimeError:  # a send guard called from a client's thread
        return None
    return loop if getattr(loop, "virtual_time", False) else None
