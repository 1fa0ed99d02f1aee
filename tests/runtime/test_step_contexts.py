"""The `Context` a step's attempt gets: one per run for every first attempt, a context of
its own for a retry (`is_retrying`)."""

from __future__ import annotations

import contextlib
import uuid

from procstore import Context, ProcedureWithId, RetryLater, Status
from tests.procedures import LabelledSteps
from tests.support import manager_for

SEEN: dict[str, list[tuple[Context, bool]]] = {}
"""Each run's attempts, by its procedure's label: (the context, kept alive; `is_retrying`)."""


class RecordsItsContexts(LabelledSteps):
    """Three steps; the second raises `RetryLater` once."""

    type_name = "tests::RecordsItsContexts"

    async def execute(self, ctx: Context) -> Status:
        attempts = SEEN.setdefault(self.label, [])
        attempts.append((ctx, ctx.is_retrying))
        if self.step == 1 and not ctx.is_retrying:
            raise RetryLater("once")
        self.step += 1
        return Status.done() if self.step == 3 else Status.executing()


async def test_every_first_attempt_of_a_run_shares_one_context_and_a_retry_gets_its_own() -> None:
    label = uuid.uuid4().hex
    async with manager_for(f"memory://{label}/", RecordsItsContexts) as manager:
        await (await manager.submit(ProcedureWithId.new(RecordsItsContexts(f"{label}:0")))).wait()
    (first, no), (second, no_again), (retry, yes), (third, no_more) = SEEN[label]
    assert (no, no_again, yes, no_more) == (False, False, True, False)
    assert first is second is third
    assert retry is not first


class TriesToChangeItsSignals(LabelledSteps):
    """Two steps, each trying to add to `ctx.signals`."""

    type_name = "tests::TriesToChangeItsSignals"

    async def execute(self, ctx: Context) -> Status:
        attempts = SEEN.setdefault(self.label, [])
        attempts.append((ctx, bool(ctx.signals)))
        with contextlib.suppress(TypeError):
            ctx.signals["x"] = 1  # type: ignore[index]
        self.step += 1
        return Status.done() if self.step == 2 else Status.executing()


async def test_the_signals_of_a_shared_context_are_read_only_and_stay_empty() -> None:
    label = uuid.uuid4().hex
    async with manager_for(f"memory://{label}/", TriesToChangeItsSignals) as manager:
        await (await manager.submit(ProcedureWithId.new(TriesToChangeItsSignals(f"{label}:0")))).wait()
    assert [had_signals for _, had_signals in SEEN[label]] == [False, False]
