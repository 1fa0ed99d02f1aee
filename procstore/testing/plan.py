"""`FaultPlan`: which store operations fail, and how. Shared by `FaultyStore` (a
`StateStore` wrapper) and `FaultyFileSystem` (an fsspec wrapper, reachable by URL).

A `Fault` matches operations by kind and key pattern, and fires on the n-th match, on every
match, or a limited number of times:

- `transient`: raise a `StoreError` (procstore retries it, as it would a 503);
- `crash`: raise `SimulatedCrash`; from then on every operation raises it too;
- `tear`: for a write, store only the first half of the value (an empty one for short
  values), then crash, as a non-atomic write interrupted by a kill leaves it;
- `delay`: sleep `seconds` before the operation;
- `error`: raise `InjectedFailure`, which procstore does not retry: matched on the kind
  `attempt` (each attempt at a step, before `execute()`), it fails that step as if
  `execute()` had raised (the crash explorer's rollback mode).
"""

from __future__ import annotations

import asyncio
import fnmatch
import re
from dataclasses import dataclass, field
from typing import Literal

from procstore._runtime.outcome import ProcessKill
from procstore.errors import StoreError
from procstore.store.wrapping import CRASH_POINT, MUTATING_KINDS

Action = Literal["transient", "crash", "tear", "delay", "error"]
When = Literal["before", "after"]

COUNTED = MUTATING_KINDS | {CRASH_POINT}
"""What a `FaultPlan` numbers (and a crash explorer kills around): the operations that
change the store, and the crash points procedures declare (`Context.crash_point`)."""


class SimulatedCrash(ProcessKill):
    """The process "died" at a store operation. Not an `Exception`, so nothing handles it."""


class InjectedFailure(Exception):
    """A failure a `Fault("error")` injects: not a store error, so no retry absorbs it."""


_PROBE = re.compile(r"probe-[0-9a-f]{32}")

ATTEMPT = "attempt"
"""The kind a `FaultPlan` gives each attempt at a step (not counted: see `attempts`)."""
ATTEMPT_MARK = "#attempt"
"""The crash-point name the runner passes before each attempt, read back as an `attempt`."""


@dataclass(frozen=True, slots=True)
class StoreOp:
    """One operation the store saw: its position among counted operations, kind and key."""

    index: int
    kind: str
    key: str


@dataclass
class Fault:
    """One rule of a `FaultPlan`."""

    action: Action
    kinds: frozenset[str] = COUNTED
    key: str = "*"
    """An `fnmatch` pattern on the key."""
    nth: int | None = None
    """Fire on the n-th matching operation only (0-based); None: on every match."""
    when: When = "before"
    times: int | None = None
    """Fire at most this many times (None: no limit)."""
    seconds: float = 0.0
    """For `delay`."""
    matched: int = 0
    fired: int = 0

    def matches(self, kind: str, key: str) -> bool:
        return kind in self.kinds and fnmatch.fnmatchcase(key, self.key)

    def should_fire(self) -> bool:
        """Counts a match; True if this one fires."""
        index = self.matched
        self.matched += 1
        if self.nth is not None and index != self.nth:
            return False
        if self.times is not None and self.fired >= self.times:
            return False
        self.fired += 1
        return True


@dataclass
class FaultPlan:
    """Faults to inject, and a record of every counted operation."""

    faults: list[Fault] = field(default_factory=list)
    ops: list[StoreOp] = field(default_factory=list)
    completed: set[int] = field(default_factory=set)
    interrupted: set[int] = field(default_factory=set)
    crashed: asyncio.Event = field(default_factory=asyncio.Event)
    crash_before_new: set[tuple[str, str]] | None = None
    """If set: crash before any counted operation not in it (then add it)."""
    attempts: list[int] = field(default_factory=list)
    """For each attempt at a step, in order: how many operations were counted before it."""
    attempt_keys: list[str] = field(default_factory=list)
    """For each attempt at a step, in order: its key, `{procedure id}/{step}/#attempt`."""

    def crash(self, message: str) -> SimulatedCrash:
        self.crashed.set()
        return SimulatedCrash(message)

    def begin(self, kind: str, key: str) -> tuple[StoreOp | None, list[Fault]]:
        """Before an operation: raise for a crash or a transient fault; return the faults
        to apply after it (and the recorded op, for counted kinds)."""
        if self.crashed.is_set():
            raise SimulatedCrash(f"the store is gone: crashed earlier ({kind} {key})")
        op = None
        if kind == ATTEMPT:
            self.attempts.append(len(self.ops))
            self.attempt_keys.append(key)
        elif kind in COUNTED:
            op = StoreOp(len(self.ops), kind, key)
            self.ops.append(op)
            seen = (kind, _PROBE.sub("probe-*", key))  # a lease's support probe: a new key at each start
            if self.crash_before_new is not None and seen not in self.crash_before_new:
                self.crash_before_new.add(seen)
                raise self.crash(f"crash before operation {op.index}: {kind} {key}")
        later: list[Fault] = []
        # Every matching fault counts the operation, even when one before it raises, so
        # that `nth` means the n-th matching operation whatever the other faults do.
        firing = [f for f in self.faults if f.matches(kind, key) and f.should_fire()]
        for fault in firing:
            if fault.when == "after" or fault.action in ("delay", "tear"):
                later.append(fault)
            elif fault.action == "crash":
                raise self.crash(f"crash before {kind} {key}")
            elif fault.action == "error":
                raise InjectedFailure(f"failure injected at {kind} {key}")
            else:
                raise StoreError(f"injected transient failure of {kind} {key}", key=key)
        return op, later

    def end(self, op: StoreOp | None, faults: list[Fault], kind: str, key: str) -> None:
        """After an operation succeeded."""
        if op is not None:
            self.completed.add(op.index)
        for fault in faults:
            if fault.when != "after" or fault.action in ("delay", "tear"):
                continue
            if fault.action == "crash":
                raise self.crash(f"crash after {kind} {key}")
            raise StoreError(f"injected transient failure after {kind} {key} (it landed)", key=key)

    def landed(self) -> list[StoreOp]:
        return [op for op in self.ops if op.index in self.completed]

    def maybe_landed(self) -> list[StoreOp]:
        return [op for op in self.ops if op.index in self.interrupted]


def torn(value: bytes) -> bytes:
    """What a write interrupted half way leaves."""
    return value[: len(value) // 2]


def crash_at(name: str, *, nth: int = 0, when: When = "before") -> Fault:
    """A fault that kills the process at the crash point `name` (`Context.crash_point`),
    the `nth` time any procedure reaches it: put it in a `FaultyStore`'s faults and give
    that store to a live manager, in any test."""
    return Fault("crash", kinds=frozenset({CRASH_POINT}), key=f"*/{name}", nth=nth, when=when)
