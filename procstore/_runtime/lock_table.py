"""`LockTable`: which procedure holds or waits for which lock key, and the cycles of waits."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from contextlib import AbstractAsyncContextManager

from procstore._runtime.locks import KeyRwLock
from procstore._runtime.registry import Edges
from procstore.ids import ProcedureId
from procstore.lock_key import StringKey
from procstore.store.tree import reachable


class LockTable:
    """The procedures' lock keys (`KeyRwLock`), with who holds and who waits for each key;
    and the locks procedures take inside a step (`Context.acquire_lock`), apart."""

    __slots__ = ("_holders", "_locks", "_step_locks", "_waits")

    def __init__(self) -> None:
        self._locks = KeyRwLock()
        self._step_locks = KeyRwLock()
        self._holders: dict[str, set[ProcedureId]] = {}
        """Who holds each lock key, for finding cycles of waits."""
        self._waits: dict[ProcedureId, str] = {}
        """The lock key each procedure is waiting for, if it is waiting for one."""

    async def acquire(self, pid: ProcedureId, key: StringKey, unless: asyncio.Event | None) -> bool:
        """Take `key` for `pid`, unless `unless` is set first (an operator's request ends the
        wait): False then, with nothing taken."""
        self._waits[pid] = key.key
        try:
            if unless is None:
                await self._locks.acquire(key)
                acquired = True
            else:
                acquired = await self._locks.acquire_unless(key, unless)
        finally:
            del self._waits[pid]
        if acquired:
            self._holders.setdefault(key.key, set()).add(pid)
        return acquired

    def take_all_now(self, pid: ProcedureId, keys: Sequence[StringKey]) -> bool:
        """Take every key for `pid` if none would block (else none); see `KeyRwLock.acquire_all_now`."""
        if not keys:
            return True
        if not self._locks.acquire_all_now(keys):
            return False
        for held in keys:
            self._holders.setdefault(held.key, set()).add(pid)
        return True

    def release(self, pid: ProcedureId, key: StringKey) -> None:
        self._locks.release(key)
        self._holders.get(key.key, set()).discard(pid)

    def holders_of(self, key: StringKey) -> set[ProcedureId]:
        return set(self._holders.get(key.key, ()))

    def would_block(self, key: StringKey) -> bool:
        return self._locks.would_block(key)

    def hold_in_step(self, key: StringKey) -> AbstractAsyncContextManager[None]:
        return self._step_locks.hold(key)

    def cycle(self, waiter: ProcedureId, key: StringKey, children: Edges) -> list[ProcedureId] | None:
        """The procedures `waiter` would wait for in a cycle back to itself, if it waited for
        `key` now; None if there is no such cycle.

        A procedure waits for the holders of the key it waits for (and for those queued
        before it), and a parent for its unfinished subprocedures (`children`): it holds its
        locks while they run.
        """

        came_from: dict[ProcedureId, ProcedureId] = {}
        """Each procedure reached, and the first it was reached from (breadth first)."""

        def waited_for(pid: ProcedureId) -> list[ProcedureId]:
            if pid == waiter:
                nexts = list(self._waited_for(key.key, waiter))
            else:
                waits = self._waited_for(self._waits[pid], pid) if pid in self._waits else set()
                nexts = [*waits, *children(pid)]
            for nxt in nexts:
                came_from.setdefault(nxt, pid)
            return nexts

        reachable(waiter, waited_for)
        if waiter not in came_from:
            return None
        cycle: list[ProcedureId] = []
        at = came_from[waiter]
        while at != waiter:
            cycle.append(at)
            at = came_from[at]
        return cycle[::-1]

    def _waited_for(self, key: str, waiter: ProcedureId) -> set[ProcedureId]:
        queued = {pid for pid, waited in self._waits.items() if waited == key and pid != waiter}
        return (self._holders.get(key, set()) | queued) - {waiter}
