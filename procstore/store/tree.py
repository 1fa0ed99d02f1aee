"""Procedure trees as their parent links draw them: descendants, parent cycles, orphans.

Stored parent links are data anyone who can write the bucket can change: a walk here visits
each procedure once however the links loop, and is iterative, so a chain thousands deep
is as easy as a wide tree.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterable, Mapping
from dataclasses import dataclass
from typing import Generic, TypeVar

T = TypeVar("T", bound=Hashable)


def reachable(start: T, children_of: Callable[[T], Iterable[T]]) -> list[T]:
    """`start`, then every procedure reachable from it through `children_of`, each once,
    nearest first (breadth first): a parent always comes before its children."""
    out = [start]
    seen = {start}
    at = 0
    while at < len(out):
        for child in children_of(out[at]):
            if child not in seen:
                seen.add(child)
                out.append(child)
        at += 1
    return out


def descendants(start: T, children_of: Callable[[T], Iterable[T]]) -> list[T]:
    """`reachable` without `start` itself (also when a cycle leads back to it)."""
    return reachable(start, children_of)[1:]


@dataclass(frozen=True, slots=True)
class Stuck(Generic[T]):
    """Why a procedure's chain of parent links never reaches a root."""

    culprit: T
    """Where the chain breaks: the orphan, or the member of a parent cycle the chain met first."""
    cycle: tuple[T, ...] = ()
    """The parent cycle from `culprit` on, following parent links; empty for an orphan."""
    blamed: frozenset[T] = frozenset()
    """The procedures that are themselves the problem (the orphan, or the cycle's members),
    not only below it."""

    @classmethod
    def of(cls, culprit: T, cycle: tuple[T, ...] = ()) -> Stuck[T]:
        return cls(culprit, cycle, frozenset(cycle or (culprit,)))


def stuck_chains(
    parent_of: Mapping[T, T | None], orphaned: Callable[[T, T], bool] = lambda _child, _parent: False
) -> dict[T, Stuck[T]]:
    """Every procedure of `parent_of` whose chain of parents never reaches one without a
    parent, and why: its parent links form a cycle, or lead to a procedure whose parent is
    not in `parent_of` and `orphaned(procedure, parent)` says so (a parent outside it
    otherwise ends the chain as a root does). Procedures below the break share its `Stuck`.

    Linear: each walk up stops at a procedure some walk settled before."""
    stuck: dict[T, Stuck[T]] = {}
    settled: set[T] = set()
    for start, first_parent in parent_of.items():
        if first_parent is None:
            continue  # a root: a walk that reaches it ends there, and it is never stuck
        chain: dict[T, int] = {}  # the walk so far, by position: a lookup however deep
        verdict: Stuck[T] | None = None
        pid = start
        while pid not in settled:
            if pid in stuck:
                verdict = stuck[pid]
                break
            if pid in chain:
                verdict = Stuck.of(pid, tuple(list(chain)[chain[pid] :]))
                break
            chain[pid] = len(chain)
            parent = parent_of[pid]
            if parent is None:
                break
            if parent not in parent_of:
                if orphaned(pid, parent):
                    verdict = Stuck.of(pid)
                break
            pid = parent
        if verdict is None:
            settled.update(chain)
        else:
            stuck.update(dict.fromkeys(chain, verdict))
    return stuck
