"""What a runner makes of outcomes: failure states and their texts, the record a parent
computes for each child, and the guard that tells a stray `CancelledError` from a stop."""

from __future__ import annotations

import asyncio
import dataclasses
import traceback
from collections.abc import Sequence
from dataclasses import dataclass
from types import TracebackType
from typing import TypeVar

from procstore._runtime.meta import ProcedureMeta
from procstore._text import valid_unicode
from procstore.errors import LockConflict, ProcedureError, describe
from procstore.ids import ProcedureId
from procstore.lock_key import LockKey
from procstore.procedure import Procedure, ProcedureWithId
from procstore.state import ProcedureState, ProcedureStateKind
from procstore.store.requests import OperatorRequested

T = TypeVar("T")


def type_name_of(procedure: Procedure) -> str:
    name = getattr(procedure, "type_name", None)
    if not isinstance(name, str) or not name:
        raise TypeError(
            f"{type(procedure).__qualname__} has no `type_name`: set the class attribute "
            '`type_name = "app::Name"` (the key its loader is registered under)'
        )
    return name


def dumped(procedure: Procedure) -> str:
    """`procedure.dump()`, checked: the stored message's `data` is text, and any other value
    (a dict, bytes, None) would be stored as something no reader can load again; so would
    text that is not valid Unicode (a lone surrogate), which no store can even write."""
    data = procedure.dump()
    if not isinstance(data, str):
        raise TypeError(
            f"{type(procedure).__qualname__}.dump() returned {type(data).__name__} {_short(data)}, not a str: "
            "return the state as text (json.dumps(...), say); load() receives that same text"
        )
    if not data.isascii():  # the common case costs one scan, not an encoding
        try:
            data.encode()
        except UnicodeEncodeError as e:
            raise ValueError(
                f"{type(procedure).__qualname__}.dump() returned text that is not valid Unicode ({e.reason} at "
                f"index {e.start}): it cannot be stored"
            ) from None
    return data


def checked_lock_key(procedure: Procedure) -> LockKey:
    """`procedure.lock_key()`, checked before anything is written: any other value would
    fail the procedure only once stored, with an error far from its cause."""
    lock_key = procedure.lock_key()
    if not isinstance(lock_key, LockKey):
        raise TypeError(
            f"{type(procedure).__qualname__}.lock_key() returned {type(lock_key).__name__} {_short(lock_key)}, "
            'not a LockKey: return LockKey([StringKey.exclusive("table/42"), ...]), or LockKey() for none'
        )
    return lock_key


def _short(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 80 else f"{text[:77]}..."


@dataclass(frozen=True, slots=True)
class Child:
    """What a parent computes for a subprocedure before it is written."""

    type_name: str
    data: str
    lock_key: LockKey

    @classmethod
    def of(cls, sub: ProcedureWithId) -> Child:
        return cls(type_name_of(sub.procedure), dumped(sub.procedure), checked_lock_key(sub.procedure))


def lock_conflict(
    holders: Sequence[ProcedureMeta], subprocedures: Sequence[ProcedureWithId], children: dict[ProcedureId, Child]
) -> LockConflict | None:
    """The first child whose locks conflict with those of `holders` (a parent and its
    ancestors, which hold theirs while the child runs: waiting would deadlock)."""
    for sub in subprocedures:
        child_keys = children[sub.id].lock_key
        for holder in holders:
            keys = holder.lock_key.conflicts_with(child_keys)
            if keys:
                return LockConflict(holder.id, sub.id, keys)
    return None


class ProcessKill(BaseException):
    """Ends a runner as a kill -9 ends its process: the task is simply gone, nothing more is
    written (the testing toolkit's simulated crashes derive from it)."""


PROCESS_EXITS = (KeyboardInterrupt, SystemExit, ProcessKill)
"""What user code may raise to end the process, not its procedure."""


class StrayCancellation(ProcedureError):
    """User code raised `CancelledError` although nothing cancelled its procedure."""


class EscapedBaseException(ProcedureError):
    """User code raised a `BaseException` that is neither a stop nor a process exit."""


def is_stop(exc: BaseException) -> bool:
    """Whether `exc` ends this task as a stop, a cancel or a process exit would, rather
    than failing its procedure: a `CancelledError` counts only while the task is being
    cancelled (user code that cancelled and awaited its own helper raises a stray one)."""
    if isinstance(exc, asyncio.CancelledError):
        task = asyncio.current_task()
        return task is not None and task.cancelling() > 0
    return isinstance(exc, PROCESS_EXITS)


def as_failure(exc: BaseException, what: str) -> Exception:
    """The failure to record for `exc`, which escaped user code and `is_stop` refused."""
    if isinstance(exc, Exception):
        return exc
    if isinstance(exc, asyncio.CancelledError):
        return StrayCancellation(f"{what} raised CancelledError, but nothing cancelled the procedure")
    return EscapedBaseException(f"{what} raised {type(exc).__name__}: {exc}")


class NotCancelledByItself:
    """`with IN_EXECUTE: await ...`: a `BaseException` the block raises that is not a stop (a
    stray `CancelledError`, a `GeneratorExit`, a user's own subclass) is that code's failure:
    taken for a stop, it would leave the procedure RUNNING and its watchers waiting forever.

    A context manager, one for all, not a coroutine around the call: a procedure waiting in
    its step would hold that coroutine for as long as it waits."""

    __slots__ = ("what",)

    def __init__(self, what: str) -> None:
        self.what = what

    def __enter__(self) -> None:
        pass

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        if exc is not None and not isinstance(exc, Exception) and not is_stop(exc):
            raise as_failure(exc, self.what) from exc


IN_EXECUTE = NotCancelledByItself("execute()")
IN_ROLLBACK = NotCancelledByItself("rollback()")


def format_tb(exc: BaseException) -> str:
    return "".join(traceback.format_exception(exc))


def failed_state(exc: BaseException, *, gave_up_after: int | None = None, prefix: str = "") -> ProcedureState:
    # An operator's request says itself what happened; its class name would only be noise.
    # Stored in the `.rollback` and the history record: text that cannot be encoded (a
    # lone surrogate from an undecodable file name, say) would make the failure unstorable.
    error = valid_unicode(prefix + (str(exc) if isinstance(exc, OperatorRequested) else describe(exc)))
    if gave_up_after is not None:
        error = f"gave up after {gave_up_after} retries: {error}"
    return ProcedureState.with_error(ProcedureStateKind.FAILED, error, exc, format_tb(exc))


def rolled_back(error: str) -> ProcedureState:
    return ProcedureState.with_error(ProcedureStateKind.FAILED, error)


def with_error(state: ProcedureState, error: str) -> ProcedureState:
    return dataclasses.replace(state, error=error)


def with_kind(state: ProcedureState, kind: ProcedureStateKind) -> ProcedureState:
    return dataclasses.replace(state, kind=kind)


def not_recorded(state: ProcedureState, step: int) -> ProcedureState:
    """The end of a run whose failure could not be written: `Watcher.wait()` raises
    `EndNotRecorded`, never `ProcedureFailed`, since the store says it has not ended."""
    error = (
        f"{state.error}; the failure could not be written to the store (as step {step}), so "
        "the procedure resumes from its last stored step at the next start"
    )
    return unrecorded_end(error, state)


def unrecorded_end(error: str, state: ProcedureState | None = None) -> ProcedureState:
    """FAILED in memory, `recorded` false: nothing in the store says the procedure ended."""
    cause, tb = (None, None) if state is None else (state.cause, state.traceback)
    return ProcedureState(ProcedureStateKind.FAILED, error=error, cause=cause, traceback=tb, recorded=False)
