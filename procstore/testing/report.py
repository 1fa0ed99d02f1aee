"""What a crash explorer reports: each crash point named in full, and why the run failed."""

from __future__ import annotations

import re
import warnings
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Literal

from procstore.testing.naming import ProcedureNames
from procstore.testing.plan import FaultPlan, StoreOp

When = Literal["before", "after"]

_KEY = re.compile(r"procedure/(?P<id>[0-9a-f-]{36})/(?P<step>\d{10})\.(?P<kind>step|commit|rollback)$")


CLEAN_RUN = -2
"""The `CrashPoint.index` of the crash-free run (a failure there: its invariant broke)."""


@dataclass(frozen=True, slots=True)
class CrashPoint:
    """Where a run was killed: before or after its `index`-th counted operation.

    With `fail_at` set (the rollback mode), the run's `fail_at`-th attempt at a step fails
    first (an injected error), and `index` counts from there (-1: no crash, the rollback
    runs to its end).
    """

    index: int
    when: When
    fail_at: int | None = None

    def __str__(self) -> str:
        if self.fail_at is not None:
            where = "no crash" if self.index < 0 else f"crash {self.when} operation {self.index}"
            return f"failure injected at attempt {self.fail_at}, {where}"
        if self.index == CLEAN_RUN:
            return "none (the crash-free run)"
        if self.index < 0:
            return "before every store update (each step twice)"
        return f"{self.when} operation {self.index}"


def describe_op(op: StoreOp | None, names: ProcedureNames | None = None) -> str:
    """An operation as a person reads it: kind, key, and the procedure (by type, and a
    child by its parent, when `names` knows it) and step it belongs to."""
    names = names or ProcedureNames()
    if op is None:
        return "(an operation the crash-free run never reached)"
    if op.kind == "crash_point":
        pid, step, name = [*op.key.split("/", 2), "", ""][:3]
        return f"crash point {name!r} of {names.name(pid)}, step {step}"
    match = _KEY.search(op.key)
    about = f" ({names.name(match['id'])}, step {int(match['step'])})" if match else ""
    return f"{op.kind} {op.key}{about}"


def describe_point(point: CrashPoint, plan: FaultPlan, names: ProcedureNames | None = None) -> str:
    """Where the run that `plan` recorded was killed, by its own operations (so with the
    ids of that run's procedures) and, in the rollback mode, which attempt failed first."""
    names = names or ProcedureNames()
    op = plan.ops[point.index] if 0 <= point.index < len(plan.ops) else None
    if point.fail_at is None:
        if point.index == CLEAN_RUN:
            return "the crash-free run"
        return "every step run twice" if point.index < 0 else describe_op(op, names)
    keys = plan.attempt_keys
    pid, step = [*keys[point.fail_at].split("/"), ""][:2] if point.fail_at < len(keys) else ("", "")
    failed = f"attempt {point.fail_at} ({names.name(pid)}, step {step})" if pid else f"attempt {point.fail_at}"
    then = "no crash" if point.index < 0 else f"a crash {point.when} {describe_op(op, names)}"
    return f"{failed} failed on purpose, then {then}"


@dataclass(frozen=True, slots=True)
class Outcome:
    """How one procedure ended in a run: done or failed, and with what error."""

    status: str
    error: str | None = None
    traceback: str | None = None


@dataclass(frozen=True, slots=True)
class Failure:
    """One crash point that broke something, with all a reader needs to act on it."""

    point: CrashPoint
    operation: str
    """The operation the crash was placed at, described."""
    problem: str
    details: list[str] = field(default_factory=list)
    seed: int | None = None
    """The seed of the `SimulatedLoop` the explorer ran on, if it had one."""

    @property
    def replay(self) -> str:
        p = self.point
        extra = "" if p.fail_at is None else f", fail_at={p.fail_at}"
        call = f"explorer.explore(only=[CrashPoint({p.index}, {p.when!r}{extra})])"
        if p.index == CLEAN_RUN:
            call = "explorer.explore(only=[])"
        return f"await {call}" if self.seed is None else f"run_simulated({call}, seed={self.seed})"

    def __iter__(self) -> Iterator[object]:
        """`point, problem = failure`: the `(point, problem)` pair `ExplorationReport.failures`
        held before it held `Failure`s. Deprecated (use `.point` and `.problem`); it goes
        in a later release."""
        _warn_pair()
        return iter((self.point, self.problem))

    def __getitem__(self, index: int) -> object:
        """`failure[0]`, `failure[1]`: as `__iter__`, deprecated."""
        _warn_pair()
        return (self.point, self.problem)[index]

    def __str__(self) -> str:
        where = "the crash-free run" if self.point.index == CLEAN_RUN else f"crash {self.point}: {self.operation}"
        lines = [where, f"    {self.problem}"]
        lines += [f"    {line}" for detail in self.details for line in detail.splitlines()]
        lines.append(f"    replay: {self.replay}")
        return "\n".join(lines)


def _warn_pair() -> None:
    warnings.warn(
        "reading a Failure as a (point, problem) pair is deprecated: use failure.point and failure.problem",
        DeprecationWarning,
        stacklevel=3,
    )


def outcome_differences(outcomes: dict[str, Outcome], expected: dict[str, Outcome]) -> tuple[str, list[str]] | None:
    """The first procedure whose outcome differs from the crash-free run's, with its error.

    Both are in the scenario's order; ids differ from run to run (they are often random).
    """
    for n, ((pid, got), want) in enumerate(zip(outcomes.items(), expected.values(), strict=False)):
        if got.status != want.status:
            problem = f"procedure {pid} (the scenario's #{n}) ended {got.status}, not {want.status} as without a crash"
            return problem, _error_lines("its error", got)
    if len(outcomes) != len(expected):
        return f"{len(outcomes)} procedures ended, not {len(expected)} as without a crash", []
    return None


def _error_lines(title: str, outcome: Outcome) -> list[str]:
    lines = [f"{title}: {outcome.error}"] if outcome.error else []
    return lines + ([outcome.traceback.rstrip()] if outcome.traceback else [])


def failed_procedures(outcomes: dict[str, Outcome]) -> list[str]:
    """Each procedure that failed in a run, with its error and traceback (a rollback that
    raised says so there: "...; then its rollback failed: KeyError: 'b'")."""
    return [
        line
        for n, (pid, outcome) in enumerate(outcomes.items())
        if outcome.status == "failed"
        for line in _error_lines(f"procedure {pid} (the scenario's #{n}) failed", outcome)
    ]


class RunBroken(AssertionError):
    """A run broke a check of the store (keys left, written twice, a hang): the problem,
    and the `details` that explain it (the procedures that failed, what a stuck one does)."""

    def __init__(self, problem: str, details: list[str]) -> None:
        super().__init__(problem)
        self.details = details


def world_difference(got: object, want: object) -> str:
    """What differs between two snapshots: keys added, removed and changed for mappings."""
    if isinstance(got, dict) and isinstance(want, dict):
        added = sorted(map(str, got.keys() - want.keys()))
        removed = sorted(map(str, want.keys() - got.keys()))
        changed = sorted((k for k in got.keys() & want.keys() if got[k] != want[k]), key=str)
        parts = []
        if added:
            parts.append(f"only after the crash: {', '.join(added[:5])}")
        if removed:
            parts.append(f"missing after the crash: {', '.join(removed[:5])}")
        parts += [f"{key}: {got[key]!r} instead of {want[key]!r}" for key in changed[:5]]
        return "; ".join(parts)
    return f"{got!r} instead of {want!r}"
