"""`ManagerContext`: what a term's runners share, each part with its owner, and the
`ContextProvider` procedures see."""

from __future__ import annotations

import time
from collections.abc import Callable
from contextlib import AbstractAsyncContextManager
from typing import TYPE_CHECKING

from procstore._runtime.activity import ActivityPublisher
from procstore._runtime.lock_table import LockTable
from procstore._runtime.operator import OperatorRequests
from procstore._runtime.recovery import StoredProcedures
from procstore._runtime.registry import Registry
from procstore._runtime.runner import is_stop
from procstore._runtime.waits import Waits
from procstore.errors import LoadFailed
from procstore.ids import ProcedureId
from procstore.lock_key import LockKey, StringKey
from procstore.procedure import Procedure
from procstore.state import ProcedureState
from procstore.store.keys import KeyType, ParsedKey
from procstore.store.message import ProcedureMessage
from procstore.store.procedure_store import LoadProblem, ProcedureStore

if TYPE_CHECKING:
    from procstore._runtime.meta import ProcedureMeta
    from procstore._runtime.term import Term, TermLease, TermSettings

Loader = Callable[[str], Procedure]


class ManagerContext:
    """The parts a term's runners share. Each part changes only through its own methods:

    - `metas` (`Registry`): the procedures this term knows, and the walks of their tree;
    - `locks` (`LockTable`): who holds and who waits for each lock key;
    - `requests` (`OperatorRequests`): the operator requests known to apply here;
    - `recovered` (`StoredProcedures`): the children recovery found, until claimed;
    - `waits` (`Waits`): the procedures parked on a durable timer or signal;
    - `term` (`Term`): the term's tasks, and stepping down;
    - `lease` (`TermLease`, None without a lease): the fencing token and write checks;
    - `activity` (`ActivityPublisher`): what its procedures do between steps, for operators.
    """

    __slots__ = (
        "activity", "lease", "locks", "metas", "recovered", "requests", "settings", "store", "term", "waits",
    )  # fmt: skip

    def __init__(
        self,
        store: ProcedureStore,
        settings: TermSettings,
        term: Term,
        lease: TermLease | None,
    ) -> None:
        self.store = store
        self.settings = settings
        self.term = term
        self.lease = lease
        self.recovered = StoredProcedures()
        self.metas = Registry(self.recovered.children_of, self._ended)
        self.locks = LockTable()
        self.waits = Waits(term.spawn, store.rate_starts)
        self.requests = OperatorRequests(store.requests, term.spawn, self.metas, self.waits.wake)
        self.activity = ActivityPublisher(store.activities, term.spawn, None if lease is None else lease.holder)

    def _ended(self, meta: ProcedureMeta) -> None:
        self.requests.looks.forget(meta.id)
        self.activity.ended(meta)
        started, ended = meta.record.start_time, meta.record.end_time
        seconds = None if started is None or ended is None else (ended - started).total_seconds()
        self.settings.telemetry.ended(meta.type_name, meta.outcome(), seconds)

    # -- ContextProvider -------------------------------------------------------------

    def procedure_state(self, procedure_id: ProcedureId) -> ProcedureState | None:
        meta = self.metas.get(procedure_id)
        return None if meta is None else meta.state

    async def wait_state_change(self, procedure_id: ProcedureId) -> ProcedureState | None:
        meta = self.metas.get(procedure_id)
        return None if meta is None else await meta.wait_state_change()

    def acquire_lock(self, key: StringKey) -> AbstractAsyncContextManager[None]:
        return self.locks.hold_in_step(key)

    # -- what the parts know together ------------------------------------------------

    def is_known(self, procedure_id: ProcedureId) -> bool:
        """Known to this term: never adopted as a stranger, nor submitted again. A procedure
        an operator's restart is working on counts (its metadata may be forgotten meanwhile)."""
        return procedure_id in self.metas or procedure_id in self.metas.restarting or procedure_id in self.recovered

    def keeps_inherited_keys(self) -> bool:
        """Whether an inherited tree's keys must stay for now: a paused former leader's late
        write could re-create a key deleted now (see `WrittenKeys.inherited`)."""
        return self.lease is not None and time.monotonic() < self.lease.keep_inherited_until

    def forget(self, procedure_id: ProcedureId) -> None:
        """Drop what this term knows of an ended procedure: it is about to run again (resumed
        or rewound) under the same id."""
        self.metas.forget(procedure_id)
        self.requests.forget(procedure_id)  # the ended run's, or inherited by it
        self.recovered.forget_ended(procedure_id)

    def on_tree_finished(self, ids: list[ProcedureId], metas: list[ProcedureMeta]) -> None:
        """Start the metadata TTL of a finished tree's runs (`metas`); forget the stored
        children and the operator requests it claimed, unless a later run of the id owns them."""
        ended = {meta.id: meta for meta in metas}
        for pid in ids:
            current = self.metas.get(pid)
            if current is not None and current is not ended.get(pid):
                continue  # restarted meanwhile: what is known of it now is the new run's
            self.recovered.forget_finished(pid)
            self.requests.forget(pid)
        self.metas.tree_finished(metas)

    # -- loading ---------------------------------------------------------------------

    def load_with_lock_key(
        self, procedure_id: ProcedureId, message: ProcedureMessage, key: str | ParsedKey | KeyType
    ) -> tuple[Procedure, LockKey]:
        """Rebuild a procedure from a stored message, and its lock key; raises `LoadFailed`
        saying why. The lock key is computed once: a `lock_key()` that fails on a second call
        must fail here, as a load problem, not later where nothing handles it.
        `key` is the message's, or its suffix (the key is then the one at `message.step`):
        it is formatted only for a problem, since recovery loads thousands."""

        def failed(reason: str, hint: str) -> LoadFailed:
            text = self.store.key(procedure_id, message.step, key) if isinstance(key, KeyType) else str(key)
            return LoadFailed(LoadProblem(text, procedure_id, reason, hint, message.type_name))

        loaders = self.settings.loaders
        loader = loaders.get(message.type_name)
        if loader is None:
            known = ", ".join(sorted(loaders)) or "none"
            raise failed(
                f"no loader is registered for type {message.type_name!r} (registered: {known})",
                "Register its loader with `manager.register(...)` before `start()`; the keys were left untouched",
            )
        failing = "its loader rejected the stored data"
        try:
            procedure = loader(message.data)
            failing = "its lock_key() failed on the stored data"
            lock_key = procedure.lock_key()  # a procedure whose lock keys cannot be computed cannot run
            if not isinstance(lock_key, LockKey):
                raise TypeError(f"lock_key() returned {lock_key!r}, not a LockKey")
        except BaseException as e:
            if is_stop(e):
                raise
            hint = "Fix the loader (old data must keep loading) or the stored value; the keys were left untouched"
            raise failed(f"{failing}: {type(e).__name__}: {e}", hint) from e
        return procedure, lock_key
