"""`Duration`: a `timedelta` stored as humantime text ("10s", "1m 30s", "250ms").

GreptimeDB stores durations with `humantime_serde`; this is the same text form, so a
persistent context with `timeout: Duration` round-trips byte for byte.
"""

from __future__ import annotations

import re
from datetime import timedelta

_UNITS_NS = {
    "ns": 1,
    "nsec": 1,
    "us": 1_000,
    "usec": 1_000,
    "ms": 1_000_000,
    "msec": 1_000_000,
    "s": 1_000_000_000,
    "sec": 1_000_000_000,
    "secs": 1_000_000_000,
    "second": 1_000_000_000,
    "seconds": 1_000_000_000,
    "m": 60_000_000_000,
    "min": 60_000_000_000,
    "mins": 60_000_000_000,
    "minute": 60_000_000_000,
    "minutes": 60_000_000_000,
    "h": 3_600_000_000_000,
    "hr": 3_600_000_000_000,
    "hour": 3_600_000_000_000,
    "hours": 3_600_000_000_000,
    "d": 86_400_000_000_000,
    "day": 86_400_000_000_000,
    "days": 86_400_000_000_000,
}
_FORMAT_UNITS = (("d", 86_400_000_000_000), ("h", 3_600_000_000_000), ("m", 60_000_000_000), ("s", 1_000_000_000),
                 ("ms", 1_000_000), ("us", 1_000), ("ns", 1))  # fmt: skip
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
        for name, size in _FORMAT_UNITS:
            count, total_ns = divmod(total_ns, size)
            if count:
                parts.append(f"{count}{name}")
        return " ".join(parts)

    def __str__(self) -> str:
        return self.format()

    def __repr__(self) -> str:
        return f"Duration({self.format()!r})"
