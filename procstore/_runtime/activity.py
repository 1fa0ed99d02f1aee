"""Publishing what a term's procedures do between their steps (`procstore.store.activity`).

A runner tells the publisher when its procedure begins to back off, to wait on a lock or
on its children, and when it runs a step again after one of those. The publisher keeps the
latest activity of each procedure and one task writes them, at most once per `INTERVAL`:
a procedure retrying in a tight loop makes one write a second, not one per retry (so a
manager writes at most one activity per procedure a second), and one that only steps makes
none. A write that fails is dropped (the next transition writes again): an activity is a
view, never a fact the runtime reads back.
"""

from __future__ import annotations

import asyncio
import contextvars
import os
import socket
import time
from collections.abc import Callable, Coroutine
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from procstore._logs import get_logger
from procstore.errors import describe
from procstore.ids import ProcedureId
from procstore.store.activity import ERROR_TEXT_LIMIT, RETRIES_KEPT, Activity, ActivityStore, Doing, Retry

if TYPE_CHECKING:
    from procstore._runtime.meta import ProcedureMeta

logger = get_logger("procstore.runtime")

INTERVAL = 1.0
"""Seconds between two writes of the publisher: the most a procedure's activity lags."""


Spawn = Callable[[Coroutine[Any, Any, None], str], asyncio.Task[None]]


def _iso(seconds: float) -> str:
    return datetime.fromtimestamp(seconds, UTC).isoformat().replace("+00:00", "Z")


class ActivityPublisher:
    """The latest activity of each procedure of a term, written by one task."""

    __slots__ = ("_flusher", "_gone", "_manager", "_pending", "_retries", "_shown", "_spawn", "_store")

    def __init__(self, store: ActivityStore, spawn: Spawn, manager: str | None) -> None:
        self._store = store
        self._spawn = spawn
        self._manager = manager or f"{socket.gethostname()}:{os.getpid()}"
        self._pending: dict[ProcedureId, Activity] = {}
        """Activities to write at the next flush, the latest of each procedure."""
        self._shown: set[ProcedureId] = set()
        """Procedures with an activity written (or being written): deleted once they end."""
        self._gone: dict[ProcedureId, None] = {}
        """Ended procedures whose activity the next flush deletes (after any write of it), in
        the order they ended (a dict: one deletion names them alike at every replay of a seed)."""
        self._retries: dict[ProcedureId, list[Retry]] = {}
        self._flusher: asyncio.Task[None] | None = None

    def backing_off(self, meta: ProcedureMeta, step: int, attempt: int, error: BaseException, delay: float) -> None:
        now = time.time()
        text = describe(error)[:ERROR_TEXT_LIMIT]
        retries = self._retries.setdefault(meta.id, [])
        retries.append(Retry(at=_iso(now), attempt=attempt, error=text))
        del retries[:-RETRIES_KEPT]
        self._publish(meta, "backing off", step, attempt=attempt, last_error=text, next_try=_iso(now + delay))

    def waiting_on_lock(self, meta: ProcedureMeta, step: int, lock: str, held_by: list[str]) -> None:
        self._publish(meta, "waiting on a lock", step, lock=lock, held_by=held_by)

    def waiting_on_children(self, meta: ProcedureMeta, step: int, children: int) -> None:
        self._publish(meta, "waiting on children", step, children=children)

    def waiting_to_start(self, meta: ProcedureMeta, step: int, reason: str) -> None:
        """Held back by flow control before its first step."""
        self._publish(meta, "waiting to start", step, reason=reason)

    def waiting(self, meta: ProcedureMeta, step: int, reason: str) -> None:
        """Parked in a durable wait. Its stored step says so already: said only if something
        else was said of it, which would be stale for as long as it waits."""
        if meta.id in self._shown or meta.id in self._pending:
            self._publish(meta, "waiting", step, reason=reason)

    def running(self, meta: ProcedureMeta, step: int) -> None:
        """It runs a step again: said only if something else was said of it (a look in two
        sets, skipped while both are empty: every step asks)."""
        if (self._shown or self._pending) and (meta.id in self._shown or meta.id in self._pending):
            self._publish(meta, "running", step)

    def ended(self, meta: ProcedureMeta) -> None:
        self._pending.pop(meta.id, None)
        self._retries.pop(meta.id, None)
        if meta.id in self._shown:
            self._shown.discard(meta.id)
            self._gone[meta.id] = None
            self._flush_soon()

    def _publish(self, meta: ProcedureMeta, doing: Doing, step: int, **fields: Any) -> None:
        self._gone.pop(meta.id, None)
        retries = list(self._retries.get(meta.id, ()))
        self._pending[meta.id] = Activity(
            run=meta.run, doing=doing, since=_iso(time.time()), step=step, manager=self._manager, retries=retries,
            **fields,
        )  # fmt: skip
        self._flush_soon()

    def _flush_soon(self) -> None:
        if self._flusher is None:
            # In a context of its own: not the first publisher's, whose span and log fields
            # would otherwise claim every procedure's writes.
            self._flusher = contextvars.Context().run(self._spawn, self._flush(), "procstore:activity")

    async def _flush(self) -> None:
        try:
            while self._pending or self._gone:
                pending, self._pending = self._pending, {}
                gone, self._gone = self._gone, {}
                self._shown.update(pending)
                writes = [self._store.put(pid, activity) for pid, activity in pending.items()]
                results = await asyncio.gather(*writes, self._store.delete(gone), return_exceptions=True)
                for result in results:
                    if isinstance(result, Exception):
                        logger.debug("an activity was not published: %s", describe(result))
                await asyncio.sleep(INTERVAL)
        finally:
            self._flusher = None
