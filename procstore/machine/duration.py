"""`Duration`: a `timedelta` stored as humantime text ("10s", "1m 30s", "250ms").

GreptimeDB stores durations with `humantime_serde`; this is the same text form, so a
persistent context with `timeout: Duration` round-trips byte for byte.
"""

from __future__ import annotations

import re
from datetime import timedelta

_UNITS = (
    (86_400_000_000_000, ("d", "day", "days")),
    (3_600_000_000_000, ("h", "hr", "hour", "hours")),
    (60_000_000_000, ("m", "min", "mins", "minute", "minutes")),
    (1_000_000_000, ("s", "sec", "secs", "second", "seconds")),
    (1_000_000, ("ms", "msec")),
    (1_000, ("us", "usec")),
    (1, ("ns", "nsec")),
)
"""Each unit's nanoseconds and the names it is read by, the largest first; `format` writes the first name."""
_UNITS_NS = {name: size for size, names in _UNITS for name in names}
_PART = re.compile(r"\s*(\d+)\s*([a-z]+)")


class Duration(timedelta):
    """A non-negative `timedelta` whose stored form is humantime text."""

    @classmethod
    def parse(cls, text: str) -> Duration:
        """Parse "10s", "1h 30m", "250ms"...; raises `ValueError` saying what is wrong."""
        if not isinstance(text, str) or not text.strip():
            raise ValueError(f"expected a duration such as '10s' or '1m 30s', got {text!r}")
        total_ns = 0
        pos = 0
        for match in _PART.finditer(text):
            if match.start() != pos:
                break
            unit = _UNITS_NS.get(match.group(2))
            if unit is None:
                raise ValueError(f"unknown unit {match.group(2)!r} in duration {text!r}")
            total_ns += int(match.group(1)) * unit
            pos = match.end()
        if pos != len(text.rstrip()) or pos == 0:
            raise ValueError(f"expected a duration such as '10s' or '1m 30s', got {text!r}")
        return cls(microseconds=total_ns / 1_000)

    @classmethod
    def of(cls, value: timedelta) -> Duration:
        return value if isinstance(value, Duration) else cls(seconds=value.total_seconds())

    def format(self) -> str:
        """The humantime text: the largest units first, zero parts left out ("0s" for zero)."""
        total_ns = (self.days * 86_400 + self.seconds) * 1_000_000_000 + self.microseconds * 1_000
        if total_ns == 0:
            return "0s"
        parts = []
        for size, (name, *_) in _UNITS:
            count, total_ns = divmod(total_ns, size)
            if count:
                parts.append(f"{count}{name}")
        return " ".join(parts)

    def __str__(self) -> str:
        return self.format()

    def __repr__(self) -> str:
        return f"Duration({self.format()!r})"
