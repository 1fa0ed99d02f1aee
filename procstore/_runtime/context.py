"""`ManagerContext`: the state a manager's runners share, and the `ContextProvider` they see."""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import AsyncIterator, Callable, Coroutine, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any, TypeVar

from procstore._logs import get_logger
from procstore._runtime.locks import KeyRwLock
from procstore._runtime.looks import RequestLooks
from procstore._runtime.meta import ProcedureMeta
from procstore._runtime.outcome import is_stop
from procstore._runtime.retry import RetryPolicy
from procstore._runtime.telemetry import OFF, Telemetry
from procstore.errors import Fenced, ManagerStopped, ProcedureError
from procstore.ids import ProcedureId
from procstore.lock_key import NO_KEYS, LockKey, StringKey
from procstore.procedure import Procedure
from procstore.state import ProcedureState
from procstore.store.history import HistoryStore
from procstore.store.keys import KeyType, ParsedKey
from procstore.store.message import ProcedureMessage
from procstore.store.procedure_store import LoadProblem, ProcedureStore
from procstore.store.requests import OperatorRequest, OperatorRequested
from procstore.store.tree import descendants, reachable

logger = get_logger("procstore.runtime")

Loader = Callable[[str], Procedure]
T = TypeVar("T")


class LoadFailed(ProcedureError):
    """A stored procedure could not be rebuilt; `problem` says where and what to do."""

    def __init__(self, problem: LoadProblem) -> None:
        self.problem = problem
        super().__init__(str(problem))


@dataclass(slots=True)
class StoredProcedures:
    """Subprocedures found at recovery, kept until their parent claims them.

    Only roots are resubmitted at start; a parent's stored children resume when the parent
    runs again (or when it re-submits their ids).
    """

    messages: dict[ProcedureId, tuple[ProcedureMessage, bool]] = field(default_factory=dict)
    """Unfinished children: their latest message and whether they were rolling back."""
    committed: dict[ProcedureId, str] = field(default_factory=dict)
    """Finished children of unfinished parents, with their type names ("" if unknown)."""
    committed_runs: dict[ProcedureId, int] = field(default_factory=dict)
    """The run of each finished child in `committed` (its history record's)."""
    rolled_back: dict[ProcedureId, str] = field(default_factory=dict)
    """The finished children in `committed` that failed and rolled back, with their errors:
    the parent sees them FAILED, and their rollback never runs again."""
    children_of: dict[ProcedureId, list[ProcedureId]] = field(default_factory=dict)
    unreadable: dict[ProcedureId, LoadProblem] = field(default_factory=dict)

    def add_child(self, parent_id: ProcedureId, child_id: ProcedureId) -> None:
        self.children_of.setdefault(parent_id, []).append(child_id)

    def descendants(self, procedure_id: ProcedureId) -> list[ProcedureId]:
        return descendants(procedure_id, lambda pid: self.children_of.get(pid, ()))


class ManagerContext:
    """Everything runners share: the store, metadata, locks, loaders and their tasks."""

    def __init__(
        self,
        store: ProcedureStore,
        policy: RetryPolicy,
        loaders: dict[str, Loader],
        *,
        on_fenced: Callable[[Fenced], None] | None = None,
        lease_check: Callable[[str], None] | None = None,
        fencing_token: int | None = None,
        inherited_deletes_after: float = 0.0,
        history: HistoryStore,
        keep_failed: bool = False,
        telemetry: Telemetry = OFF,
        span_attributes: dict[str, Any] | None = None,
    ) -> None:
        self.store = store
        self.policy = policy
        self.loaders = loaders
        self.metas: dict[ProcedureId, ProcedureMeta] = {}
        self.locks = KeyRwLock()
        self.dynamic_locks = KeyRwLock()
        self.stored = StoredProcedures()
        self.running = False
        self.unfinished = 0
        self._tasks: set[asyncio.Task[Any]] = set()
        self.fenced: Fenced | None = None
        """Set when another manager was found writing this store's step keys: nothing runs any more."""
        self.inherited_deletes_after = inherited_deletes_after
        """`time.monotonic()` before which an inherited tree's keys are not deleted (see
        `ProcedureMeta.inherited`); 0 without a lease."""
        self.on_fenced = on_fenced
        """Replaces `step_down`'s own handling: a manager with a lease decides what a fence means."""
        self.fencing_token = fencing_token
        """The lease epoch of this term (None without a lease): `Context.fencing_token`."""
        self.lease_check = lease_check
        """Raises `LeaseExpired` once this term may no longer write: `Context.check_lease`."""
        self._finished_trees: deque[tuple[float, list[ProcedureMeta]]] = deque()
        """Finished trees' metadata, by end time, for the TTL: each entry names the runs that
        ended, so forgetting one never removes a later run of the same id."""
        self.lock_holders: dict[str, set[ProcedureId]] = {}
        """Who holds each lock key (of `locks`), for finding cycles of waits."""
        self.lock_waits: dict[ProcedureId, str] = {}
        """The lock key each procedure is waiting for, if it is waiting for one."""
        self.history = history
        """Where each ended run's end record (its history record) is written."""
        self.keep_failed = keep_failed
        self.telemetry = telemetry
        self.span_attributes = span_attributes or {}
        """What every procedure span of this term carries: store scheme, lease holder and epoch."""
        self.restarting: set[ProcedureId] = set()
        """Procedures an operator's resume or rewind is restarting now: one at a time each."""
        """A root that ends FAILED keeps its keys, for an operator to resume or rewind it."""
        self.request_looks = RequestLooks(store.requests, self.spawn)
        self._on_end_callback = self._on_end  # one bound method for every meta, not one each
        self.operator_requests: dict[ProcedureId, OperatorRequest] = {}
        """Requests known to apply to procedures of this term: read from the store, or passed
        down from an ancestor's. A runner checks here, then the store, before every attempt."""
        self.submit_wakes: dict[ProcedureId, asyncio.Event] = {}
        """For each submit whose first write is under way: set by a request for its id, which
        ends that write's backoff (see `request_wakes`)."""

    async def raise_if_requested(self, procedure_id: ProcedureId) -> None:
        """Before every attempt: an operator's request (`cancel`, `fail`) ends the execution;
        read from the store when not known here, so that one written since is seen in time."""
        request = self.operator_requests.get(procedure_id)
        if request is None:
            request = await self.request_looks.get(procedure_id)
            if request is not None:
                self.note_request(procedure_id, request)
        if request is not None:
            raise OperatorRequested(request)

    def lock_cycle(self, waiter: ProcedureId, key: StringKey) -> list[ProcedureId] | None:
        """The procedures `waiter` would wait for in a cycle back to itself, if it waited for
        `key` now; None if there is no such cycle.

        A procedure waits for the holders of the key it waits for (and for those queued
        before it), and a parent for its unfinished subprocedures: it holds its locks while
        they run.
        """
        came_from: dict[ProcedureId, ProcedureId | None] = {}
        queue: deque[ProcedureId] = deque()
        for first in self._waited_for(key.key, waiter):
            came_from.setdefault(first, None)
            queue.append(first)
        while queue:
            pid = queue.popleft()
            if pid == waiter:
                cycle = []
                at: ProcedureId | None = came_from[pid]
                while at is not None:
                    cycle.append(at)
                    at = came_from[at]
                return cycle[::-1]
            meta = self.metas.get(pid)
            nexts = list(self._waited_for(self.lock_waits[pid], pid)) if pid in self.lock_waits else []
            if meta is not None:
                nexts += [c for c in meta.children if (m := self.metas.get(c)) is not None and not m.state.is_ended()]
            for nxt in nexts:
                if nxt not in came_from:
                    came_from[nxt] = pid
                    queue.append(nxt)
        return None

    def _waited_for(self, key: str, waiter: ProcedureId) -> set[ProcedureId]:
        queued = {pid for pid, waited in self.lock_waits.items() if waited == key and pid != waiter}
        return (self.lock_holders.get(key, set()) | queued) - {waiter}

    def note_request(self, procedure_id: ProcedureId, request: OperatorRequest) -> None:
        """Apply an operator request to a procedure and its unfinished descendants."""
        self.operator_requests.setdefault(procedure_id, request)
        if (meta := self.metas.get(procedure_id)) is not None:
            meta.requested().set()
        elif (submitting := self.submit_wakes.get(procedure_id)) is not None:
            submitting.set()
        inherited = OperatorRequest(
            kind=request.kind,
            reason=f"its ancestor {procedure_id} was {'cancelled' if request.kind == 'cancel' else 'failed'}: "
            f"{request.reason}",
            requested_at=request.requested_at,
            requested_by=request.requested_by,
        )
        for child in descendants(procedure_id, self._children):
            meta = self.metas.get(child)
            if meta is None or not meta.state.is_ended():
                self.operator_requests.setdefault(child, inherited)
                if meta is not None:
                    meta.requested().set()

    def _children(self, procedure_id: ProcedureId) -> list[ProcedureId]:
        """Its children, in memory or only in the store."""
        meta = self.metas.get(procedure_id)
        return [*(meta.children if meta is not None else ()), *self.stored.children_of.get(procedure_id, ())]

    # -- ContextProvider -------------------------------------------------------------

    def procedure_state(self, procedure_id: ProcedureId) -> ProcedureState | None:
        meta = self.metas.get(procedure_id)
        return None if meta is None else meta.state

    async def wait_state_change(self, procedure_id: ProcedureId) -> ProcedureState | None:
        meta = self.metas.get(procedure_id)
        return None if meta is None else await meta.wait_state_change()

    @asynccontextmanager
    async def acquire_lock(self, key: StringKey) -> AsyncIterator[None]:
        async with self.dynamic_locks.hold(key):
            yield

    # -- metadata --------------------------------------------------------------------

    def new_meta(
        self,
        procedure_id: ProcedureId,
        type_name: str,
        parent_id: ProcedureId | None,
        procedure: Procedure | None,
        state: ProcedureState,
        lock_key: LockKey | None = None,
        run: int = 1,
    ) -> ProcedureMeta:
        """Create and register the metadata of run `run` of a procedure (the id must be new
        to this term, or forgotten).

        `lock_key` is the procedure's, when the caller has computed it already."""
        if lock_key is None:
            lock_key = procedure.lock_key() if procedure is not None else NO_KEYS
        meta = ProcedureMeta(procedure_id, type_name, parent_id, lock_key, state, self._on_end_callback, run)
        if procedure_id in self.metas:
            raise AssertionError(f"procedure {procedure_id} registered twice")
        self.metas[procedure_id] = meta
        if not state.is_ended():
            self.unfinished += 1
        return meta

    def _on_end(self, meta: ProcedureMeta) -> None:
        self.request_looks.forget(meta.id)
        if meta.id in self.metas:
            self.unfinished -= 1
        started = meta.start_time
        seconds = None if started is None or meta.end_time is None else (meta.end_time - started).total_seconds()
        self.telemetry.ended(meta.type_name, meta.outcome(), seconds)

    def is_known(self, procedure_id: ProcedureId) -> bool:
        """Known to this term: never adopted as a stranger, nor submitted again. A procedure
        an operator's restart is working on counts (its metadata may be forgotten meanwhile)."""
        return (
            procedure_id in self.metas
            or procedure_id in self.restarting
            or procedure_id in self.stored.messages
            or procedure_id in self.stored.committed
            or procedure_id in self.stored.unreadable
        )

    def ancestors(self, meta: ProcedureMeta) -> list[ProcedureMeta]:
        out: list[ProcedureMeta] = []
        parent_id = meta.parent_id
        while parent_id is not None and (parent := self.metas.get(parent_id)) is not None:
            out.append(parent)
            parent_id = parent.parent_id
        return out

    def child_cycle(self, parent: ProcedureId, children: Sequence[ProcedureId]) -> ProcedureId | None:
        """The first of `children` that is `parent` itself or waits for it through its own
        unfinished subprocedures (an ancestor, say): waiting for it would never end."""

        def waits_for(pid: ProcedureId) -> Sequence[ProcedureId]:
            meta = self.metas.get(pid)
            return [] if meta is None or meta.state.is_ended() else meta.children

        return next((child for child in children if parent in reachable(child, waits_for)), None)

    def tree_ids(self, root: ProcedureMeta) -> list[ProcedureId]:
        """The root and every descendant, in memory or only in the store, root first."""
        return reachable(root.id, self._children)

    def tree_metas(self, ids: list[ProcedureId]) -> list[ProcedureMeta]:
        """The metadata of the runs `ids` name now (captured when a tree ends: a later run of
        one of these ids gets metadata of its own)."""
        return [meta for pid in ids if (meta := self.metas.get(pid)) is not None]

    def on_tree_finished(self, ids: list[ProcedureId], metas: list[ProcedureMeta]) -> None:
        """Start the metadata TTL of a finished tree's runs (`metas`); forget the stored
        children and the operator requests it claimed, unless a later run of the id owns them."""
        for pid in ids:
            current = self.metas.get(pid)
            if current is not None and current not in metas:
                continue  # restarted meanwhile: what is known of it now is the new run's
            self.stored.messages.pop(pid, None)
            self.stored.committed.pop(pid, None)
            self.stored.committed_runs.pop(pid, None)
            self.stored.rolled_back.pop(pid, None)
            self.stored.children_of.pop(pid, None)
            self.operator_requests.pop(pid, None)
        self._finished_trees.append((time.monotonic(), metas))

    def forget(self, procedure_id: ProcedureId) -> None:
        """Drop what this term knows of an ended procedure: it is about to run again (resumed
        or rewound) under the same id. Its old metadata stays in its tree's TTL entry, which
        then removes nothing (it is no longer the id's)."""
        self.metas.pop(procedure_id, None)
        self.operator_requests.pop(procedure_id, None)  # the ended run's, or inherited by it
        for table in (self.stored.unreadable, self.stored.committed, self.stored.rolled_back):
            table.pop(procedure_id, None)
        self.stored.committed_runs.pop(procedure_id, None)

    def remove_outdated_metadata(self, ttl: float, now: float | None = None) -> int:
        """Forget finished runs that ended more than `ttl` seconds ago; returns how many."""
        now = time.monotonic() if now is None else now
        removed = 0
        while self._finished_trees and now - self._finished_trees[0][0] > ttl:
            _, metas = self._finished_trees.popleft()
            for meta in metas:
                if self.metas.get(meta.id) is meta:
                    del self.metas[meta.id]
                    removed += 1
        return removed

    # -- loading ---------------------------------------------------------------------

    def load(self, procedure_id: ProcedureId, message: ProcedureMessage, key: str | ParsedKey) -> Procedure:
        """Rebuild a procedure from a stored message; raises `LoadFailed` saying why."""
        return self.load_with_lock_key(procedure_id, message, key)[0]

    def load_with_lock_key(
        self, procedure_id: ProcedureId, message: ProcedureMessage, key: str | ParsedKey | KeyType
    ) -> tuple[Procedure, LockKey]:
        """`load`, and the procedure's lock key, computed once: a `lock_key()` that fails on a
        second call must fail here, as a load problem, not later where nothing handles it.
        `key` is the message's, or its suffix (the key is then the one at `message.step`):
        it is formatted only for a problem, since recovery loads thousands."""

        def failed(reason: str, hint: str) -> LoadFailed:
            text = self.store.key(procedure_id, message.step, key) if isinstance(key, KeyType) else str(key)
            return LoadFailed(LoadProblem(text, procedure_id, reason, hint, message.type_name))

        loader = self.loaders.get(message.type_name)
        if loader is None:
            known = ", ".join(sorted(self.loaders)) or "none"
            raise failed(
                f"no loader is registered for type {message.type_name!r} (registered: {known})",
                "Register its loader with `manager.register(...)` before `start()`; the keys were left untouched",
            )
        hint = "Fix the loader (old data must keep loading) or the stored value; the keys were left untouched"
        try:
            procedure = loader(message.data)
        except BaseException as e:
            if is_stop(e):
                raise
            raise failed(f"its loader rejected the stored data: {type(e).__name__}: {e}", hint) from e
        try:
            lock_key = procedure.lock_key()  # a procedure whose lock keys cannot be computed cannot run
            if not isinstance(lock_key, LockKey):
                raise TypeError(f"lock_key() returned {lock_key!r}, not a LockKey")
        except BaseException as e:
            if is_stop(e):
                raise
            raise failed(f"its lock_key() failed on the stored data: {type(e).__name__}: {e}", hint) from e
        return procedure, lock_key

    # -- tasks -----------------------------------------------------------------------

    def run_in_term(
        self, coro: Coroutine[Any, Any, T], what: str, on_done: Callable[[], None] | None = None
    ) -> Coroutine[Any, Any, T]:
        """Start `coro` in a task of this term, which `cancel_all` cancels and waits for, and
        return what awaits it (`await ctx.run_in_term(...)`).

        For work started by a caller outside the term (a `submit`'s write): once the term has
        ended, none of it can still land; and a caller cancelled meanwhile leaves it to
        finish. `on_done` runs when the task ends, however it ends. The await raises
        `ManagerStopped` if the term ended it. Not a coroutine itself: each of thousands of
        concurrent submits would hold one more frame while its write is under way.
        """
        task = asyncio.get_running_loop().create_task(coro, name=f"procstore:{what}")
        self._tasks.add(task)
        task.add_done_callback(self._task_done)
        if on_done is not None:
            task.add_done_callback(lambda _task: on_done())
        return await_term_task(task, what)

    def spawn(self, coro: Coroutine[Any, Any, None], name: str) -> asyncio.Task[None]:
        task = asyncio.get_running_loop().create_task(coro, name=name)
        self._tasks.add(task)
        task.add_done_callback(self._task_done)
        return task

    def _task_done(self, task: asyncio.Task[Any]) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and (exc := task.exception()) is not None:
            # Only a BaseException gets here (the runner turns errors into FAILED): a
            # simulated crash or an interpreter exit. The task is simply gone, as in a kill.
            logger.debug("runner task %s ended by %r", task.get_name(), exc)

    def step_down(self, fenced: Fenced) -> None:
        """Another manager writes to this store: cancel every other runner (at its next await,
        before any further write) and wake their watchers. The caller stops by itself."""
        if self.on_fenced is not None:
            self.on_fenced(fenced)
            return
        if self.fenced is None:
            self.fenced = fenced
            logger.error("stepping down: %s", fenced)
        current = asyncio.current_task()
        for task in list(self._tasks):
            if task is not current:
                task.cancel()
        for meta in self.metas.values():
            if not meta.state.is_ended():
                meta.abandon()

    async def cancel_all(self) -> None:
        """Cancel every runner and wait until each has stopped."""
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.gather(*tasks, return_exceptions=True)
        for meta in self.metas.values():
            if not meta.state.is_ended():
                meta.abandon()


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
