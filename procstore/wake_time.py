"""The wake-up times of durable timers: epoch seconds within what a calendar date can show.

`datetime` holds the years 1 to 9999, and every reader of a stored `wake_at` (`ls`, `show`,
`ProcedureInfo.waiting`, the web view) shows it as a date. A time before 1970 wakes at once
as 1970 does, and one after 9999 never comes, as 9999's end never does: kept within that
span, the timer means the same and no reader fails on it. A store is written by others, so
a value read back is kept within it too.
"""

from __future__ import annotations

from datetime import UTC, datetime

LATEST_WAKE_AT = datetime(9999, 12, 31, 23, 59, 59, tzinfo=UTC).timestamp()
"""The latest wake-up time kept: 9999-12-31T23:59:59Z."""


def clamped_wake_at(epoch: float) -> float:
    """`epoch` kept between 1970 (the epoch: 0.0, for any earlier time, or NaN) and `LATEST_WAKE_AT`."""
    if not epoch > 0.0:
        return 0.0
    return min(epoch, LATEST_WAKE_AT)


def wake_at_text(epoch: float) -> str:
    """The wake-up time as ISO 8601 in UTC, to the second; never fails."""
    return datetime.fromtimestamp(clamped_wake_at(epoch), UTC).isoformat(timespec="seconds")


def calendar_time(epoch: float) -> datetime | None:
    """`epoch` as an aware `datetime` in UTC; None for a time the calendar does not hold
    (before year 1 or after 9999): a stored time (an operator request's, a file's modified
    time on a filesystem of 64-bit times) is anyone's to write, and never fails a reader."""
    try:
        return datetime.fromtimestamp(epoch, UTC)
    except (ValueError, OverflowError, OSError):
        return None
