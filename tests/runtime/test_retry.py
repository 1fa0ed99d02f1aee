"""`RetryPolicy`: attempts, retry numbers and exponential delays with jitter."""

from __future__ import annotations

import asyncio
import random
from collections.abc import Awaitable, Callable

import pytest

from procstore import Fenced, LeaseExpired, RetryBudget, RetryLater, StoreError
from procstore._runtime import RetryPolicy
from procstore._runtime.retry import is_rollback_retryable, is_transient


async def test_retries_then_succeeds_with_growing_delays() -> None:
    policy = RetryPolicy(max_retry_times=4, retry_delay=0.001, max_retry_delay=1.0)
    attempts: list[int] = []
    retries: list[tuple[int, float]] = []

    async def flaky(attempt: int) -> str:
        attempts.append(attempt)
        if attempt <= 4:
            raise RetryLater("not yet")
        return "ok"

    result = await policy.call(flaky, on_retry=lambda exc, n, delay: retries.append((n, delay)))
    assert result == "ok" and attempts == [1, 2, 3, 4, 5]
    assert [n for n, _ in retries] == [1, 2, 3, 4]
    for n, delay in retries:  # retry_delay * 2**(n-1), plus up to retry_delay of jitter
        assert 0.001 * 2 ** (n - 1) <= delay <= 0.001 * 2 ** (n - 1) + 0.001 + 1e-9


async def test_gives_up_after_max_retries_with_the_last_error() -> None:
    policy = RetryPolicy(max_retry_times=2, retry_delay=0.0)
    calls = 0

    async def always(attempt: int) -> None:
        nonlocal calls
        calls += 1
        raise RetryLater(f"attempt {attempt}")

    with pytest.raises(RetryLater, match="attempt 3"):
        await policy.call(always)
    assert calls == 3


@pytest.mark.parametrize("retries", [0, 3])
async def test_other_errors_and_zero_retries_raise_at_once(retries: int) -> None:
    policy = RetryPolicy(max_retry_times=retries, retry_delay=0.0)
    calls = 0

    async def broken(attempt: int) -> None:
        nonlocal calls
        calls += 1
        raise (ValueError("bug") if retries else RetryLater("later"))

    with pytest.raises((ValueError, RetryLater)):
        await policy.call(broken)
    assert calls == 1


async def test_delays_are_capped() -> None:
    policy = RetryPolicy(max_retry_times=6, retry_delay=0.001, max_retry_delay=0.004)
    delays: list[float] = []

    async def always(attempt: int) -> None:
        raise RetryLater("no")

    with pytest.raises(RetryLater):
        await policy.call(always, on_retry=lambda exc, n, delay: delays.append(delay))
    assert len(delays) == 6 and max(delays) <= 0.004 + 1e-9


async def test_a_shared_budget_makes_retries_beyond_its_burst_wait_their_turn() -> None:
    budget = RetryBudget(rate=1000.0, burst=3)
    policy = RetryPolicy(max_retry_times=2, retry_delay=0.0, budget=budget)
    failed: set[int] = set()

    def flaky(n: int) -> Callable[[int], Awaitable[int]]:
        async def attempt(_attempt: int) -> int:
            if n not in failed:
                failed.add(n)
                raise RetryLater("not yet")
            return n

        return attempt

    results = await asyncio.gather(*(policy.call(flaky(n)) for n in range(10)))
    assert results == list(range(10))
    assert budget.retries == 10
    # Three retries found tokens; the others waited for theirs.
    assert budget.waited > 0


def test_a_retry_budget_needs_a_positive_rate() -> None:
    with pytest.raises(ValueError, match="rate > 0"):
        RetryBudget(rate=0)


def test_what_is_retried() -> None:
    """A step retries `RetryLater` and store errors; a rollback any error; neither a fence."""
    fenced, expired = Fenced("procedure/x/1.step", None), LeaseExpired("procedure/x/1.step", "cp-1", "gone")
    assert is_transient(RetryLater("x")) and is_transient(StoreError("x"))
    assert not is_transient(ValueError("x"))
    assert is_rollback_retryable(ValueError("x")) and is_rollback_retryable(StoreError("x"))
    for fence in (fenced, expired):
        assert not is_transient(fence) and not is_rollback_retryable(fence)


@pytest.mark.parametrize("retries", [1, 2, 5])
async def test_a_step_out_of_retries_draws_one_jitter_more_than_it_sleeps(retries: int) -> None:
    # A simulation seeds `random` and the backoff's jitter draws from it: the number of draws
    # is part of a seed's schedule, which must replay the same in every release.
    policy = RetryPolicy(max_retry_times=retries, retry_delay=0.0001, max_retry_delay=0.001)

    async def always(attempt: int) -> None:
        raise RetryLater(f"attempt {attempt}")

    random.seed(42)
    with pytest.raises(RetryLater, match=f"attempt {retries + 1}"):
        await policy.call(always)
    after = random.random()
    expected = random.Random(42)
    for _ in range(retries + 1):  # one per retry, and one for the retry it does not make
        expected.uniform(0, 0.0001)
    assert after == expected.random()
