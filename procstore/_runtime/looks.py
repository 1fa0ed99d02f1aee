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
import contextvars
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any

from procstore.ids import ProcedureId
from procstore.store.requests import OperatorRequest, RequestStore

Spawn = Callable[[Coroutine[Any, Any, None], str], asyncio.Task[None]]
"""`Term.spawn`: a task of the term."""


class RequestLooks:
    """Answers `get(procedure_id)` as `RequestStore.get` would, from a read begun after the call.

    Invariant: a look answers only the calls made before it began (`_waiting` is taken at
    its start, and calls made while it runs wait for the next one), so a request stored
    before a call is always seen by that call's answer. One caller alone is answered by its
    own read; several, by one listing, then a read of each listed request (of every one, if
    the listing fails). A caller while looks come one to a turn of the event loop (a few
    procedures at a time) reads its own request at once, in its own task, as a batch of one
    would, without the batch's task.
    """

    def __init__(self, requests: RequestStore, spawn: Spawn) -> None:
        self._requests = requests
        self._spawn = spawn
        """Starts a task of the term (`Term.spawn`): a stop cancels a look and waits for it."""
        self._waiting: dict[ProcedureId, list[asyncio.Future[OperatorRequest | None]]] = {}
        """Calls made since the current look began, waiting for the next one."""
        self._look: asyncio.Task[None] | None = None
        self._ahead: dict[ProcedureId, asyncio.Future[OperatorRequest | None]] = {}
        """Looks asked for by `look_ahead`, for the next `get` of their procedure."""
        self._this_turn = 0
        """Looks asked for in the current turn of the event loop (0: none counted yet)."""
        self._last_turn = 0
        """Looks asked for in the last turn that had any."""

    def get(self, procedure_id: ProcedureId) -> Awaitable[OperatorRequest | None]:
        """The procedure's request, from a look begun after this call or, if there is one,
        after the procedure's last `look_ahead`: await what it returns at once.

        Not a coroutine itself (one frame fewer in every attempt's chain): the look is
        chosen at the call, and the answer is the awaitable returned."""
        answer = self._ahead.pop(procedure_id, None)
        if answer is not None:
            return answer
        if not self._crowded():
            return self._requests.get(procedure_id)
        return self._ask(procedure_id)

    def _crowded(self) -> bool:
        """Count this look in its turn of the loop; whether looks are batched now: a batch is
        under way, or the last turn with looks had several."""
        if self._this_turn == 0:
            asyncio.get_running_loop().call_soon(self._turn_ended)
        self._this_turn += 1
        return self._look is not None or self._last_turn > 1 or self._this_turn > 1

    def _turn_ended(self) -> None:
        self._last_turn, self._this_turn = self._this_turn, 0

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
            # In a context of its own, not the first caller's: its requests are every caller's
            # (log fields, spans), and it goes on after that caller's procedure has ended.
            self._look = look = contextvars.Context().run(self._spawn, self._looks(), "procstore:request-looks")
            look.add_done_callback(self._ended)
        return answer

    async def _looks(self) -> None:
        """Look until nobody waits: each look answers the calls made before it began."""
        try:  # begun at the next turn of the loop: the rest of this turn's callers join it
            while self._waiting:
                batch, self._waiting = self._waiting, {}
                await _answer(self._requests, batch)
        except asyncio.CancelledError:
            self._ended(None)
            raise
        self._look = None

    def _ended(self, look: asyncio.Task[None] | None) -> None:
        """The term cancelled the look (a stop, a step-down), maybe before it began: the calls
        waiting for the next one are cancelled with it (their runners are being cancelled)."""
        if look is None or self._look is look:
            self._look = None
            for answer in _pending(self._waiting):
                answer.cancel()
            self._waiting = {}


async def _answer(
    requests: RequestStore, batch: dict[ProcedureId, list[asyncio.Future[OperatorRequest | None]]]
) -> None:
    """Answer `batch`, each caller by a read of its own request (those the listing shows,
    when several ask), run together: a read's error goes to its caller alone (it retries its
    attempt, as after its own read). A failed listing fails nobody: every caller's request is
    read instead, as without a listing. A single store error must not become every caller's
    failure (with `max_retry_times=0`, a whole batch of procedures failed by one 503), nor one
    exception object shared by many procedures' states."""
    wanted = list(batch)
    try:
        if len(batch) > 1:
            try:
                listed = await requests.stored_ids()
            except Exception:
                pass  # read each one instead
            else:
                wanted = [pid for pid in batch if pid in listed]
                # Those it does not show are answered now, not once the reads are done: the
                # answer is as old as the listing, and a request stored since (a `cancel()`
                # that returned meanwhile) must not find their step starting after it.
                _settle({pid: answers for pid, answers in batch.items() if pid not in listed}, {})
        # With `return_exceptions`, a cancel waits for every read: none outlives the look.
        reads = await asyncio.gather(*(requests.get(pid) for pid in wanted), return_exceptions=True)
    except asyncio.CancelledError:
        for answer in _pending(batch):
            answer.cancel()
        raise
    except BaseException as e:  # a simulated crash of the listing: it ends each caller's task, as its own read would
        for answer in _pending(batch):
            answer.set_exception(e)
        return
    _settle(batch, dict(zip(wanted, reads, strict=True)))


def _settle(
    batch: dict[ProcedureId, list[asyncio.Future[OperatorRequest | None]]],
    found: dict[ProcedureId, OperatorRequest | BaseException | None],
) -> None:
    """Answer each caller in `batch` still waiting: its read (an error, a request) or None."""
    for pid, answers in batch.items():
        read = found.get(pid)
        for answer in answers:
            if answer.done():
                continue
            if isinstance(read, BaseException):
                answer.set_exception(read)
            else:
                answer.set_result(read)


def _retrieved(answer: asyncio.Future[OperatorRequest | None]) -> None:
    if not answer.cancelled():
        answer.exception()


def _pending(
    batch: dict[ProcedureId, list[asyncio.Future[OperatorRequest | None]]],
) -> list[asyncio.Future[OperatorRequest | None]]:
    return [answer for answers in batch.values() for answer in answers if not answer.done()]
