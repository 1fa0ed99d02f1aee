"""`KeyRwLock`: reader/writer locks by string key, granted first come, first served."""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field

from procstore.lock_key import StringKey


@dataclass(slots=True)
class _Entry:
    readers: int = 0
    writer: bool = False
    waiters: deque[tuple[bool, asyncio.Future[None]]] = field(default_factory=deque)

    def can_grant(self, exclusive: bool) -> bool:
        if exclusive:
            return not self.writer and self.readers == 0
        return not self.writer

    def grant(self, exclusive: bool) -> None:
        if exclusive:
            self.writer = True
        else:
            self.readers += 1

    @property
    def idle(self) -> bool:
        return not self.writer and self.readers == 0 and not self.waiters


class KeyRwLock:
    """Shared/exclusive locks on string keys.

    Waiters are served in arrival order: a shared request behind a waiting exclusive one
    waits too, so writers are not starved. Entries are dropped once nobody holds or waits.
    """

    def __init__(self) -> None:
        self._entries: dict[str, _Entry] = {}

    def _entry(self, name: str) -> _Entry:
        entry = self._entries.get(name)
        if entry is None:
            entry = self._entries[name] = _Entry()
        return entry

    async def acquire(self, key: StringKey) -> None:
        """Wait until `key` is held in its mode. Cancellation while waiting takes nothing."""
        exclusive = key.is_exclusive
        entry = self._entry(key.key)
        if not entry.waiters and entry.can_grant(exclusive):
            entry.grant(exclusive)
            return
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        item = (exclusive, waiter)
        entry.waiters.append(item)
        try:
            await waiter
        except asyncio.CancelledError:
            if waiter.done() and not waiter.cancelled():
                self.release(key)  # granted in the same tick we were cancelled
            elif item in entry.waiters:
                entry.waiters.remove(item)
                self._wake(key.key, entry)  # we may have been the head blocking others
            raise

    def acquire_all_now(self, keys: Sequence[StringKey]) -> bool:
        """Take every key at once if none would block (nothing taken otherwise): for a
        procedure that held its locks when its process died, so that it holds them again
        before any procedure queued behind it wakes up."""
        if any(self.would_block(key) for key in keys) or len({key.key for key in keys}) < len(keys):
            return False
        for key in keys:
            self._entry(key.key).grant(key.is_exclusive)
        return True

    async def acquire_unless(self, key: StringKey, event: asyncio.Event) -> bool:
        """`acquire(key)`, unless `event` is set before it is granted: then nothing is taken
        and the result is False."""
        if event.is_set():
            return False
        if not self.would_block(key):
            await self.acquire(key)
            return True
        locking = asyncio.ensure_future(self.acquire(key))
        woken = asyncio.ensure_future(event.wait())

        def settle() -> bool:
            """Whether the lock is held now (the cancelled acquire took nothing)."""
            return locking.done() and not locking.cancelled() and locking.exception() is None

        waited = False
        try:
            await asyncio.wait((locking, woken), return_when=asyncio.FIRST_COMPLETED)
            waited = True
        finally:
            for task in (locking, woken):
                task.cancel()
            await asyncio.gather(locking, woken, return_exceptions=True)
            # A grant that came with the event, or while this wait was being cancelled, is
            # given back: the caller will not release what it does not know it holds.
            if settle() and (event.is_set() or not waited):
                self.release(key)
        return settle() and not event.is_set()

    def would_block(self, key: StringKey) -> bool:
        """Whether `acquire(key)` would wait now (held in a conflicting mode, or queued)."""
        entry = self._entries.get(key.key)
        return entry is not None and (bool(entry.waiters) or not entry.can_grant(key.is_exclusive))

    def release(self, key: StringKey) -> None:
        entry = self._entries[key.key]
        if key.is_exclusive:
            entry.writer = False
        else:
            entry.readers -= 1
        self._wake(key.key, entry)

    def _wake(self, name: str, entry: _Entry) -> None:
        while entry.waiters:
            exclusive, waiter = entry.waiters[0]
            if waiter.done():  # cancelled while queued: its task will not take the lock
                entry.waiters.popleft()
                continue
            if not entry.can_grant(exclusive):
                break
            entry.waiters.popleft()
            entry.grant(exclusive)
            waiter.set_result(None)
        if entry.idle and self._entries.get(name) is entry:
            del self._entries[name]

    @asynccontextmanager
    async def hold(self, key: StringKey) -> AsyncIterator[None]:
        """`async with lock.hold(key):` holds `key` for the body."""
        await self.acquire(key)
        try:
            yield
        finally:
            self.release(key)

    def __len__(self) -> int:
        """How many keys are held or waited on."""
        return len(self._entries)
