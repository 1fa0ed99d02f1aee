"""Writing a procedure: `Procedure`, the `Status` its `execute` returns, and its `Context`."""

from __future__ import annotations

import abc
import contextlib
import enum
import math
from collections.abc import Awaitable, Callable, Mapping, Sequence
from contextlib import AbstractAsyncContextManager, AbstractContextManager
from dataclasses import dataclass, field
from datetime import datetime
from typing import ClassVar, Protocol, Self

import orjson

from procstore._text import storable
from procstore.errors import InvalidProcedureId
from procstore.flow import Concurrency, RateLimit
from procstore.ids import ProcedureId
from procstore.lock_key import NO_KEYS, LockKey, StringKey
from procstore.state import ProcedureState
from procstore.wake_time import clamped_wake_at


class Procedure(abc.ABC):
    """A multi-step operation whose state is persisted between steps.

    The manager calls `execute` until it returns `Status.done()`. After a crash the
    procedure is rebuilt with `load(data)` from the last persisted `dump()` and `execute`
    runs again from there, so every step must be safe to run twice.

    Subclasses set `type_name` (the loader's key, unique per manager) and, if they can
    undo their partial work, `rollback_supported = True` and `rollback()`.
    """

    type_name: ClassVar[str]
    rollback_supported: ClassVar[bool] = False
    rate_limit: ClassVar[RateLimit | None] = None
    """At most `RateLimit(starts, per)` first starts of this type in any `per` seconds, in
    each manager; the others wait, by `priority()`. None: no limit."""

    @abc.abstractmethod
    async def execute(self, ctx: Context) -> Status:
        """Run one step. Raise `RetryLater` for a transient failure; any other exception fails the procedure."""

    @abc.abstractmethod
    def dump(self) -> str:
        """The state to persist, stored as the message's `data`."""

    @classmethod
    def load(cls, data: str) -> Self:
        """Rebuild a procedure from `dump()`'s output. The default passes the parsed JSON to `cls(...)`."""
        return cls(orjson.loads(data))  # type: ignore[call-arg]

    def lock_key(self) -> LockKey:
        """The keys locked before the first `execute` and held until the procedure ends."""
        return NO_KEYS

    def concurrency(self) -> Concurrency | None:
        """`Concurrency(key, limit)`: at most `limit` procedures of this key run at once; the
        others wait, by `priority()`, before their first step. Computed from the procedure's
        state (as `lock_key()`), so every manager obeys it after a restart. None: no limit."""
        return None

    def priority(self) -> int:
        """Among procedures waiting for a concurrency slot or a rate limit, the higher starts
        first (ties: in the order they began to wait)."""
        return 0

    async def rollback(self, ctx: Context) -> None:  # noqa: B027 - optional hook
        """Undo partial work after a failure. Must be idempotent: it may run again after a restart."""


class StatusKind(enum.Enum):
    EXECUTING = "executing"
    SUSPENDED = "suspended"
    DONE = "done"
    WAITING = "waiting"
    """A durable wait: a timer (`Status.sleep`, `sleep_until`) or a signal (`wait_for_signal`)."""


@dataclass(frozen=True, slots=True)
class ProcedureWithId:
    """A procedure and the id it runs under."""

    id: ProcedureId
    procedure: Procedure

    def __post_init__(self) -> None:
        # Invariant: `id` is a ProcedureId, so its text is the canonical form used in keys.
        # The canonical text itself is accepted for convenience; any other text (upper case,
        # braces, a path) is refused here, before it can name a key outside the store or
        # one that recovery would not recognise.
        value: object = self.id
        if isinstance(value, ProcedureId):
            return
        parsed = ProcedureId.parse_canonical(value) if isinstance(value, str) else None
        if parsed is None:
            raise InvalidProcedureId(value)
        object.__setattr__(self, "id", parsed)

    @classmethod
    def new(cls, procedure: Procedure) -> ProcedureWithId:
        """`procedure` under a new random id."""
        return cls(ProcedureId.random(), procedure)


@dataclass(frozen=True, slots=True)
class Status:
    """What `execute` returns: more steps, wait for subprocedures, or done."""

    kind: StatusKind
    persist: bool = True
    subprocedures: tuple[ProcedureWithId, ...] = field(default=())
    output: object = None
    delay: float | None = None
    """A wait's length in seconds, from when the manager handles the status (`sleep`, a timeout)."""
    wake_at: float | None = None
    """A wait's end, in seconds since the epoch (`sleep_until`)."""
    signal: str | None = None
    """The signal name a wait ends on (`wait_for_signal`)."""

    @classmethod
    def executing(cls, persist: bool = True) -> Status:
        """More steps to run; persist the state first if `persist`."""
        return _EXECUTING_PERSIST if persist else _EXECUTING

    @classmethod
    def suspended(cls, subprocedures: Sequence[ProcedureWithId], persist: bool = True) -> Status:
        """Run `subprocedures`; `execute` is called again once all of them have ended."""
        return cls(StatusKind.SUSPENDED, persist, tuple(subprocedures))

    @classmethod
    def done(cls, output: object = None) -> Status:
        """Finished; `output` is what `Watcher.wait()` returns."""
        return cls(StatusKind.DONE, persist=False, output=output)

    @classmethod
    def sleep(cls, seconds: float, persist: bool = True) -> Status:
        """End the step, and call `execute` again once `seconds` have passed by the manager's
        clock. With `persist`, the state and the wake-up time are stored first, so the wait
        survives a restart or a takeover and counts from the stored time; the procedure holds
        no task meanwhile (its locks, if any, stay held). An operator's cancel or fail ends the
        wait at once. Raises `ValueError` for a negative or non-finite `seconds`."""
        return cls(StatusKind.WAITING, persist, delay=_seconds(seconds, "seconds"))

    @classmethod
    def sleep_until(cls, when: datetime | float, persist: bool = True) -> Status:
        """`sleep` until `when`: an aware `datetime`, or seconds since the epoch (an `int` or
        `float`). A time already past wakes at once; one after 9999-12-31T23:59:59Z is kept as
        that (it never comes either). Raises `ValueError` for a naive datetime (its time zone
        would be a guess) or a non-finite time, and `TypeError` for any other value."""
        if isinstance(when, datetime):
            if when.tzinfo is None or when.utcoffset() is None:
                raise ValueError(f"sleep_until needs an aware datetime (with a tzinfo), not {when!r}")
            epoch = when.timestamp()
        elif isinstance(when, int | float) and not isinstance(when, bool):
            epoch = float(when)
        else:
            raise TypeError(f"sleep_until takes an aware datetime or epoch seconds, not {when!r}")
        if not math.isfinite(epoch):
            raise ValueError(f"sleep_until takes a finite time, not {when!r}")
        return cls(StatusKind.WAITING, persist, wake_at=clamped_wake_at(epoch))

    @classmethod
    def wait_for_signal(cls, name: str, timeout: float | None = None) -> Status:
        """End the step (its state stored), and call `execute` again once a signal `name` is
        sent to this procedure (`ProcedureManager.signal`, `Client.signal`, `procstore
        signal`): that call sees its payload in `ctx.signals[name]`. After `timeout` seconds
        without one, `execute` is called with `ctx.signals` empty. A signal sent before the
        wait began is delivered at once; several, one per wait, in the order sent."""
        if not isinstance(name, str) or not name:
            raise TypeError(f"a signal's name is non-empty text, not {name!r}")
        storable(name, "a signal's name")  # no signal can have it: the wait could never end
        delay = None if timeout is None else _seconds(timeout, "timeout")
        return cls(StatusKind.WAITING, True, delay=delay, signal=name)

    @property
    def need_persist(self) -> bool:
        return self.persist and self.kind is not StatusKind.DONE

    def is_executing(self) -> bool:
        return self.kind is StatusKind.EXECUTING

    def is_suspended(self) -> bool:
        return self.kind is StatusKind.SUSPENDED

    def is_done(self) -> bool:
        return self.kind is StatusKind.DONE

    def is_waiting(self) -> bool:
        return self.kind is StatusKind.WAITING


def _seconds(value: float, what: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise TypeError(f"{what} is a number of seconds, not {value!r}")
    if not math.isfinite(value) or value < 0:
        raise ValueError(f"{what} must be finite and not negative, not {value!r}")
    return float(value)


_EXECUTING_PERSIST = Status(StatusKind.EXECUTING, True)
_EXECUTING = Status(StatusKind.EXECUTING, False)


class ContextProvider(Protocol):
    """What a running procedure may ask of its manager."""

    def procedure_state(self, procedure_id: ProcedureId) -> ProcedureState | None:
        """The state of any procedure this manager knows (children included), else None."""
        ...

    async def wait_state_change(self, procedure_id: ProcedureId) -> ProcedureState | None:
        """Wait until the procedure's state changes and return the new one (None if unknown)."""
        ...

    def acquire_lock(self, key: StringKey) -> AbstractAsyncContextManager[None]:
        """Hold `key` for the body of an `async with` (a lock within one step)."""
        ...


@dataclass(frozen=True, slots=True)
class Context:
    """Passed to `execute` and `rollback`. A run's first attempts at its steps share one (it
    is immutable); a retry, or a step a signal woke, gets one of its own."""

    procedure_id: ProcedureId
    provider: ContextProvider
    is_retrying: bool = False
    """True when this call repeats a step that raised `RetryLater` (or hit a store error)."""
    fencing_token: int | None = None
    """The epoch of the lease under which this step runs; None for a manager without `lease=`.

    Each new leader's epoch is higher than every earlier one's. procstore fences its own
    writes; a side effect elsewhere is not fenced. Pass this token along with it to a system
    that remembers the highest token it has seen and refuses lower ones: a former leader's
    late write (after a pause, say) is then refused there too."""
    lease_check: Callable[[str], None] | None = field(default=None, repr=False, compare=False)
    """Raises `LeaseExpired` once the manager may no longer write; use `check_lease()`."""
    crash_hook: Callable[[str], Awaitable[None]] | None = field(default=None, repr=False, compare=False)
    """What `crash_point` calls (the manager's store); None outside a manager."""
    signals: Mapping[str, object] = field(default_factory=dict)
    """The signal this call was woken by, `{name: payload}` (read-only), after
    `Status.wait_for_signal`; empty otherwise (and after the wait's timeout). It is consumed with this step: once the
    state this call returns is stored (or the procedure ends) it is never delivered again; a
    crash before that delivers it again to the repeated step."""
    hold_interrupts: Callable[[], AbstractContextManager[None]] | None = field(default=None, repr=False, compare=False)
    """What `uninterruptible()` enters (the running step's); None outside a manager's step."""

    def uninterruptible(self) -> AbstractContextManager[None]:
        """`with ctx.uninterruptible(): ...`: an operator's cancel or fail does not cut this block.

        A request seen while a step runs interrupts it where it awaits (the await raises
        `CancelledError`; the procedure then fails as asked, rolling back if it can): a
        step blocked for an hour stops within `request_poll_interval`. Wrap what must not
        be left half done (two calls that go together); the interrupt then comes at the
        first await after the block, or, if the step ends first, before the next step.
        Nothing in `rollback()` is interrupted.
        """
        return self.hold_interrupts() if self.hold_interrupts is not None else contextlib.nullcontext()

    async def crash_point(self, name: str) -> None:
        """Mark a place inside this step where a test may kill the process.

        In production it does nothing (one await). Under test it is where a step that does
        several things outside the store (make a folder, write, rename) can be cut in the
        middle, which a crash at the store's writes never does: the crash explorer kills a
        run before and after each crash point, as around a store write, and
        `procstore.testing.crash_at(name)` arms one for a live manager in any test (as
        FoundationDB's BUGGIFY and HBase's kill points do). `name` says where, for reports:
        `await ctx.crash_point("after-mkdir")`.
        """
        if self.crash_hook is not None:
            await self.crash_hook(name)

    def check_lease(self) -> None:
        """Raise `LeaseExpired` unless this manager still holds its lease (no-op without one).

        Call it right before a side effect outside the store. Let the error propagate: the
        step is not failed, the manager stops leading, and the procedure resumes under the
        next leader from its last stored step. The check narrows the window in which a
        deposed leader acts but cannot close it (a process paused right after the check acts
        late anyway); `fencing_token` closes it where the other system checks tokens.
        """
        if self.lease_check is not None:
            self.lease_check(f"a side effect of procedure {self.procedure_id}")
