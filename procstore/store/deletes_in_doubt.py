"""`DeletesInDoubt`: procedure folders whose deletion sent a request of unknown outcome.

A request the store answered with an error (a timeout, a lost answer) may still be carried
out later: a deletion's `batch_delete` names keys, and landing after the id was created
anew (a rewound or resumed parent creating its child again under the same id) it would
delete the new run's keys while it runs. So a folder whose deletion had such a request is
not created again until that request can no longer land: `late_write_grace` after the
deletion failed (after the request was sent), the bound the lease's takeover already
assumes for a late write.
"""

from __future__ import annotations

import asyncio
import time

from procstore._logs import get_logger, procedure_fields
from procstore.ids import ProcedureId

logger = get_logger("procstore.store")

DEFAULT_LATE_WRITE_GRACE = 50.0
"""Without a lease: `Lease()`'s `late_write_grace` (five times its 10 s TTL)."""

_PRUNE_ABOVE = 1024
"""Entries kept before the ones past their grace are dropped (ids never created again)."""


class DeletesInDoubt:
    """The ids whose deletion sent a request that may still land, and until when."""

    __slots__ = ("_until", "late_write_grace")

    def __init__(self, late_write_grace: float = DEFAULT_LATE_WRITE_GRACE) -> None:
        self.late_write_grace = late_write_grace
        """Seconds after it was sent within which a request of unknown outcome may land."""
        self._until: dict[ProcedureId, float] = {}
        """`time.monotonic()` before which each id's folder is not created again."""

    def __bool__(self) -> bool:
        """Whether any id is noted: most managers have none, and then no wait is even begun."""
        return bool(self._until)

    def note(self, procedure_id: ProcedureId) -> None:
        """The id's deletion failed now: one of its requests may land later."""
        now = time.monotonic()
        if len(self._until) > _PRUNE_ABOVE:
            self._until = {pid: until for pid, until in self._until.items() if until > now}
        self._until[procedure_id] = now + self.late_write_grace

    async def settled(self, procedure_id: ProcedureId) -> None:
        """Return once no request of the id's deletion can land any more (at once for most)."""
        until = self._until.get(procedure_id)
        if until is None:
            return
        wait = until - time.monotonic()
        if wait > 0:
            logger.info(
                "procedure %s is created again in %.1fs: a request of its deletion failed and may still land",
                procedure_id,
                wait,
                extra=procedure_fields(procedure_id),
            )
            # Kept while waiting: a wait cut short (a stop) leaves the next one to wait the rest.
            await asyncio.sleep(wait)
        if self._until.get(procedure_id) == until:  # not noted again meanwhile
            del self._until[procedure_id]
