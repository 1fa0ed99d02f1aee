"""A term: one stretch of time in which a manager runs the store's procedures.

Each term has one owner, which creates it, holds it as `term` and ends it; the manager
delegates to that owner. Without a lease it is `SingleTerm` (below): one term from
`start()` to `stop()`. With one it is `Leadership` (leadership.py): a term per leadership,
begun when the lease is won, ended when it is lost or the manager stops. A term's life:

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
import dataclasses
import time
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any, TypeVar

from procstore._logs import get_logger
from procstore._runtime.context import Loader, ManagerContext
from procstore._runtime.operator import watch_operator_requests
from procstore._runtime.recovery import adopt_unknown, recover
from procstore._runtime.retry import RetryPolicy
from procstore._runtime.telemetry import OFF, Telemetry, TracedStore, backend_of, timed
from procstore.errors import Fenced, ManagerStopped, ProcedureError
from procstore.ids import ProcedureId
from procstore.store.deletes_in_doubt import DeletesInDoubt
from procstore.store.guarded import GuardedStore
from procstore.store.history import History
from procstore.store.local import LocalDirStore
from procstore.store.procedure_store import LoadProblem, ProcedureStore
from procstore.store.settings import SettingsStore
from procstore.store.state_store import StateStore

logger = get_logger("procstore.manager")

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class TermLease:
    """What a term under a lease takes from its `Leadership`, fixed when the term begins."""

    on_fenced: Callable[[Fenced], None]
    """Told when a runner was fenced: the leadership decides what that means."""
    check_writable: Callable[[str], None]
    """Raises `LeaseExpired` once the term may no longer write: `Context.check_lease`."""
    is_holding: Callable[[], bool]
    """Whether the lease is still this manager's."""
    fencing_token: int | None
    """The lease epoch of this term: `Context.fencing_token`."""
    keep_inherited_until: float
    """`time.monotonic()` before which an inherited tree's keys are not deleted (see
    `WrittenKeys.inherited`): a paused former leader's late write could re-create them."""
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
    history: History = field(default_factory=History)
    keep_failed: bool = False
    telemetry: Telemetry = OFF


async def obeying_the_store(settings: TermSettings) -> TermSettings:
    """`settings` keeping at least what the store's own settings say (`procstore.store.settings`),
    read as each term begins: a standby that takes over obeys what an operator wrote since
    it started."""
    stored = await SettingsStore(settings.state_store, settings.parent_path).read()
    return dataclasses.replace(
        settings,
        keep_failed=settings.keep_failed or stored.keep_failed,
        history=stored.history(settings.history),
    )


class Term:
    """One term of a manager: its context, its recovery and housekeeping, and every task it
    owns (runners, a submit's write), which `end()` cancels and waits for."""

    __slots__ = (
        "_housekeeping", "_recovery", "_tasks", "ctx", "fenced", "problems", "running", "settings", "span_attributes",
    )  # fmt: skip

    def __init__(
        self, settings: TermSettings, lease: TermLease | None = None, *, deletes_in_doubt: DeletesInDoubt | None = None
    ) -> None:
        """`deletes_in_doubt`: the manager's, kept from one term to the next."""
        self.settings = settings
        state_store = settings.state_store
        if settings.telemetry.enabled:
            state_store = TracedStore(state_store, settings.telemetry)
        if lease is not None:
            state_store = GuardedStore(state_store, lease.check_writable)
        store = ProcedureStore(
            state_store,
            settings.parent_path,
            skip_strays=lease is not None,
            history=settings.history,
            deletes_in_doubt=deletes_in_doubt,
        )
        self._tasks: dict[asyncio.Task[Any], None] = {}
        """The term's tasks, in the order spawned (a dict, not a set: cancelled in an order
        that does not depend on where they sit in memory, so a seeded simulation replays)."""
        self.running = False
        self.fenced: Fenced | None = None
        """Set when another manager was found writing this store's step keys: nothing runs any more."""
        self.ctx = ManagerContext(store, settings, self, lease)
        self.span_attributes = _span_attributes(settings.state_store.url, lease)
        """What every procedure span of this term carries: store scheme, lease holder and epoch."""
        self.problems: list[LoadProblem] = []
        """What this term's recovery could not load."""
        self._recovery: asyncio.Task[None] | None = None
        self._housekeeping: asyncio.Task[None] | None = None

    def begin(self) -> None:
        """Start running: recovery begins in its own task (a lease's renewals go on meanwhile)."""
        self.running = True
        self._recovery = asyncio.get_running_loop().create_task(self._recover(), name="procstore:recovery")

    async def _recover(self) -> None:
        telemetry = self.settings.telemetry
        with telemetry.span("procstore.recovery", **self.span_attributes), timed() as elapsed:
            self.problems = await recover(self.ctx)
        telemetry.recovered(elapsed(), len(self.problems))
        self._housekeeping = asyncio.get_running_loop().create_task(self._keep_house(), name="procstore:gc")
        interval = self.settings.request_poll_interval
        self.spawn(watch_operator_requests(self.ctx, interval), name="procstore:requests")

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
        if not self.running:
            return
        self.running = False
        for task in (self._recovery, self._housekeeping):
            if task is not None:
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self._abandon_unfinished()

    def forget_finished(self) -> int:
        """Forget finished trees older than the metadata TTL; returns how many procedures."""
        return self.ctx.metas.remove_outdated(self.settings.metadata_ttl)

    # -- tasks -----------------------------------------------------------------------

    def run_in_term(
        self, coro: Coroutine[Any, Any, T], what: str, on_done: Callable[[], None] | None = None
    ) -> Coroutine[Any, Any, T]:
        """Start `coro` in a task of this term, which `end` cancels and waits for, and
        return what awaits it (`await term.run_in_term(...)`).

        For work started by a caller outside the term (a `submit`'s write): once the term has
        ended, none of it can still land; and a caller cancelled meanwhile leaves it to
        finish. `on_done` runs when the task ends, however it ends. The await raises
        `ManagerStopped` if the term ended it. Not a coroutine itself: each of thousands of
        concurrent submits would hold one more frame while its write is under way.
        """
        task = self.spawn(coro, f"procstore:{what}")
        if on_done is not None:
            task.add_done_callback(lambda _task: on_done())
        return await_term_task(task, what)

    def spawn(self, coro: Coroutine[Any, Any, T], name: str) -> asyncio.Task[T]:
        task = asyncio.get_running_loop().create_task(coro, name=name)
        self._tasks[task] = None
        task.add_done_callback(self._task_done)
        return task

    def _task_done(self, task: asyncio.Task[Any]) -> None:
        self._tasks.pop(task, None)
        if not task.cancelled() and (exc := task.exception()) is not None:
            # Only a BaseException gets here (the runner turns errors into FAILED): a
            # simulated crash or an interpreter exit. The task is simply gone, as in a kill.
            logger.debug("runner task %s ended by %r", task.get_name(), exc)

    def step_down(self, fenced: Fenced) -> None:
        """Another manager writes to this store: cancel every other runner (at its next await,
        before any further write) and wake their watchers. The caller stops by itself. Under
        a lease, the leadership decides what a fence means instead."""
        if self.ctx.lease is not None:
            self.ctx.lease.on_fenced(fenced)
            return
        if self.fenced is None:
            self.fenced = fenced
            logger.error("stepping down: %s", fenced)
        current = asyncio.current_task()
        for task in list(self._tasks):
            if task is not current:
                task.cancel()
        self._abandon_unfinished()

    def _abandon_unfinished(self) -> None:
        for meta in self.ctx.metas.values():
            if not meta.state.is_ended():
                meta.abandon()

    # -- housekeeping ---------------------------------------------------------------

    async def _keep_house(self) -> None:
        # A second walk of the whole store would double start()'s cost; temp files left by a
        # crashed writer are invisible to loading and can go a moment later.
        await self._remove_stale_temps()
        adopt_every = self.ctx.lease.adopt_interval if self.ctx.lease is not None else None
        interval = adopt_every if adopt_every is not None else self.settings.gc_interval
        unknown: set[ProcedureId] = set()
        next_gc = time.monotonic() + self.settings.gc_interval
        while True:
            await asyncio.sleep(interval)
            # Any error is logged and the loop goes on: if it died, procedures stored after
            # recovery would wait for the next takeover, silently.
            if adopt_every is not None:
                try:
                    unknown = await adopt_unknown(self.ctx, unknown, self.ctx.metas.submitting)
                except ProcedureError as e:
                    logger.warning("could not look for procedures stored after recovery: %s", e)
                except Exception:
                    logger.exception("looking for procedures stored after recovery failed; trying again")
            if time.monotonic() >= next_gc:
                next_gc += self.settings.gc_interval
                try:
                    if removed := self.forget_finished():
                        logger.debug("forgot %d finished procedures", removed)
                    if swept := await self.ctx.store.history.sweep():
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


def _span_attributes(url: str, lease: TermLease | None) -> dict[str, Any]:
    attributes: dict[str, Any] = {"procstore.store.backend": backend_of(url)}
    if lease is not None:
        if lease.fencing_token is not None:
            attributes["procstore.lease.epoch"] = lease.fencing_token
        attributes["procstore.lease.holder"] = lease.holder
    return attributes


async def await_term_task(task: asyncio.Task[T], what: str) -> T:
    """Await a task that the term owns (shielded: the caller's cancel does not reach it).

    Raises `ManagerStopped` when the term cancelled the task (a stop, a lost lease), the
    caller's own `CancelledError` when the caller was cancelled.
    """
    try:
        return await asyncio.shield(task)
    except asyncio.CancelledError:
        current = asyncio.current_task()
        if task.cancelled() and not (current is not None and current.cancelling()):
            raise ManagerStopped(what=what) from None
        raise


class SingleTerm:
    """A manager's terms without a lease: one, from `start()` to `stop()`.

    The same interface as `Leadership`: `start`, `stop` (as a kill would), `release`, `close`,
    `term` and `is_leading`.
    """

    __slots__ = ("deletes_in_doubt", "settings", "term")

    def __init__(self, settings: TermSettings, deletes_in_doubt: DeletesInDoubt | None = None) -> None:
        self.settings = settings
        self.deletes_in_doubt = deletes_in_doubt
        """The manager's: its terms share it (`ProcedureStore.deletes_in_doubt`)."""
        self.term: Term | None = None
        """The term, running or ended: its metadata stays readable after it ends."""

    @property
    def is_leading(self) -> bool:
        return self.term is not None and self.term.running

    async def start(self) -> None:
        """Begin the term and wait for its recovery."""
        self.term = Term(await obeying_the_store(self.settings), deletes_in_doubt=self.deletes_in_doubt)
        self.term.begin()
        await self.term.wait_recovered()

    async def stop(self) -> None:
        if self.term is not None:
            await self.term.end()

    async def release(self) -> None:
        """Nothing to release without a lease."""

    async def close(self) -> None:
        """Nothing of its own to close."""
