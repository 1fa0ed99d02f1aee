"""`SuspendableClock`: a lease clock whose machine a test can suspend."""

from __future__ import annotations

from procstore._runtime.lease_clock import LeaseClock


class SuspendableClock(LeaseClock):
    """The default lease clock, plus the suspends a test declares with `suspend(seconds)`.

    A suspend moves `now()` forward (the boot-time clock counts it) but not the monotonic
    clock, as a closed laptop lid or a paused VM does: `Lease(clock=SuspendableClock())`
    makes a holder that wakes from one, without suspending the machine running the test.
    """

    def __init__(self) -> None:
        self.total_suspended = 0.0
        """Seconds of suspend declared so far."""

    def suspend(self, seconds: float) -> None:
        """The machine was just suspended for `seconds` and has woken."""
        if seconds < 0:
            raise ValueError(f"a suspend lasts >= 0 seconds, got {seconds}")
        self.total_suspended += seconds

    def now(self) -> float:
        return super().now() + self.total_suspended

    def suspended(self) -> float:
        return super().suspended() + self.total_suspended
