"""`RequestLooks`: runners' looks for their operator request, shared when many look at once.

Before every attempt a runner reads its procedure's request key (`cancel`, `fail`), so that
a request stored while a step runs stops the procedure before its next step. With a thousand procedures stepping at
once that is a thousand reads per step on the store (a GET each on S3, a `stat` each on a
local disk, taken on the event loop's thread). Looks asked for in the same turn of the
event loop are answered together instead, by one listing of `requests/`, which shows
every request stored before it began, as each of those reads would have.
"""

from __future__ import annotations

import asyncio

from procstore.ids import ProcedureId
from procstore.store.requests import OperatorRequest, RequestStore


class RequestLooks:
    """Answers `get(procedure_id)` as `RequestStore.get` would, from a read begun after the call.

    Invariant: a look answers only the calls made before it began (`_waiting` is taken at
    its start, and calls made while it runs wait for the next one), so a request stored
    before a call is always seen by that call's answer. One caller alone is answered by its
    own read; several, by one listing, then a read of each listed request.
    """

    def __init__(self, requests: RequestStore) -> None:
        self._requests = requests
        self._waiting: dict[ProcedureId, list[asyncio.Future[OperatorRequest | None]]] = {}
        """Calls made since the current look began, waiting for the next one."""
        self._look: asyncio.Task[None] | None = None
        self._ahead: dict[ProcedureId, asyncio.Future[OperatorRequest | None]] = {}
        """Looks asked for by `look_ahead`, for the next `get` of their procedure."""

    async def get(self, procedure_id: ProcedureId) -> OperatorRequest | None:
        """The procedure's request, from a look begun after this call or, if there is one,
        after the procedure's last `look_ahead`."""
        answer = self._ahead.pop(procedure_id, None)
        return await (answer if answer is not None else self._ask(procedure_id))

    def look_ahead(self, procedure_id: ProcedureId) -> None:
        """Begin the look the procedure's next `get` will answer from, now.

        For a runner whose `execute()` has returned and whose step's write comes next: the
        look goes on while the write does, instead of after it. That moves no boundary of
        the promise: a request stored before this call is seen by the next attempt, one
        stored after it by the attempt after (or by the watch of `requests/`), as with a
        look begun when the write has landed.
        """
        if procedure_id not in self._ahead:
            answer = self._ahead[procedure_id] = self._ask(procedure_id)
            answer.add_done_callback(_retrieved)  # its error is raised by `get`, or dropped

    def forget(self, procedure_id: ProcedureId) -> None:
        """Drop a look ahead that no `get` will take (the procedure has ended)."""
        self._ahead.pop(procedure_id, None)

    def _ask(self, procedure_id: ProcedureId) -> asyncio.Future[OperatorRequest | None]:
        answer: asyncio.Future[OperatorRequest | None] = asyncio.get_running_loop().create_future()
        self._waiting.setdefault(procedure_id, []).append(answer)
        if self._look is None:
            self._look = asyncio.get_running_loop().create_task(self._looks(), name="procstore:request-looks")
        return answer

    async def _looks(self) -> None:
        """Look until nobody waits: each look answers the calls made before it began."""
        try:  # begun at the next turn of the loop: the rest of this turn's callers join it
            while self._waiting:
                batch, self._waiting = self._waiting, {}
                await _answer(self._requests, batch)
        finally:
            self._look = None


async def _answer(
    requests: RequestStore, batch: dict[ProcedureId, list[asyncio.Future[OperatorRequest | None]]]
) -> None:
    """Answer `batch`; the store's error goes to every caller (each retries its attempt, as
    after a failed read of its own)."""
    try:
        if len(batch) == 1:
            found = {pid: await requests.get(pid) for pid in batch}
        else:
            listed = await requests.stored_ids()
            found = {pid: await requests.get(pid) if pid in listed else None for pid in batch}
    except asyncio.CancelledError:
        for answer in _pending(batch):
            answer.cancel()
        raise
    except BaseException as e:  # a simulated crash too: it ends each caller's task, as its own read would
        for answer in _pending(batch):
            answer.set_exception(e)
        return
    for pid, answers in batch.items():
        for answer in answers:
            if not answer.done():
                answer.set_result(found[pid])


def _retrieved(answer: asyncio.Future[OperatorRequest | None]) -> None:
    if not answer.cancelled():
        answer.exception()


def _pending(
    batch: dict[ProcedureId, list[asyncio.Future[OperatorRequest | None]]],
) -> list[asyncio.Future[OperatorRequest | None]]:
    return [answer for answers in batch.values() for answer in answers if not answer.done()]
