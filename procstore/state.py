"""What a procedure is doing now: `ProcedureState`, and `ProcedureInfo` for listings."""

from __future__ import annotations

import enum
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, ClassVar

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


@dataclass(frozen=True, slots=True)
class ProcedureState:
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

    RUNNING: ClassVar[ProcedureStateKind] = ProcedureStateKind.RUNNING
    RETRYING: ClassVar[ProcedureStateKind] = ProcedureStateKind.RETRYING
    PREPARE_ROLLBACK: ClassVar[ProcedureStateKind] = ProcedureStateKind.PREPARE_ROLLBACK
    ROLLING_BACK: ClassVar[ProcedureStateKind] = ProcedureStateKind.ROLLING_BACK
    DONE: ClassVar[ProcedureStateKind] = ProcedureStateKind.DONE
    FAILED: ClassVar[ProcedureStateKind] = ProcedureStateKind.FAILED
    POISONED: ClassVar[ProcedureStateKind] = ProcedureStateKind.POISONED

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

    def is_running(self) -> bool:
        """RUNNING or RETRYING."""
        return self.kind in (ProcedureStateKind.RUNNING, ProcedureStateKind.RETRYING)

    def is_retrying(self) -> bool:
        return self.kind is ProcedureStateKind.RETRYING

    def is_done(self) -> bool:
        return self.kind is ProcedureStateKind.DONE

    def is_failed(self) -> bool:
        return self.kind is ProcedureStateKind.FAILED

    def is_poisoned(self) -> bool:
        return self.kind is ProcedureStateKind.POISONED

    def is_prepare_rollback(self) -> bool:
        return self.kind is ProcedureStateKind.PREPARE_ROLLBACK

    def is_rolling_back(self) -> bool:
        return self.kind is ProcedureStateKind.ROLLING_BACK

    def is_ended(self) -> bool:
        """DONE, FAILED or POISONED: nothing more will happen to the procedure here."""
        return self.kind in _FINAL


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
