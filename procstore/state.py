"""What a procedure is doing now: `ProcedureState`, and `ProcedureInfo` for listings."""

from __future__ import annotations

import dataclasses
import enum
import warnings
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from procstore.ids import ProcedureId
    from procstore.lock_key import StringKey


class ProcedureStateKind(enum.StrEnum):
    """The phases of a procedure's life. `DONE`, `FAILED` and `POISONED` are final."""

    RUNNING = "RUNNING"
    RETRYING = "RETRYING"
    PREPARE_ROLLBACK = "PREPARE_ROLLBACK"
    ROLLING_BACK = "ROLLING_BACK"
    DONE = "DONE"
    FAILED = "FAILED"
    POISONED = "POISONED"


_FINAL = frozenset({ProcedureStateKind.DONE, ProcedureStateKind.FAILED, ProcedureStateKind.POISONED})


class Predicate:
    """The answer of an `is_*` predicate, usable called or not.

    `state.is_running()` is the contract's form (as in GreptimeDB); `if state.is_running:`
    reads the same way and means the same, instead of a bound method that is always true.
    (`ProcedureManager.is_running` and `is_leader` are plain `bool` properties.)
    """

    __slots__ = ("_value",)

    _value: bool

    def __init__(self, value: bool) -> None:
        # Immutable: the two answers are shared by every state (`_ANSWERS`).
        if hasattr(self, "_value"):
            raise AttributeError("a Predicate is immutable")
        object.__setattr__(self, "_value", value)

    def __setattr__(self, name: str, value: object) -> None:
        raise AttributeError("a Predicate is immutable")

    def __reduce__(self) -> tuple[type[Predicate], tuple[bool]]:
        return Predicate, (self._value,)  # copied and pickled through `__init__`

    def __call__(self) -> bool:
        return self._value

    def __bool__(self) -> bool:
        return self._value

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Predicate | bool):
            return self._value == bool(other)
        return NotImplemented

    def __hash__(self) -> int:
        return hash(self._value)

    def __repr__(self) -> str:
        return repr(self._value)


_ANSWERS = (Predicate(False), Predicate(True))
"""The two answers, shared: a `Predicate` never changes, and states are asked often."""


class _KindAliases(type):
    """`ProcedureState.DONE` and the like: the kinds, once spelled on the state class.

    One name per concept is `ProcedureStateKind.DONE`; the old spelling keeps working for
    code written against it, with a `DeprecationWarning`.
    """

    def __getattr__(cls, name: str) -> ProcedureStateKind:
        kind = ProcedureStateKind.__members__.get(name)
        if kind is None:
            raise AttributeError(f"type object {cls.__name__!r} has no attribute {name!r}")
        warnings.warn(
            f"ProcedureState.{name} is deprecated: use ProcedureStateKind.{name}", DeprecationWarning, stacklevel=2
        )
        return kind


@dataclass(frozen=True, slots=True)
class ProcedureState(metaclass=_KindAliases):
    """A procedure's state: its `kind`, and `error`/`output` where they apply.

    `error` is text, which is all that survives a restart; `cause` is the exception object
    when the failure happened in this process. `traceback` is set for failures whose
    exception came from inside the procedure's code.
    """

    kind: ProcedureStateKind
    error: str | None = None
    output: object = None
    cause: BaseException | None = None
    traceback: str | None = None
    recorded: bool = True
    """False for an end (FAILED) this process could not write to the store: the store still
    holds an earlier step, and the next start resumes the procedure (`EndNotRecorded`)."""

    @classmethod
    def running(cls) -> ProcedureState:
        return _RUNNING

    @classmethod
    def done(cls, output: object = None) -> ProcedureState:
        return cls(ProcedureStateKind.DONE, output=output)

    @classmethod
    def with_error(
        cls,
        kind: ProcedureStateKind,
        error: str,
        cause: BaseException | None = None,
        traceback: str | None = None,
    ) -> ProcedureState:
        return cls(kind, error=error, cause=cause, traceback=traceback)

    @classmethod
    def failed(cls, error: str) -> ProcedureState:
        """FAILED with `error`, and no exception object (a failure read back from the store)."""
        return cls(ProcedureStateKind.FAILED, error=error)

    @classmethod
    def unrecorded_end(cls, error: str, state: ProcedureState | None = None) -> ProcedureState:
        """FAILED in memory, `recorded` false: nothing in the store says the procedure ended.
        The exception and traceback are `state`'s, if given."""
        cause, tb = (None, None) if state is None else (state.cause, state.traceback)
        return cls(ProcedureStateKind.FAILED, error=error, cause=cause, traceback=tb, recorded=False)

    def with_kind(self, kind: ProcedureStateKind) -> ProcedureState:
        """This state as `kind`, its error and exception kept."""
        return dataclasses.replace(self, kind=kind)

    def with_error_text(self, error: str) -> ProcedureState:
        """This state with `error` instead of its error text."""
        return dataclasses.replace(self, error=error)

    def not_recorded(self, step: int) -> ProcedureState:
        """This failure, as the end of a run whose failure could not be written (as `step`):
        `Watcher.wait()` raises `EndNotRecorded`, never `ProcedureFailed`, since the store
        says it has not ended."""
        error = (
            f"{self.error}; the failure could not be written to the store (as step {step}), so "
            "the procedure resumes from its last stored step at the next start"
        )
        return ProcedureState.unrecorded_end(error, self)

    @property
    def is_running(self) -> Predicate:
        """RUNNING or RETRYING."""
        return _ANSWERS[self.kind in (ProcedureStateKind.RUNNING, ProcedureStateKind.RETRYING)]

    @property
    def is_retrying(self) -> Predicate:
        return _ANSWERS[self.kind is ProcedureStateKind.RETRYING]

    @property
    def is_done(self) -> Predicate:
        return _ANSWERS[self.kind is ProcedureStateKind.DONE]

    @property
    def is_failed(self) -> Predicate:
        return _ANSWERS[self.kind is ProcedureStateKind.FAILED]

    @property
    def is_poisoned(self) -> Predicate:
        return _ANSWERS[self.kind is ProcedureStateKind.POISONED]

    @property
    def is_prepare_rollback(self) -> Predicate:
        return _ANSWERS[self.kind is ProcedureStateKind.PREPARE_ROLLBACK]

    @property
    def is_rolling_back(self) -> Predicate:
        return _ANSWERS[self.kind is ProcedureStateKind.ROLLING_BACK]

    @property
    def is_ended(self) -> Predicate:
        """DONE, FAILED or POISONED: nothing more will happen to the procedure here."""
        return _ANSWERS[self.kind in _FINAL]


_RUNNING = ProcedureState(ProcedureStateKind.RUNNING)


@dataclass(frozen=True, slots=True)
class ProcedureInfo:
    """One row of `ProcedureManager.list_procedures()`."""

    id: ProcedureId
    type_name: str
    state: ProcedureState
    start_time: datetime | None
    """When it started running here (after taking its locks); None while it waits for them."""
    end_time: datetime | None
    lock_keys: list[StringKey]
    parent_id: ProcedureId | None
    waiting: str | None = None
    """Why it waits, while it does: for a concurrency slot or a rate limit (before its first
    step), until a durable timer's time, or for a signal. None while it runs or has ended."""
