"""Retry with exponential backoff and jitter.

`max_retry_times` counts retries of one step (attempts = retries + 1); the delay before
retry n is `retry_delay * 2**(n-1)` plus up to `retry_delay` of random jitter, capped at
`max_retry_delay`, so that many procedures failing together do not retry in lockstep.
A `RetryBudget` shared by the manager's procedures caps the rate of retries in total.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import TypeVar

from procstore._aio import LockPerLoop, unless_set
from procstore.errors import Fenced, RetryLater, StoreError

T = TypeVar("T")

OnRetry = Callable[[BaseException, int, float], None]
"""Called before each backoff sleep with (the error, the retry number from 1, the delay)."""


def is_transient(exc: BaseException) -> bool:
    """`RetryLater` and store errors are retried (but not `Fenced`); anything else fails the procedure."""
    return isinstance(exc, RetryLater | StoreError) and not isinstance(exc, Fenced)


def is_rollback_retryable(exc: BaseException) -> bool:
    """Rollbacks are retried after any error, but not after `Fenced`: another manager runs it now."""
    return isinstance(exc, Exception) and not isinstance(exc, Fenced)


class RetryBudget:
    """The retries a manager may start, shared by all its procedures: a token bucket.

    Each retry takes a token; tokens come back at `rate` per second, up to `burst`. A
    retry that finds the bucket empty waits for the next token, so when the store fails
    for everyone at once (an S3 503 storm, a network blip) the manager retries at `rate`
    per second in total instead of once per procedure per backoff: it cannot turn an
    outage into a retry storm. Each step still gives up after `max_retry_times` retries.
    """

    def __init__(self, rate: float = 20.0, burst: int = 100) -> None:
        if rate <= 0 or burst < 1:
            raise ValueError(f"retry budget needs rate > 0 and burst >= 1, got {rate}, {burst}")
        self.rate = rate
        self.burst = burst
        self.retries = 0
        """Retries started so far."""
        self.waited = 0.0
        """Seconds retries spent waiting for a token, in total."""
        self._tokens = float(burst)
        self._updated: float | None = None
        self._lock = LockPerLoop()

    def _refill(self) -> None:
        # The loop's clock (monotonic, or a test's virtual one), like the sleeps it paces.
        now = asyncio.get_running_loop().time()
        if self._updated is None:
            self._updated = now
        self._tokens = min(self.burst, self._tokens + (now - self._updated) * self.rate)
        self._updated = now

    async def take(self) -> None:
        """Take one token, waiting for it if the bucket is empty (first come, first served)."""
        async with self._lock():
            self._refill()
            if self._tokens < 1:
                wait = (1 - self._tokens) / self.rate
                self.waited += wait
                await asyncio.sleep(wait)
                self._refill()
            self._tokens -= 1
            self.retries += 1


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    max_retry_times: int = 3
    retry_delay: float = 0.5
    max_retry_delay: float = 30.0
    budget: RetryBudget | None = field(default=None, compare=False)
    """Shared by every procedure of a manager; None: no limit on the rate of retries."""

    async def _sleep(self, delay: float, wake: Callable[[], asyncio.Event] | None = None) -> None:
        if wake is None:
            if self.budget is not None:
                await self.budget.take()
            await asyncio.sleep(delay)
            return
        woken = wake()
        # The wait for a token is part of the backoff: in an outage it can be the longest part.
        if self.budget is not None and not await unless_set(self.budget.take, woken):
            return
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(woken.wait(), delay)

    def __post_init__(self) -> None:
        if self.max_retry_times < 0:
            raise ValueError(f"max_retry_times must be >= 0, got {self.max_retry_times}")
        if self.retry_delay < 0 or self.max_retry_delay < 0:
            raise ValueError("retry delays must be >= 0")

    async def call(
        self,
        fn: Callable[[int], Awaitable[T]],
        *,
        retry_on: Callable[[BaseException], bool] = is_transient,
        on_retry: OnRetry | None = None,
        wake: Callable[[], asyncio.Event] | None = None,
    ) -> T:
        """Await `fn(attempt)` (attempt counts from 1) until it succeeds or retries run out.

        An error `retry_on` rejects is raised at once; after the last retry the last error
        is raised unchanged. Once the event `wake()` gives (asked for only when a backoff
        begins) is set, a backoff ends at once and the next attempt
        follows (it is `fn`'s to raise what ends the retries).
        """
        # The first attempt runs alone: nearly every call succeeds at once. The retries are a
        # coroutine of their own: a first attempt that waits long (a step waiting for an
        # event) holds this small frame, not the retry loop's locals and closures.
        try:
            return await fn(1)
        except Exception as exc:
            if not self.retries(exc, retry_on):
                raise
            first = exc
        return await self.retry_after(fn, first, retry_on=retry_on, on_retry=on_retry, wake=wake)

    def retries(self, first: Exception, retry_on: Callable[[BaseException], bool] = is_transient) -> bool:
        """Whether `call` retries after its first attempt raised `first`."""
        return self.max_retry_times > 0 and retry_on(first)

    async def retry_after(
        self,
        fn: Callable[[int], Awaitable[T]],
        first: Exception,
        *,
        retry_on: Callable[[BaseException], bool] = is_transient,
        on_retry: OnRetry | None = None,
        wake: Callable[[], asyncio.Event] | None = None,
    ) -> T:
        """`call`'s retries (`fn(2)`, ...), for a caller that awaited the first attempt
        itself and got `first`, which `retries` accepted.

        A runner's step and its write await their first attempt without `call`: two
        coroutines fewer per step (each one started, and resumed at every await under it).
        Await it outside the `except` that caught `first`: the retries' errors must not
        chain to it."""
        retry, exc, backoff = 1, first, self.retry_delay
        delay = self._jittered(backoff)
        while True:
            if on_retry is not None:
                on_retry(exc, retry, delay)
            await self._sleep(delay, wake)
            try:
                return await fn(retry + 1)
            except Exception as e:
                if not retry_on(e):
                    raise
                # Capping the doubled base changes no delay (anything above the cap is capped
                # anyway) and keeps a long run of retries from overflowing a float. The next
                # delay is drawn before the check that ends the retries, so a step that runs
                # out of retries draws one jitter more than it sleeps: the draws of `random`
                # (which a simulation seeds) stay those of every release, and a seed replays
                # the same schedule in each.
                backoff = min(2 * backoff, self.max_retry_delay)
                delay = self._jittered(backoff)
                if retry >= self.max_retry_times:
                    raise
                exc = e
            retry += 1

    def _jittered(self, backoff: float) -> float:
        """The delay before a retry whose base (`retry_delay * 2**(n-1)`) is `backoff`."""
        return min(backoff + random.uniform(0, self.retry_delay), self.max_retry_delay)
