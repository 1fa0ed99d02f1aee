"""Flow control a procedure declares: `Concurrency` (at most N running per key) and
`RateLimit` (at most N starts of a type per period). See `Procedure.concurrency`,
`Procedure.rate_limit` and `Procedure.priority`."""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Concurrency:
    """At most `limit` procedures with this `key` run at once (`Procedure.concurrency()`).

    Not a lock: the procedures sharing a key run side by side up to the limit, and a
    procedure's lock keys keep their meaning beside it. Raises `TypeError` or `ValueError`
    for a key that is not non-empty text or a limit that is not a positive `int`."""

    key: str
    limit: int

    def __post_init__(self) -> None:
        if not isinstance(self.key, str) or not self.key:
            raise TypeError(f"a concurrency key is non-empty text, not {self.key!r}")
        if isinstance(self.limit, bool) or not isinstance(self.limit, int):
            raise TypeError(f"a concurrency limit is an int, not {self.limit!r}")
        if self.limit < 1:
            raise ValueError(f"a concurrency limit is at least 1, not {self.limit}")


@dataclass(frozen=True, slots=True)
class RateLimit:
    """At most `starts` first starts of a procedure type in any `per` seconds
    (`Procedure.rate_limit`, a class attribute). Raises `ValueError` for a count below 1 or
    a period that is not a positive finite number."""

    starts: int
    per: float

    def __post_init__(self) -> None:
        if isinstance(self.starts, bool) or not isinstance(self.starts, int) or self.starts < 1:
            raise ValueError(f"a rate limit allows at least 1 start, not {self.starts!r}")
        if isinstance(self.per, bool) or not isinstance(self.per, int | float):
            raise ValueError(f"a rate limit's period is a number of seconds, not {self.per!r}")
        if not math.isfinite(self.per) or self.per <= 0:
            raise ValueError(f"a rate limit's period is positive and finite, not {self.per!r}")
