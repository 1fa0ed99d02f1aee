"""`ExplorationReport.failures` held `(point, problem)` pairs before it held `Failure`s: code
written against the pairs still reads them, with a `DeprecationWarning`."""

from __future__ import annotations

import pytest

from procstore.testing import CrashPoint
from procstore.testing.report import Failure


def test_a_failure_still_reads_as_its_old_point_and_problem_pair() -> None:
    failure = Failure(point=CrashPoint(3, "before"), operation="put_if_absent k", problem="lost: p1")
    with pytest.warns(DeprecationWarning, match="failure.point and failure.problem"):
        point, problem = failure
    assert (point, problem) == (CrashPoint(3, "before"), "lost: p1")
    with pytest.warns(DeprecationWarning):
        assert failure[1] == "lost: p1" and failure[0] == CrashPoint(3, "before")
    assert failure.point == point and failure.problem == problem
