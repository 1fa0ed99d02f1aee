"""Every exception procstore raises, in one place.

All derive from `ProcedureError`, but for `ProcessKill`, which ends a runner as a kill
would, never a procedure. Errors about the store name the key (or URL) and say
what to do next; errors about a procedure name its id.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from procstore.ids import ProcedureId
    from procstore.state import ProcedureState
    from procstore.store.procedure_store import LoadProblem


def describe(exc: BaseException) -> str:
    """`Type: message`, or just `Type` for an exception without a message (or whose
    `__str__` itself raises: the error being described must not be lost to that one)."""
    try:
        text = str(exc)
    except Exception as e:
        text = f"<its message could not be made: {type(e).__name__}>"
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


class ProcedureError(Exception):
    """Base class of every procstore error."""


class RetryLater(ProcedureError):
    """Raised by `execute()` for a transient failure: the step is retried with backoff.

    After the manager's `max_retry_times` retries of the same step the procedure fails
    (and rolls back if it supports rollback).
    """

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason

    @classmethod
    def from_exc(cls, exc: BaseException) -> RetryLater:
        """Wrap `exc` as a transient failure, keeping it as `__cause__`."""
        err = cls(f"{type(exc).__name__}: {exc}")
        err.__cause__ = exc
        return err


class ProcedureFailed(ProcedureError):
    """Raised by `Watcher.wait()` when the procedure ended without success.

    `error` is the failure's text (all that survives a restart); `cause` is the exception
    object when the failure happened in this process, else `None`.
    """

    def __init__(self, procedure_id: ProcedureId, state: ProcedureState) -> None:
        self.procedure_id = procedure_id
        self.state = state
        self.error = state.error or "unknown error"
        self.cause = state.cause
        super().__init__(f"procedure {procedure_id} {state.kind.value.lower()}: {self.error}")
        self.__cause__ = state.cause


class EndNotRecorded(ProcedureError):
    """Raised by `Watcher.wait()` when the procedure's run ended but its end could not be
    written to the store (credentials expired, access revoked, the store down for every
    retry): no `.commit` or `.rollback` key says it ended.

    It did not fail, as far as the store knows: the next `start()` resumes it from its last
    stored step, and it may well end `done` then. So this is deliberately not a
    `ProcedureFailed`: do not compensate or resubmit on it; wait for the procedure at the
    next start (`procedure_watcher(id)`), or look at the store (`procstore show`).
    `error` says what went wrong; `state` is the in-memory state (FAILED, `recorded` false).
    """

    def __init__(self, procedure_id: ProcedureId, state: ProcedureState) -> None:
        self.procedure_id = procedure_id
        self.state = state
        self.error = state.error or "unknown error"
        self.cause = state.cause
        super().__init__(f"procedure {procedure_id}: its end could not be recorded in the store: {self.error}")
        self.__cause__ = state.cause


class InvalidProcedureId(ProcedureError, ValueError):
    """An id that is not a canonical `ProcedureId`: refused before anything is written.

    Every id that reaches the store is the canonical lower-case UUID text, because that is
    the only form recovery recognises in a key: a procedure stored under any other text
    would never be resumed.
    """

    def __init__(self, value: object) -> None:
        self.value = value
        super().__init__(
            f"not a procedure id: {value!r}. Use ProcedureId.random(), or ProcedureId.parse(text) for a UUID "
            "written in another form (it is stored in the canonical lower-case form)"
        )


class DuplicateProcedure(ProcedureError):
    """`submit()` of an id the manager already knows, or that already has stored steps."""

    def __init__(self, procedure_id: ProcedureId, detail: str = "") -> None:
        self.procedure_id = procedure_id
        super().__init__(f"procedure {procedure_id} already exists{detail}")


class TooManyRunningProcedures(ProcedureError):
    """`submit()` while `max_running_procedures` procedures are unfinished."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        super().__init__(
            f"{limit} procedures are already running (max_running_procedures={limit}); "
            "wait for some to finish or raise the limit"
        )


class ManagerNotStarted(ProcedureError):
    """A call that needs a started manager was made before `start()` or after `stop()`."""

    def __init__(self, what: str = "submit") -> None:
        super().__init__(f"{what}: the procedure manager is not started; call `await manager.start()` first")


class ManagerStopped(ProcedureError):
    """`Watcher.wait()` on a procedure whose manager was stopped before it ended.

    Nothing is lost: the procedure resumes from its last stored step at the next `start()`.
    """

    def __init__(self, procedure_id: ProcedureId | None = None, what: str | None = None) -> None:
        self.procedure_id = procedure_id
        if procedure_id is None:
            super().__init__(f"the manager was stopped{f' while {what}' if what else ''}")
            return
        super().__init__(
            f"procedure {procedure_id}: the manager stopped before it ended; "
            "it resumes from its last stored step when a manager starts on the same store"
        )


class SettingFrozen(ProcedureError, AttributeError):
    """A setting of a started manager was changed: a term runs with the settings it began
    with. Set it before `start()`, or between `stop()` and the next `start()`."""

    def __init__(self, name: str) -> None:
        self.name = name
        super().__init__(f"ProcedureManager.{name} cannot change once the manager is started; set it before start()")


class SubmissionsPaused(ProcedureError):
    """`submit()` while new submissions are paused (`pause_submissions()`)."""

    def __init__(self) -> None:
        super().__init__("new submissions are paused; call `resume_submissions()` to accept them again")


class LoaderConflict(ProcedureError):
    """`register_loader()` with a type name that already has a loader."""

    def __init__(self, type_name: str) -> None:
        self.type_name = type_name
        super().__init__(f"a loader for procedure type {type_name!r} is already registered")


class LockConflict(ProcedureError):
    """A subprocedure asked for a lock key that conflicts with one its ancestor holds.

    The child would wait forever for a lock its waiting parent holds, so the parent fails
    instead. Children do not inherit locks: lock a finer key (`table/1/region-0`).
    """

    def __init__(self, parent_id: ProcedureId, child_id: ProcedureId, keys: list[str]) -> None:
        self.parent_id = parent_id
        self.child_id = child_id
        self.keys = keys
        super().__init__(
            f"subprocedure {child_id} wants lock key(s) {keys} that conflict with those held by "
            f"its ancestor {parent_id}; it would deadlock. Give the child finer keys."
        )


class LockCycle(LockConflict):
    """Waiting for a lock key would close a cycle of procedures waiting for each other.

    The cycle runs through lock holders and through parents, which hold their locks while
    they wait for their subprocedures. The procedure whose wait would close it fails instead,
    so the others go on: lock keys in one order across a tree to avoid it.
    """

    def __init__(self, waiter: ProcedureId, key: str, cycle: list[ProcedureId], *, kept: bool = False) -> None:
        self.parent_id = cycle[0] if cycle else waiter
        self.child_id = waiter
        self.keys = [key]
        self.cycle = cycle
        self.kept = kept
        """Its step may have run, and its rollback needs the locks: it failed without one, its
        keys kept for an operator to resume or rewind it."""
        then = (
            "; its step may have run and its rollback needs the locks, so it fails without a rollback "
            "and its keys are kept: resume or rewind it once the cycle is gone"
            if kept
            else "; it fails instead of deadlocking"
        )
        ProcedureError.__init__(
            self,
            f"procedure {waiter} would wait for lock key {key!r} in a cycle: "
            + " -> ".join(map(str, [waiter, *cycle, waiter]))
            + then
            + ". Take lock keys in one order across a tree.",
        )


class StoreError(ProcedureError):
    """A store operation failed. Transient ones are retried; the text names the key."""

    def __init__(self, message: str, *, key: str | None = None) -> None:
        self.key = key
        super().__init__(message)


class ListingIncomplete(StoreError):
    """A listing found folders below the one asked for that it could not read.

    `listed` holds every key it could list (with its last-modified time where the listing
    knows it), `unlisted` each folder it could not read (as a key prefix ending in `/`) and
    why. Callers that can go on without those folders (recovery, `procstore ls`) take the
    procedures in them as unreadable: kept, reported, and never the reason to delete another
    procedure; every other caller fails with the message, which names the folder."""

    def __init__(self, message: str, *, key: str | None, listed: dict[str, float | None], unlisted: dict[str, str]):
        super().__init__(message, key=key)
        self.listed = listed
        self.unlisted = unlisted


class StoreUnavailable(StoreError):
    """The store cannot be used at all: bad URL, missing bucket or directory, no access."""


class LeaseHeld(StoreUnavailable):
    """A manager without `lease=` would share its store with a leader whose lease is live.

    `key` is the lease's key, `holder` the leader's name as stored. Raised by `start()`,
    before anything is run: start it with the same `lease=` as that leader (it then stands
    by), or once that lease is released or has expired.
    """

    def __init__(self, message: str, *, key: str, holder: str) -> None:
        self.holder = holder
        super().__init__(message, key=key)


class Fenced(StoreError):
    """A step key this manager was about to create holds another writer's value.

    Step keys are never overwritten: another manager runs the procedure now, and this one
    must stop writing. Not retried. `key` is the key; `procedure_id` the procedure.
    """

    def __init__(self, key: str, procedure_id: ProcedureId | None, message: str | None = None) -> None:
        super().__init__(
            message
            or f"{key} was already written by another manager: it runs procedure {procedure_id} now, so this "
            "manager stopped its runners without writing anything more (without a lease: start one manager "
            "per store, or give them one; with a lease: a former leader's late write, the term restarts)",
            key=key,
        )
        self.procedure_id = procedure_id


class LeaseExpired(Fenced):
    """A write was refused because this manager's lease may have expired.

    Raised by the store of a manager started with `lease=` once it can no longer prove it
    leads: another manager may have taken over, so nothing more is written. The procedure
    is not failed; it resumes under the new leader. `key` is the write that was refused.
    """

    def __init__(self, key: str, holder: str, reason: str) -> None:
        super().__init__(
            key,
            None,
            f"not writing {key}: {holder} no longer holds the lease ({reason}); "
            "the manager that takes over resumes its procedures",
        )
        self.holder = holder


class NotLeader(ProcedureError):
    """`submit()` on a manager started with `lease=` that does not hold the lease.

    Submit to the leader instead (`leader` is its holder name, as it wrote it in the lease,
    or None if no manager holds a live lease), or wait with `await manager.wait_until_leading()`.
    """

    def __init__(self, holder: str, leader: str | None) -> None:
        self.holder = holder
        self.leader = leader
        what_to_do = (
            f"the leader is {leader!r}; submit there"
            if leader
            else "no manager holds the lease right now; try again shortly, or wait_until_leading() here"
        )
        super().__init__(f"{holder} is a standby and does not accept submissions: {what_to_do}")


class ProcedureNotFound(ProcedureError, LookupError):
    """`Client` asked about an id the store holds neither as keys nor in its history: never
    submitted, or ended and its history record swept since (see `History`)."""

    def __init__(self, procedure_id: ProcedureId | str) -> None:
        self.procedure_id = procedure_id
        super().__init__(
            f"no procedure {procedure_id} in this store: never submitted, or it ended longer ago than history keeps"
        )


class ProcedureNotEnded(ProcedureError):
    """`Client.result()` of a procedure that has not ended yet: `Client.wait()` waits for it."""

    def __init__(self, procedure_id: ProcedureId | str, status: str) -> None:
        self.procedure_id = procedure_id
        self.status = status
        super().__init__(f"procedure {procedure_id} has not ended ({status}): Client.wait() waits for its result")


class ResultNotKept(ProcedureError):
    """`Client.result()` of a procedure that ended `done` but whose output history could
    not keep: larger than the limit, or not JSON-serialisable (`reason` says which)."""

    def __init__(self, procedure_id: ProcedureId | str, reason: str) -> None:
        self.procedure_id = procedure_id
        self.reason = reason
        super().__init__(f"procedure {procedure_id} ended done, but its output was not kept: {reason}")


class OperationRefused(ProcedureError):
    """An operator's `cancel`, `fail`, `resume` or `rewind` (through `Client` or the CLI)
    that cannot be done now: the message says why and what to do instead. Nothing was
    written."""


class LoadFailed(ProcedureError):
    """A stored procedure could not be rebuilt; `problem` says where and what to do."""

    def __init__(self, problem: LoadProblem) -> None:
        self.problem = problem
        super().__init__(str(problem))


class StrayCancellation(ProcedureError):
    """User code raised `CancelledError` although nothing cancelled its procedure."""


class EscapedBaseException(ProcedureError):
    """User code raised a `BaseException` that is neither a stop nor a process exit."""


class ProcessKill(BaseException):
    """Ends a runner as a kill -9 ends its process: the task is simply gone, nothing more is
    written (the testing toolkit's simulated crashes derive from it)."""
