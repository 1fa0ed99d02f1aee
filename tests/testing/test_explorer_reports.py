"""Regressions from a hostile review of the explorer: what it reports, and what it leaves open."""

from __future__ import annotations

import re

from procstore import Context
from procstore.store import StateStore
from procstore.testing import CrashExplorer, CrashPoint, run_simulated
from tests.testing.test_explorer import Deposits, memory_url
from tests.testing.test_explorer_modes import BUILT, Build, Building, Publish, Publishing
from tests.testing.test_explorer_modes import fresh as modes_fresh


class Counting(CrashExplorer):
    """Records every store the explorer opens itself, and which of them it closed."""

    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self.opened: list[StateStore] = []
        self.closed: list[StateStore] = []

    def _store(self, url: str) -> StateStore:
        store = super()._store(url)
        close = store.close

        async def closing() -> None:
            self.closed.append(store)
            await close()

        store.close = closing  # type: ignore[method-assign]
        self.opened.append(store)
        return store


async def test_every_store_the_explorer_opens_is_closed() -> None:
    """An S3 store holds a client session: one not closed is an "Unclosed client session"."""
    explorer = Counting(Deposits(idempotent=True), memory_url)
    (await explorer.explore(double_execution=True)).assert_ok()
    assert explorer.opened and [s for s in explorer.opened if s not in explorer.closed] == []


def named_procedures(text: str) -> set[str]:
    return set(re.findall(r"procedure ([0-9a-f-]{36})", text))


async def test_a_report_names_one_procedure_by_one_id() -> None:
    """The crash point is described from the crashed run's operations, not the crash-free
    run's (whose random ids are another procedure's)."""
    report = await CrashExplorer(Publishing(Publish), modes_fresh).explore(only=[CrashPoint(1, "after")])
    [failure] = report.failures
    assert "crash point 'after-mkdir' of procedure" in failure.operation and "FileExistsError" in str(failure)
    assert len(named_procedures(str(failure))) == 1, str(failure)


class MarkedBuild(Build):
    """The planted bug of `Build` (its rollback from step 1 fails), with a crash point in the rollback."""

    async def rollback(self, ctx: Context) -> None:
        BUILT.pop("a", None)
        await ctx.crash_point("undone-a")
        await super().rollback(ctx)


async def test_the_rollback_mode_names_the_failed_attempt_and_the_crash_point() -> None:
    explorer = CrashExplorer(Building(MarkedBuild), modes_fresh, manager_options={"max_retry_times": 1})
    # Attempt 1 (step 2) fails; operation 2 writes its `.rollback` key, 3 is the rollback's crash point.
    report = await explorer.explore(only=[CrashPoint(2, "after", fail_at=1), CrashPoint(3, "before", fail_at=1)])
    assert len(report.failures) == 2, str(report)
    for failure in report.failures:
        assert "attempt 1 (procedure " in failure.operation and ", step 2) failed on purpose" in failure.operation
        assert len(named_procedures(str(failure))) == 1, str(failure)
    rollback_key, mark = (f.operation.split(", then ")[1] for f in report.failures)
    assert rollback_key.startswith("a crash after put") and ".rollback (procedure " in rollback_key, rollback_key
    assert mark.startswith("a crash before crash point 'undone-a' of procedure ") and ", step 3" in mark, mark


async def test_a_rollback_that_raises_is_reported_with_its_error_and_traceback() -> None:
    explorer = CrashExplorer(Building(MarkedBuild), modes_fresh, manager_options={"max_retry_times": 1})
    report = await explorer.explore(only=[CrashPoint(3, "before", fail_at=1)])
    [failure] = report.failures
    assert "procedure keys left behind" in failure.problem  # the rollback gave up: its keys are kept
    said = str(failure)
    assert "crash point 'undone-a'" in said
    assert "then its rollback failed: KeyError: 'b'" in said and "Traceback" in said and "in rollback" in said


def test_under_a_seeded_loop_a_failure_replays_with_its_seed() -> None:
    """Each run is reseeded from (seed, crash point): the report's replay line, seed included,
    replays the failure alone."""
    explorer = CrashExplorer(Deposits(idempotent=False), memory_url)
    report = run_simulated(explorer.explore(), seed=11)
    [failure] = report.failures
    assert failure.replay == "run_simulated(explorer.explore(only=[CrashPoint(1, 'before')]), seed=11)"
    again = run_simulated(explorer.explore(only=[failure.point]), seed=11)
    assert [str(f) for f in again.failures] == [str(failure)]  # the same ids, the same words
