"""Hypothesis strategies for fault schedules and crash points."""

from __future__ import annotations

from hypothesis import strategies as st

from procstore.store.wrapping import MUTATING_KINDS
from procstore.testing.explorer import CrashPoint
from procstore.testing.plan import Fault


def crash_points(operations: int) -> st.SearchStrategy[CrashPoint]:
    """A crash before or after one of `operations` counted store operations."""
    return st.builds(CrashPoint, st.integers(0, max(0, operations - 1)), st.sampled_from(["before", "after"]))


def faults(kinds: frozenset[str] = MUTATING_KINDS, *, crashes: bool = True) -> st.SearchStrategy[Fault]:
    """One fault: transient errors a few times, a delay, or (with `crashes`) a crash or torn write."""
    kind = st.sampled_from(sorted(kinds)).map(lambda k: frozenset({k}))
    transient = st.builds(Fault, st.just("transient"), kind, times=st.integers(1, 3))
    delay = st.builds(Fault, st.just("delay"), kind, seconds=st.floats(0, 0.01), times=st.integers(1, 5))
    options = [transient, delay]
    if crashes:
        options.append(st.builds(Fault, st.sampled_from(["crash", "tear"]), kind, nth=st.integers(0, 5)))
    return st.one_of(options)


def fault_plans(max_faults: int = 3, *, crashes: bool = True) -> st.SearchStrategy[list[Fault]]:
    """Lists of faults for `FaultPlan(faults)` or `FaultyStore(store, faults=...)`."""
    return st.lists(faults(crashes=crashes), max_size=max_faults)
