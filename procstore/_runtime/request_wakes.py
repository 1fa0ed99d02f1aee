"""How an operator's request (cancel, fail) reaches a runner that is backing off a store write.

A write that keeps failing backs off for up to `max_retry_delay` between attempts; a request
must not wait that out. Two rules, by what the write is for:

- The writes of a running procedure (a step's state, its children's first keys, its
  commit): a request ends the backoff, and the next attempt raises `OperatorRequested`
  instead of writing, so the procedure fails (or rolls back) as the request asks.
- The writes of a procedure already failing (its `.rollback` key, its `rollback()`, the
  `.commit` that ends it), and a submit's first key: they must go on whatever is
  requested, since the request asks for exactly what they do (a submitted procedure with
  a request fails before its first step; a request can only be written once that key is
  stored, so the submit's next attempt finds its own bytes). A request that arrives during a backoff ends that backoff
  once, so the failure is recorded as soon as the store allows, and the next backoffs run
  in full (a set event would otherwise spend every retry at once).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import TypeVar

from procstore._runtime.context import ManagerContext
from procstore._runtime.meta import ProcedureMeta
from procstore.ids import ProcedureId
from procstore.store.requests import OperatorRequested

T = TypeVar("T")


def unless_requested(
    ctx: ManagerContext, meta: ProcedureMeta, write: Callable[[int], Awaitable[T]]
) -> Callable[[int], Awaitable[T]]:
    """`write`, whose retries (attempt 2 on) raise `OperatorRequested` once the procedure
    has a request: the first attempt always goes, so a request read before it changes
    nothing that is already under way."""

    async def attempt(n: int) -> T:
        if n > 1 and (request := ctx.operator_requests.get(meta.id)) is not None:
            raise OperatorRequested(request)
        return await write(n)

    return attempt


def first_request_wakes(
    ctx: ManagerContext, procedure_id: ProcedureId, requested: Callable[[], asyncio.Event]
) -> Callable[[], asyncio.Event]:
    """A `wake` for `RetryPolicy.call` that ends the backoff under way when a request
    arrives (`requested()` is set), and no backoff that begins once the request is known."""

    def wake() -> asyncio.Event:
        return asyncio.Event() if procedure_id in ctx.operator_requests else requested()

    return wake
