"""`Registry`: the metadata of every procedure a term knows, and the walks of its tree
(`procstore.store.tree`'s, the one walk of parent links)."""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager

from procstore._runtime.meta import ProcedureMeta
from procstore.ids import ProcedureId
from procstore.lock_key import NO_KEYS, LockKey
from procstore.procedure import Procedure
from procstore.state import ProcedureState, ProcedureStateKind
from procstore.store.tree import descendants, reachable

Edges = Callable[[ProcedureId], Iterable[ProcedureId]]


class Registry:
    """The metadata of a term's procedures by id, with the TTL of finished trees.

    `stored_children` is recovery's map of children found in the store (read, never
    written here): a tree is what runs in memory and what waits in the store.
    """

    __slots__ = (
        "_ended", "_finished_trees", "_metas", "_on_end", "_stored_children", "restarting", "submitting", "unfinished",
    )  # fmt: skip

    def __init__(
        self, stored_children: Mapping[ProcedureId, list[ProcedureId]], on_end: Callable[[ProcedureMeta], None]
    ) -> None:
        self._metas: dict[ProcedureId, ProcedureMeta] = {}
        self._stored_children = stored_children
        self._on_end = on_end
        self._ended = self._meta_ended  # one bound method for every meta, not one each
        self._finished_trees: deque[tuple[float, list[ProcedureMeta]]] = deque()
        """Finished trees' metadata, by end time, for the TTL: each entry names the runs that
        ended, so forgetting one never removes a later run of the same id."""
        self.unfinished = 0
        """Registered procedures that have not ended: counted against `max_running_procedures`."""
        self.restarting: set[ProcedureId] = set()
        """Procedures an operator's resume or rewind is restarting now: one at a time each
        (see `restarting_now`)."""
        self.submitting: set[ProcedureId] = set()
        """The ids of submits whose first write is under way: never taken for strangers, and
        counted against `max_running_procedures` until registered (see `submit_begins`)."""

    def get(self, procedure_id: ProcedureId) -> ProcedureMeta | None:
        return self._metas.get(procedure_id)

    def __getitem__(self, procedure_id: ProcedureId) -> ProcedureMeta:
        return self._metas[procedure_id]

    def __contains__(self, procedure_id: object) -> bool:
        return procedure_id in self._metas

    def values(self) -> Iterable[ProcedureMeta]:
        return self._metas.values()

    def register(
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
        to this term, or forgotten). `lock_key` is the procedure's, when the caller has
        computed it already."""
        if lock_key is None:
            lock_key = procedure.lock_key() if procedure is not None else NO_KEYS
        if procedure_id in self._metas:
            raise AssertionError(f"procedure {procedure_id} registered twice")
        # Counted by both, a submitted procedure would count twice against `max_running_procedures`.
        self.submitting.discard(procedure_id)
        meta = ProcedureMeta(procedure_id, type_name, parent_id, lock_key, state, self._ended, run)
        self._metas[procedure_id] = meta
        if not state.is_ended():
            self.unfinished += 1
        return meta

    def _meta_ended(self, meta: ProcedureMeta) -> None:
        if meta.id in self._metas:
            self.unfinished -= 1
        self._on_end(meta)

    def register_poisoned(self, parent_id: ProcedureId, child_id: ProcedureId, type_name: str, reason: str) -> None:
        """Register a child that cannot run as POISONED (its parent sees it ended); its keys are kept."""
        state = ProcedureState.with_error(
            ProcedureStateKind.POISONED, f"subprocedure {child_id} cannot run: {reason}; its keys were kept"
        )
        self.register(child_id, type_name, parent_id, None, state).keys.keep = True

    def forget(self, procedure_id: ProcedureId) -> None:
        """Drop an ended run's metadata: the id is about to run again. The old metadata stays
        in its tree's TTL entry, which then removes nothing (it is no longer the id's)."""
        self._metas.pop(procedure_id, None)

    def submit_begins(self, procedure_id: ProcedureId) -> None:
        self.submitting.add(procedure_id)

    def submit_ended(self, procedure_id: ProcedureId) -> None:
        """However the submit ended: registered, refused, or cancelled with its term."""
        self.submitting.discard(procedure_id)

    @contextmanager
    def restarting_now(self, procedure_id: ProcedureId) -> Iterator[None]:
        """Mark `procedure_id` as being restarted for the block (known, never adopted)."""
        self.restarting.add(procedure_id)
        try:
            yield
        finally:
            self.restarting.discard(procedure_id)

    # -- the graph -------------------------------------------------------------------

    def children(self, procedure_id: ProcedureId) -> list[ProcedureId]:
        """Its children in memory, then those only in the store."""
        meta = self._metas.get(procedure_id)
        stored = self._stored_children.get(procedure_id, ())
        return [*(meta.children if meta is not None else ()), *stored]

    def unfinished_children(self, procedure_id: ProcedureId) -> list[ProcedureId]:
        """The children it waits for: registered and not ended."""
        meta = self._metas.get(procedure_id)
        if meta is None:
            return []
        return [c for c in meta.children if (m := self._metas.get(c)) is not None and not m.state.is_ended()]

    def tree_ids(self, root: ProcedureId) -> list[ProcedureId]:
        """The root and every descendant, in memory or only in the store, root first."""
        return reachable(root, self.children)

    def descendants(self, procedure_id: ProcedureId) -> list[ProcedureId]:
        return descendants(procedure_id, self.children)

    def ancestors(self, meta: ProcedureMeta) -> list[ProcedureMeta]:
        out: list[ProcedureMeta] = []
        parent_id = meta.parent_id
        while parent_id is not None and (parent := self._metas.get(parent_id)) is not None:
            out.append(parent)
            parent_id = parent.parent_id
        return out

    def child_cycle(self, parent: ProcedureId, children: Sequence[ProcedureId]) -> ProcedureId | None:
        """The first of `children` that is `parent` itself or waits for it through its own
        unfinished subprocedures (an ancestor, say): waiting for it would never end."""
        for child in children:
            if parent in reachable(child, self._waits_for_children):
                return child
        return None

    def _waits_for_children(self, procedure_id: ProcedureId) -> list[ProcedureId]:
        meta = self._metas.get(procedure_id)
        return [] if meta is None or meta.state.is_ended() else list(meta.children)

    # -- the TTL ---------------------------------------------------------------------

    def tree_metas(self, ids: list[ProcedureId]) -> list[ProcedureMeta]:
        """The metadata of the runs `ids` name now (captured when a tree ends: a later run of
        one of these ids gets metadata of its own)."""
        return [meta for pid in ids if (meta := self._metas.get(pid)) is not None]

    def tree_finished(self, metas: list[ProcedureMeta]) -> None:
        """Start the metadata TTL of a finished tree's runs."""
        self._finished_trees.append((time.monotonic(), metas))

    def remove_outdated(self, ttl: float, now: float | None = None) -> int:
        """Forget finished runs that ended more than `ttl` seconds ago; returns how many."""
        now = time.monotonic() if now is None else now
        removed = 0
        while self._finished_trees and now - self._finished_trees[0][0] > ttl:
            _, metas = self._finished_trees.popleft()
            for meta in metas:
                if self._metas.get(meta.id) is meta:
                    del self._metas[meta.id]
                    removed += 1
        return removed
