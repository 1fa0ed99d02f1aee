"""`procstore.store.tree`: walks over parent links that may loop, and why a chain is stuck."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from procstore.store.tree import descendants, reachable, stuck_chains


@given(st.dictionaries(st.integers(0, 12), st.integers(0, 12) | st.none()))
def test_a_chain_is_stuck_exactly_when_walking_its_parents_never_ends(parent_of: dict[int, int | None]) -> None:
    stuck = stuck_chains(parent_of)
    for start in parent_of:
        path = [start]
        while (parent := parent_of.get(path[-1])) is not None and parent not in path:
            path.append(parent)
        loops = parent is not None and parent in path
        assert (start in stuck) == loops
        if loops:
            verdict = stuck[start]
            assert verdict.cycle[0] == verdict.culprit
            following = [*verdict.cycle[1:], verdict.cycle[0]]
            assert all(parent_of[a] == b for a, b in zip(verdict.cycle, following, strict=True))
            assert verdict.blamed == set(verdict.cycle)


def test_an_orphan_and_every_procedure_below_it_are_stuck_and_only_the_orphan_is_blamed() -> None:
    parent_of = {1: 9, 2: 1, 3: 2, 4: None, 5: 4}
    stuck = stuck_chains(parent_of, lambda _child, parent: parent == 9)
    assert set(stuck) == {1, 2, 3}
    assert {stuck[p].culprit for p in stuck} == {1}
    assert stuck[3].blamed == {1}


def test_walks_down_visit_each_once_however_the_links_loop() -> None:
    children = {1: [2, 3], 2: [4], 3: [4, 1], 4: [2]}
    assert reachable(1, lambda p: children.get(p, [])) == [1, 2, 3, 4]
    assert descendants(1, lambda p: children.get(p, [])) == [2, 3, 4]
    chain = {i: [i + 1] for i in range(10_000)}
    assert len(descendants(0, lambda p: chain.get(p, []))) == 10_000
