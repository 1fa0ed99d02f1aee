"""A term: one stretch of time in which a manager runs the store's procedures.

Without a lease a single term runs from `start()` to `stop()`. With one, each leadership is
a term: begun when the lease is won, ended when it is lost or the manager stops. A term's
life, all of it in this file:

    begin()    a fresh ManagerContext over the store (writes guarded by the lease, if any)
       |       recovery task: load the store, resume unfinished procedures
       v
    recovered  housekeeping task: adopt procedures stored after recovery (lease), forget
       |       finished metadata, sweep stale temp files; the operator-request watch
       |       runners: one task per procedure, started by recovery and by submit
       v
    end()      (the lease was lost, a runner was fenced, or stop()) running = False;
               recovery and housekeeping cancelled; every runner and every write the term
               owns (a submit's included) cancelled and waited for

Invariant: once `end()` returns nothing of the term can still reach the store, so a lease
is released (and a new term begun) only after it.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from procstore._logs import get_logger
from procstore._runtime.context import Loader, ManagerContext, await_term_task
from procstore._runtime.operator import watch_operator_requests
from procstore._runtime.recovery import adopt_unknown, recover
from procstore._runtime.retry import RetryPolicy
from procstore._runtime.telemetry import OFF, Telemetry, TracedStore, backend_of, timed
from procstore.errors import Fenced, ProcedureError
from procstore.ids import ProcedureId
from procstore.store.guarded import GuardedStore
from procstore.store.history import History, HistoryStore
from procstore.store.local import LocalDirStore
from procstore.store.procedure_store import LoadProblem, ProcedureStore
from procstore.store.state_store import StateStore

logger = get_logger("procstore.manager")


@dataclass(frozen=True, slots=True)
class LeaseHooks:
    """What a term under a lease takes from its leadership, fixed when the term begins."""

    on_fenced: Callable[[Fenced], None]
    """Told when a runner was fenced: the leadership decides what that means."""
    check_writable: Callable[[str], None]
    """Raises `LeaseExpired` once the term may no longer write."""
    fencing_token: int | None
    """The lease epoch of this term: `Context.fencing_token`."""
    late_write_grace: float
    """Seconds after the term begins during which inherited trees' keys are kept."""
    adopt_interval: float
    """Seconds between looks for procedures stored after recovery."""
    holder: str = ""
    """This manager's name in the lease."""


@dataclass(frozen=True, slots=True)
class TermSettings:
    """The manager's settings a term runs with."""

    state_store: StateStore
    parent_path: str
    policy: RetryPolicy
    loaders: dict[str, Loader]
    gc_interval: float
    metadata_ttl: float
    request_poll_interval: float
    submitting: set[ProcedureId]
    """The ids of the manager's submits under way (shared): never taken for strangers."""
    history: History = field(default_factory=History)
    keep_failed: bool = False
    telemetry: Telemetry = OFF


class Term:
    """One term of a manager: its context, its recovery and its housekeeping."""

    def __init__(self, settings: TermSettings, lease: LeaseHooks | None = None) -> None:
        self.settings = settings
        self.lease = lease
        state_store = settings.state_store
        if settings.telemetry.enabled:
            state_store = TracedStore(state_store, settings.telemetry)
        if lease is not None:
            state_store = GuardedStore(state_store, lease.check_writable)
        store = ProcedureStore(state_store, settings.parent_path, skip_strays=lease is not None)
        self.ctx = ManagerContext(
            store,
            settings.policy,
            settings.loaders,
            on_fenced=lease.on_fenced if lease else None,
            lease_check=lease.check_writable if lease else None,
            fencing_token=lease.fencing_token if lease else None,
            inherited_deletes_after=time.monotonic() + lease.late_write_grace if lease else 0.0,
            history=HistoryStore(state_store, settings.parent_path, settings.history),
            keep_failed=settings.keep_failed,
            telemetry=settings.telemetry,
            span_attributes=_span_attributes(settings.state_store.url, lease),
        )
        self.problems: list[LoadProblem] = []
        """What this term's recovery could not load."""
        self._recovery: asyncio.Task[None] | None = None
        self._housekeeping: asyncio.Task[None] | None = None

    def begin(self) -> None:
        """Start running: recovery begins in its own task (a lease's renewals go on meanwhile)."""
        self.ctx.running = True
        self._recovery = asyncio.get_running_loop().create_task(self._recover(), name="procstore:recovery")

    async def _recover(self) -> None:
        telemetry = self.ctx.telemetry
        with telemetry.span("procstore.recovery", **self.ctx.span_attributes), timed() as elapsed:
            self.problems = await recover(self.ctx)
        telemetry.recovered(elapsed(), len(self.problems))
        self._housekeeping = asyncio.get_running_loop().create_task(self._keep_house(), name="procstore:gc")
        interval = self.settings.request_poll_interval
        self.ctx.spawn(watch_operator_requests(self.ctx, interval), name="procstore:requests")

    async def wait_recovered(self) -> None:
        """Wait for recovery; raise its error, or `ManagerStopped` if the term ended first."""
        if self._recovery is not None:
            await await_term_task(self._recovery, "recovering")

    @property
    def recovered(self) -> bool:
        task = self._recovery
        return task is not None and task.done() and self.recovery_error() is None

    def recovery_error(self) -> BaseException | None:
        task = self._recovery
        return task.exception() if task is not None and task.done() and not task.cancelled() else None

    async def end(self) -> None:
        """Stop running: cancel everything of the term and wait for it. Idempotent."""
        if not self.ctx.running:
            return
        self.ctx.running = False
        for task in (self._recovery, self._housekeeping):
            if task is not None:
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)
        await self.ctx.cancel_all()

    def forget_finished(self) -> int:
        """Forget finished trees older than the metadata TTL; returns how many procedures."""
        return self.ctx.remove_outdated_metadata(self.settings.metadata_ttl)

    # -- housekeeping ---------------------------------------------------------------

    async def _keep_house(self) -> None:
        # A second walk of the whole store would double start()'s cost; temp files left by a
        # crashed writer are invisible to loading and can go a moment later.
        await self._remove_stale_temps()
        adopt_every = self.lease.adopt_interval if self.lease is not None else None
        interval = adopt_every if adopt_every is not None else self.settings.gc_interval
        unknown: set[ProcedureId] = set()
        next_gc = time.monotonic() + self.settings.gc_interval
        while True:
            await asyncio.sleep(interval)
            # Any error is logged and the loop goes on: if it died, procedures stored after
            # recovery would wait for the next takeover, silently.
            if adopt_every is not None:
                try:
                    unknown = await adopt_unknown(self.ctx, unknown, self.settings.submitting)
                except ProcedureError as e:
                    logger.warning("could not look for procedures stored after recovery: %s", e)
                except Exception:
                    logger.exception("looking for procedures stored after recovery failed; trying again")
            if time.monotonic() >= next_gc:
                next_gc += self.settings.gc_interval
                try:
                    if removed := self.forget_finished():
                        logger.debug("forgot %d finished procedures", removed)
                    if swept := await self.ctx.history.sweep():
                        logger.info("deleted %d history records past their retention", swept)
                except Exception:
                    logger.exception("forgetting finished procedures failed; trying again")

    async def _remove_stale_temps(self) -> None:
        store = self.settings.state_store
        if isinstance(store, LocalDirStore):
            try:
                await store.remove_stale_temps(self.ctx.store.proc_path)
            except Exception as e:
                logger.warning("could not remove stale temp files: %s", e)


def _span_attributes(url: str, lease: LeaseHooks | None) -> dict[str, Any]:
    attributes: dict[str, Any] = {"procstore.store.backend": backend_of(url)}
    if lease is not None and lease.fencing_token is not None:
        attributes["procstore.lease.epoch"] = lease.fencing_token
    if lease is not None:
        attributes["procstore.lease.holder"] = lease.holder
    return attributes
