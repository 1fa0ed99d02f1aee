"""`ProcedureManager`: the public entry point that runs procedures on a store."""

from __future__ import annotations

import asyncio
import os
import warnings
from collections.abc import Callable, Coroutine
from datetime import UTC, datetime
from functools import partial
from types import TracebackType
from typing import Any, Generic, Self, TypeVar, overload

from procstore._logs import get_logger
from procstore._runtime.context import Loader, ManagerContext
from procstore._runtime.leadership import Leadership, check_lease_support, lease_key, refuse_if_lease_is_live
from procstore._runtime.lease import LEASE_FOLDER, Lease
from procstore._runtime.lifecycle import Lifecycle
from procstore._runtime.operator import request as request_stop
from procstore._runtime.restart import restart
from procstore._runtime.retry import RetryBudget, RetryPolicy
from procstore._runtime.runner import checked_lock_key, dumped, submit_and_run, type_name_of
from procstore._runtime.telemetry import OFF, Telemetry, TelemetrySettings, get_telemetry
from procstore._runtime.term import SingleTerm, Term, TermSettings, await_term_task
from procstore._runtime.watcher import Watcher
from procstore.errors import (
    DuplicateProcedure,
    Fenced,
    InvalidProcedureId,
    LoaderConflict,
    ManagerNotStarted,
    ManagerStopped,
    NotLeader,
    ProcedureError,
    SettingFrozen,
    StoreError,
    SubmissionsPaused,
    TooManyRunningProcedures,
)
from procstore.ids import ProcedureId
from procstore.procedure import Procedure, ProcedureWithId
from procstore.state import ProcedureInfo, ProcedureState
from procstore.store.deletes_in_doubt import DEFAULT_LATE_WRITE_GRACE, DeletesInDoubt
from procstore.store.history import Action, History, iso
from procstore.store.keys import KeyType, parent_folder
from procstore.store.limits import lease_write_rate_warning
from procstore.store.open import open_state_store
from procstore.store.procedure_store import LoadProblem, ProcedureStore
from procstore.store.requests import checked_reason, who
from procstore.store.signals import encoded_payload, send_signal
from procstore.store.state_store import StateStore

logger = get_logger("procstore.manager")

DEFAULT_METADATA_TTL = 600.0

T = TypeVar("T")


class _Setting(Generic[T]):
    """A manager's setting: read any time, set only while the manager is not started (a
    term runs with the settings it began with, so a later change would be silently lost),
    unless `live`: read where it is used, so a change takes effect at once."""

    def __init__(self, *, live: bool = False) -> None:
        self._live = live

    def __set_name__(self, owner: type, name: str) -> None:
        self._name = name

    @overload
    def __get__(self, manager: None, owner: type) -> _Setting[T]: ...
    @overload
    def __get__(self, manager: ProcedureManager, owner: type) -> T: ...
    def __get__(self, manager: ProcedureManager | None, owner: type) -> T | _Setting[T]:
        if manager is None:
            return self
        value: T = manager._settings[self._name]
        return value

    def __set__(self, manager: ProcedureManager, value: T) -> None:
        if manager.is_running and not self._live:
            raise SettingFrozen(self._name)
        manager._settings[self._name] = value


class ProcedureManager:
    """Runs procedures, persisting each one's state to a store after every persisting step.

    `start()` opens the store and resumes whatever an earlier process left unfinished;
    `stop()` behaves like a process exit. Use it as `async with manager:`.

    Args:
        url: any fsspec URL or a local path (`/var/lib/cp`, `s3://bucket/prefix/`,
            `gs://bucket/prefix/`, `memory://name/`), or a `StateStore` to use as it is
            (a wrapped store in tests, for example; `stop()` then leaves it open).
        storage_options: passed to fsspec (credentials, `endpoint_url`, ...).
        max_retry_times: retries of one step (after `RetryLater` or a store error) before
            the procedure fails; also the retries of a failing `rollback()`.
        retry_delay: the first backoff delay, in seconds; it doubles each retry, plus jitter.
        max_retry_delay: the cap on one backoff delay, in seconds.
        retry_budget: the rate of retries allowed to all procedures together (a token bucket,
            `RetryBudget(rate=20, burst=100)` by default): retries beyond it wait their turn.
        max_running_procedures: `submit()` raises `TooManyRunningProcedures` beyond this
            many unfinished procedures (subprocedures and recovered ones are not refused;
            those parked in a durable wait, `Status.sleep` or `wait_for_signal`, do not count).
        metadata_ttl: seconds a finished tree stays visible to `procedure_state()` and
            `list_procedures()`.
        gc_interval: seconds between sweeps of expired metadata (a task `start()` creates
            and `stop()` cancels).
        parent_path: a path inside the store under which `procedure/` lives (GreptimeDB's
            `parent_path`); empty by default.
        lease: run as one of several managers on the store: only the holder of the lease
            (a `Lease`, kept in the store) runs procedures, the others stand by and take
            over when it stops renewing. Needs a store with compare-and-swap and
            create-only writes (S3, a local directory, memory://). A number is the TTL in
            seconds (`Lease(ttl=…)`), True the default `Lease()`. See docs/many-managers.md.
        request_poll_interval: seconds between looks for operator requests (`cancel`,
            `procstore fail`) that must reach procedures waiting for children or a retry.
            A procedure about to attempt a step always reads its own request first.
        history: how long the record of each ended run is kept under `history/` (a
            `History`; None or True for `History()`, 7 days): `procstore ls --history`,
            `procstore show`. Always kept: each record is its run's end record, which stops
            a finished procedure from ever running again (docs/guarantees.md). False is
            taken as the default, with a `DeprecationWarning`.
        keep_failed: a root that ends FAILED keeps its keys (children's go as usual), so that
            an operator can `resume` or `rewind` it; `procstore delete` removes them.
        telemetry: report traces and metrics to OpenTelemetry's global providers when its
            API is installed (the `otel` extra); False turns that off; a `TelemetrySettings`
            chooses which spans and events are made. See docs/observability.md.
    """

    url: _Setting[str] = _Setting()
    storage_options: _Setting[dict[str, Any]] = _Setting()
    retry_budget: _Setting[RetryBudget] = _Setting()
    policy: _Setting[RetryPolicy] = _Setting()
    max_running_procedures: _Setting[int] = _Setting(live=True)
    metadata_ttl: _Setting[float] = _Setting()
    gc_interval: _Setting[float] = _Setting()
    parent_path: _Setting[str] = _Setting()
    request_poll_interval: _Setting[float] = _Setting()
    history: _Setting[History] = _Setting()
    keep_failed: _Setting[bool] = _Setting()
    telemetry: _Setting[bool | TelemetrySettings] = _Setting()
    lease: _Setting[Lease | None] = _Setting()

    def __init__(
        self,
        url: str | os.PathLike[str] | StateStore,
        storage_options: dict[str, Any] | None = None,
        *,
        max_retry_times: int = 3,
        retry_delay: float = 0.5,
        max_retry_delay: float = 30.0,
        max_running_procedures: int = 128,
        metadata_ttl: float = DEFAULT_METADATA_TTL,
        gc_interval: float = 60.0,
        parent_path: str = "",
        lease: Lease | float | bool | None = None,
        retry_budget: RetryBudget | None = None,
        request_poll_interval: float = 1.0,
        history: History | bool | None = None,
        keep_failed: bool = False,
        telemetry: bool | TelemetrySettings = True,
    ) -> None:
        parent_folder(parent_path)  # a path outside the store raises ValueError now, not at start()
        self._given_store = url if isinstance(url, StateStore) else None
        self._state_store: StateStore | None = None
        budget = retry_budget if retry_budget is not None else RetryBudget()
        self._settings: dict[str, Any] = {
            "url": url.url if isinstance(url, StateStore) else os.fspath(url),
            "storage_options": dict(storage_options or {}),
            "retry_budget": budget,
            "policy": RetryPolicy(max_retry_times, retry_delay, max_retry_delay, budget),
            "max_running_procedures": max_running_procedures,
            "metadata_ttl": metadata_ttl,
            "gc_interval": gc_interval,
            "parent_path": parent_path,
            "request_poll_interval": request_poll_interval,
            "history": history if isinstance(history, History) else History(),
            "keep_failed": keep_failed,
            "telemetry": telemetry,
            "lease": Lease.from_option(lease),
        }
        """The values of the `_Setting`s, by name."""
        if history is False:
            warnings.warn(
                "history=False no longer turns history off: each ended run's record is its end record, "
                "always written (docs/guarantees.md); set its retention with History(retention=...)",
                DeprecationWarning,
                stacklevel=2,
            )
        self._loaders: dict[str, Loader] = {}
        self._paused = False
        self._terms: Leadership | SingleTerm | None = None
        """The owner of this manager's terms (the last one's, once stopped: its metadata
        stays readable until the next start)."""
        self._highest_epoch = 0
        """The highest lease epoch any of this manager's terms has seen."""
        self._deletes_in_doubt = DeletesInDoubt()
        """Folders whose deletion failed, kept across this manager's terms and restarts: a
        request one term sent may land in the next (`ProcedureStore.deletes_in_doubt`)."""
        self._lifecycle = Lifecycle()

    @property
    def recovery_problems(self) -> list[LoadProblem]:
        """Procedures the last term's recovery found but could not resume, with what to do."""
        term = self._term
        return [] if term is None else term.problems

    @property
    def _term(self) -> Term | None:
        """The current or last term."""
        return None if self._terms is None else self._terms.term

    @property
    def _leadership(self) -> Leadership | None:
        """The lease's owner, while started with a lease."""
        return self._terms if self.is_running and isinstance(self._terms, Leadership) else None

    @property
    def _ctx(self) -> ManagerContext | None:
        term = self._term
        return None if term is None else term.ctx

    # -- registration ----------------------------------------------------------------

    def register_loader(self, type_name: str, loader: Loader) -> None:
        """Register how to rebuild procedures of `type_name` from their stored data.

        Raises `LoaderConflict` if `type_name` already has a loader.
        """
        if type_name in self._loaders:
            raise LoaderConflict(type_name)
        self._loaders[type_name] = loader

    def register(self, procedure_class: type[Procedure]) -> None:
        """`register_loader(cls.type_name, cls.load)`."""
        name = getattr(procedure_class, "type_name", None)
        if not isinstance(name, str) or not name:
            raise TypeError(f"{procedure_class.__qualname__} has no `type_name` class attribute")
        self.register_loader(name, procedure_class.load)

    # -- lifecycle -------------------------------------------------------------------

    @property
    def is_running(self) -> bool:
        """Started and not stopped (leading or, with a lease, standing by)."""
        return self._state_store is not None

    @property
    def is_leader(self) -> bool:
        """Whether this manager runs procedures now: always once started, unless it has a lease
        and another manager holds it."""
        if self._leadership is not None:
            # Not before recovery has registered what the store holds: a submission racing
            # with it could be found by it too.
            term = self._term
            return self._leadership.is_leading and term is not None and term.recovered and term.running
        return self.is_running

    @property
    def lease_epoch(self) -> int | None:
        """With a lease: the epoch of the last lease record this manager read or wrote (its
        term's fencing token while it leads); None without a lease, or before any was read."""
        return None if self._leadership is None else self._leadership.keeper.epoch

    @property
    def leader(self) -> str | None:
        """With a lease: the holder name of the current leader as last seen (None if none)."""
        return None if self._leadership is None else self._leadership.keeper.leader

    @property
    def store(self) -> ProcedureStore:
        """The procedure store (after `start()`), for tools and tests."""
        return self._started("store").store

    async def start(self) -> None:
        """Open the store and resume unfinished procedures; a no-op if already started.

        Returns once recovered procedures are registered (listed, watchable, holding the
        locks they can take); their runners start right after, a batch per turn of the event
        loop, and those that must wait for a lock queue for it in recovery's order. With a
        lease, it first tries to take the lease once: if another manager holds it, this one
        returns as a standby and a background task (`procstore:lease`) takes over when that
        lease expires; `wait_until_leading()` waits for it.
        Raises `StoreUnavailable` if the store cannot be used (or, with a lease, cannot
        compare-and-swap); without a lease, `LeaseHeld` (a `StoreUnavailable`) if the store's
        lease has a live holder, seen renewing it within its TTL (a lease left unreleased is
        watched for up to that long); procedures that cannot be loaded are skipped and listed in
        `recovery_problems`. Safe to call concurrently with itself and with `stop()`:
        calls are serialised, and a second `start()` is a no-op.
        """
        async with self._lifecycle.lock():
            await self._start()

    async def _start(self) -> None:
        if self.is_running:
            return
        state_store = self._given_store or open_state_store(self.url, self.storage_options)
        try:
            await state_store.check_access()
            await self._check_lease_support(state_store)
        except BaseException:
            if self._given_store is None:
                await state_store.close()
            raise
        if not state_store.supports_create_only:
            logger.warning(
                "%s cannot create a key atomically: step keys are checked before they are written, not guaranteed "
                "new, so fencing between managers is best effort here. Run one manager per store.",
                state_store.url,
            )
        if self.lease is not None and (
            too_fast := lease_write_rate_warning(state_store.url, self.lease.renew_interval)
        ):
            logger.warning(too_fast)
        self._state_store = state_store
        self._deletes_in_doubt.late_write_grace = (
            DEFAULT_LATE_WRITE_GRACE if self.lease is None else self.lease.late_write_grace
        )
        settings = TermSettings(
            state_store,
            self.parent_path,
            self.policy,
            self._loaders,
            self.gc_interval,
            self.metadata_ttl,
            self.request_poll_interval,
            self.history,
            self.keep_failed,
            _telemetry_for(self.telemetry),
        )
        try:
            if self.lease is None:
                self._terms = SingleTerm(settings, self._deletes_in_doubt)
            else:
                # Its own client: renewals must not queue behind the runners' writes for a
                # connection (botocore pools ten per client).
                lease_store = self._given_store or open_state_store(self.url, self.storage_options)
                self._terms = Leadership(
                    settings,
                    lease_store,
                    self.lease,
                    highest_epoch=self._highest_epoch,
                    deletes_in_doubt=self._deletes_in_doubt,
                )
            await self._terms.start()
        except BaseException:
            await self._stop()
            raise

    async def _check_lease_support(self, state_store: StateStore) -> None:
        if self.lease is not None:
            await check_lease_support(state_store, f"{parent_folder(self.parent_path)}{LEASE_FOLDER}")
        else:
            # Without a lease this manager runs everything the store holds: not beside a leader.
            await refuse_if_lease_is_live(state_store, lease_key(self.parent_path))

    async def wait_until_leading(self) -> None:
        """Wait until this manager leads and has resumed the store's procedures.

        Without a lease that is as soon as `start()` returns. Raises `ManagerNotStarted`
        if it is not started.
        """
        self._started_or_standby("wait_until_leading")
        if self._leadership is not None:
            await self._leadership.wait_until_leading()
        if (term := self._term) is not None:
            await term.wait_recovered()
        if not self.is_running:
            raise ManagerStopped(what="waiting to lead")

    async def stop(self) -> None:
        """Stop like a process exit: cancel every runner at its next await and wait for it.

        Nothing more is written once this returns (but for a lease: it is marked released,
        so that a standby takes over at once). Unfinished procedures resume at the next
        `start()` on the same store; their watchers raise `ManagerStopped`. Metadata stays
        readable until the next `start()`. Safe to call concurrently and repeatedly; it
        returns once a `submit` whose write was under way has finished or been cancelled.
        """
        await self._lifecycle.stop(self._stop)

    async def _stop(self) -> None:
        state_store, self._state_store = self._state_store, None
        if state_store is None:
            return
        terms = self._terms
        if terms is not None:
            await terms.stop()
            if isinstance(terms, Leadership):
                self._highest_epoch = max(self._highest_epoch, terms.keeper.highest_epoch)
        await self._lifecycle.cancel_outside_terms()
        if terms is not None:
            await terms.release()
        if self._given_store is None:
            await state_store.close()
            if terms is not None:
                await terms.close()

    async def __aenter__(self) -> Self:
        await self.start()
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.stop()

    # -- operators -------------------------------------------------------------------

    async def cancel(self, procedure_id: ProcedureId, reason: str | None = "") -> None:
        """Ask a procedure to stop, durably, wherever it runs.

        Writes a request to the store (see `procstore cancel`) that the manager running the
        procedure, this one or another process, honours before the procedure's next step at
        the latest: it rolls back if it supports rollback, else fails, and so do its
        unfinished descendants; its watchers raise `ProcedureFailed` naming the cancel and
        `reason`. Returns once the request is stored, not once the procedure has ended.
        `reason` is text; None means no reason given (stored as ""). Raises `ProcedureError`
        for a procedure that has ended or that the store does not hold, `InvalidProcedureId`,
        `TypeError` for a reason that is not text, or `ManagerNotStarted`; nothing is
        written then.
        """
        if not isinstance(procedure_id, ProcedureId):
            raise InvalidProcedureId(procedure_id)
        reason = checked_reason(reason)
        self._started_or_standby("cancel")
        await self._write_request(
            "cancelling",
            lambda ctx: request_stop(ctx.store, procedure_id, "cancel", reason, ctx),
            lambda store: request_stop(store, procedure_id, "cancel", reason, None),
        )

    async def signal(self, procedure_id: ProcedureId, name: str, payload: object = None) -> None:
        """Send the signal `name`, with a JSON `payload`, to a procedure, durably, wherever it runs.

        Stored create-only under the store's `requests/signals/` (any process may send one:
        `Client.signal`, `procstore signal`); a procedure that waits for it
        (`Status.wait_for_signal(name)`) sees `payload` in `ctx.signals[name]` at its next
        step, here at once, on another manager at its next look at `requests/`
        (`request_poll_interval`). One not waited for yet is kept, and signals of one name are
        delivered one per wait, in the order sent. Returns once the signal is stored.

        Raises `ProcedureError` for a procedure that has ended or that the store does not
        hold, `TypeError` for a name that is not non-empty text or a payload JSON cannot hold,
        `ValueError` for a name with a lone surrogate, `InvalidProcedureId`, or
        `ManagerNotStarted`; nothing is written then.
        """
        if not isinstance(procedure_id, ProcedureId):
            raise InvalidProcedureId(procedure_id)
        encoded_payload(name, payload)
        self._started_or_standby("signal")
        await self._write_request(
            "signalling",
            lambda ctx: send_signal_here(ctx, procedure_id, name, payload),
            lambda store: send_signal(store, procedure_id, name, payload),
        )

    async def _write_request(
        self,
        what: str,
        in_term: Callable[[ManagerContext], Coroutine[Any, Any, object]],
        on_standby: Callable[[ProcedureStore], Coroutine[Any, Any, object]],
    ) -> None:
        """Write an operator's request or signal of a started manager: `in_term` while a term
        runs (owned by the term, as a submit's write: stop() waits for it), else `on_standby`."""
        term = self._term
        if term is not None and term.running:
            await term.run_in_term(in_term(term.ctx), what=what)
            return
        # A standby: the leader's look at `requests/` (or its next step) finds it. The write
        # belongs to no term, so stop() cancels and waits for it by itself.
        assert self._state_store is not None
        store = ProcedureStore(self._state_store, self.parent_path)
        task = asyncio.get_running_loop().create_task(on_standby(store), name=f"procstore:{what}")
        self._lifecycle.own(task)
        await await_term_task(task, what)

    async def resume(self, procedure_id: ProcedureId, *, reason: str | None = None) -> Watcher:
        """Run an ended or stuck root again from its last stored step, with fresh retries.

        For a FAILED root whose keys were kept (`keep_failed`, or a rollback that failed), a
        POISONED one (say, a loader registered since), or one that `start()` could not
        load. A rolled-back procedure is refused (its later steps would run over undone
        work): `rewind` it. Returns a watcher of the new run. Raises `ProcedureError`
        saying why not (running here, a subprocedure, finished, keys gone, a run that
        ended whose keys a late write re-created),
        `NotLeader` on a standby, `ManagerNotStarted`. `reason` (text, or None for none;
        anything else raises `TypeError`) is kept, with who and when, in the new run's
        history record (`HistoryRecord.started`).
        """
        return await self._restart(procedure_id, None, reason)

    async def rewind(self, procedure_id: ProcedureId, to_step: int, *, reason: str | None = None) -> Watcher:
        """Make step `to_step`'s stored state the latest again, and run the root from there.

        The state is copied to a new key above the latest (step keys are never
        overwritten: the history stays for audit). Refused, with `ProcedureError`, on a
        procedure running here: cancel it and wait until it has ended first. `reason`: as
        for `resume`.
        """
        if isinstance(to_step, bool) or not isinstance(to_step, int) or to_step < 0:
            raise ValueError(f"to_step must be a step number (an int >= 0), not {to_step!r}")
        return await self._restart(procedure_id, to_step, reason)

    async def _restart(self, procedure_id: ProcedureId, to_step: int | None, reason: str | None) -> Watcher:
        if not isinstance(procedure_id, ProcedureId):
            raise InvalidProcedureId(procedure_id)
        started = Action(
            kind="resume" if to_step is None else "rewind",
            by=who(),
            at=iso(datetime.now(UTC)),
            reason=checked_reason(reason),
            to_step=to_step,
        )
        if self._leadership is not None and not self.is_leader:
            raise NotLeader(self._leadership.keeper.holder, self.leader)
        ctx = self._started("resume" if to_step is None else "rewind")
        meta = await ctx.term.run_in_term(restart(ctx, procedure_id, to_step, started=started), what="restarting")
        return Watcher(meta)

    # -- submitting ------------------------------------------------------------------

    def pause_submissions(self) -> None:
        """Refuse new `submit()` calls with `SubmissionsPaused`; running procedures go on."""
        self._paused = True

    def resume_submissions(self) -> None:
        self._paused = False

    @property
    def submissions_paused(self) -> bool:
        return self._paused

    async def submit(self, procedure: ProcedureWithId) -> Watcher:
        """Store the procedure's submitted state as its first step, then start running it.

        Durable: once this returns, the procedure is never lost, whatever crashes next.
        With a lease, a procedure stored just as the lease was lost is run by the leader;
        its watcher here raises `ManagerStopped`.
        Raises `ManagerNotStarted`, `NotLeader` (a standby), `LeaseExpired` (the lease ran
        out before the write: nothing was stored), `SubmissionsPaused`, `DuplicateProcedure` (the id is
        known here or already has stored steps), `TooManyRunningProcedures`, or a
        `StoreError` if the first write still fails after `max_retry_times` retries (backed
        off and counted in the retry budget, as a step's), or if the lease runs out between
        retries. Then nothing runs here, but the write may have landed with its answer
        lost: submitting the same procedure again is safe. The create recognises its own
        bytes and runs it; with a lease, `DuplicateProcedure` from the leader means it was
        stored and runs there.
        """
        if self._leadership is not None and not self.is_leader:
            raise NotLeader(self._leadership.keeper.holder, self.leader)
        ctx = self._started("submit")
        if not ctx.term.recovered:
            # Without a lease, start() opens its term before recovery has registered what
            # the store holds: a submission racing with it waits, or recovery would load the
            # same procedure a second time.
            await ctx.term.wait_recovered()
            ctx = self._started("submit")
        if ctx.term.fenced is not None:
            raise ctx.term.fenced
        if self._paused:
            raise SubmissionsPaused()
        pid = procedure.id
        if not isinstance(pid, ProcedureId):
            raise InvalidProcedureId(pid)
        if ctx.is_known(pid) or pid in ctx.metas.submitting:
            raise DuplicateProcedure(pid)
        # A procedure parked in a durable wait (a timer, a signal) holds no task: it does not count.
        running = ctx.metas.unfinished - len(ctx.waits) + len(ctx.metas.submitting)
        if running >= self.max_running_procedures:
            raise TooManyRunningProcedures(self.max_running_procedures)
        proc = procedure.procedure
        type_name = type_name_of(proc)
        if type_name not in self._loaders:
            logger.warning("procedure type %r has no loader: it cannot be resumed after a restart", type_name)
        # Both before the write: an error here reaches the caller with nothing stored.
        lock_key = checked_lock_key(proc)
        data = dumped(proc)
        ctx.metas.submit_begins(pid)
        # The write and the run are one task of the term: stop() cancels it and waits for
        # it, so the write can never land after stop() returned; and a caller that gives up
        # (a timeout) cannot leave a stored procedure that nothing runs. (No lambdas: their
        # cells would live in this frame, one of thousands waiting for their writes.)
        stored = submit_and_run(ctx, procedure, type_name, lock_key, data, partial(ctx.metas.submit_ended, pid))
        try:
            meta = await stored
        except ManagerStopped as e:
            raise StoreError(
                f"submitting procedure {pid}: the manager stopped leading or was stopped while the write was under "
                "way, so it may have landed. Submit it again on the leader: DuplicateProcedure then means it is "
                "stored and runs there",
                key=ctx.store.key(pid, 0, KeyType.STEP),
            ) from e
        if meta is None:
            raise DuplicateProcedure(pid, " in the store (it has stored steps)")
        return Watcher(meta)

    # -- observing -------------------------------------------------------------------

    def procedure_state(self, procedure_id: ProcedureId) -> ProcedureState | None:
        """The state of a procedure this manager knows (None if unknown or forgotten)."""
        return None if self._ctx is None else self._ctx.procedure_state(procedure_id)

    def procedure_watcher(self, procedure_id: ProcedureId) -> Watcher | None:
        """A watcher for any known procedure, e.g. one resumed by `start()`."""
        meta = None if self._ctx is None else self._ctx.metas.get(procedure_id)
        return None if meta is None else Watcher(meta)

    def list_procedures(self) -> list[ProcedureInfo]:
        """Every procedure this manager knows, finished ones until their metadata expires."""
        return [] if self._ctx is None else [m.info() for m in self._ctx.metas.values()]

    def remove_outdated_metadata(self) -> int:
        """Forget finished trees older than `metadata_ttl` now; returns how many procedures."""
        return 0 if self._term is None else self._term.forget_finished()

    @property
    def fenced(self) -> Fenced | None:
        """Why this manager stepped down, if it did: another manager wrote one of its step keys.

        It then cancelled every runner before their next write, and `submit` raises this
        error; `stop()` it and let the other manager work (see docs/many-managers.md).
        """
        return None if self._term is None else self._term.fenced

    def _started_or_standby(self, what: str) -> None:
        if not self.is_running:
            raise ManagerNotStarted(what)

    def _started(self, what: str) -> ManagerContext:
        term = self._term
        if term is None or not term.running:
            raise ManagerNotStarted(what)
        return term.ctx


async def send_signal_here(ctx: ManagerContext, procedure_id: ProcedureId, name: str, payload: object) -> None:
    """`send_signal` in the term `ctx`, refusing a procedure it knows has ended, and waking
    the procedure at once if it waits here."""
    meta = ctx.metas.get(procedure_id)
    if meta is not None and meta.state.is_ended():
        raise ProcedureError(f"cannot signal procedure {procedure_id}: it has already ended ({meta.state.kind.name})")
    await send_signal(ctx.store, procedure_id, name, payload)
    ctx.waits.signalled(procedure_id, name)


def _telemetry_for(telemetry: bool | TelemetrySettings) -> Telemetry:
    if isinstance(telemetry, TelemetrySettings):
        return get_telemetry().configured(telemetry)
    return get_telemetry() if telemetry else OFF


async def halt(manager: ProcedureManager) -> None:
    """End `manager`'s terms as a kill would (see `procstore.testing.kill_manager`): its
    lease task and every runner stop at their next await, nothing more is written, and the
    lease is not released. `stop()` then closes what is left."""
    if manager._terms is not None:
        await manager._terms.stop()
