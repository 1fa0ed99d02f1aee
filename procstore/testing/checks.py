"""The crash explorer's checks on what a run wrote: no procedure lost, each ended once,
no key written twice."""

from __future__ import annotations

from collections import Counter

from procstore.procedure import ProcedureWithId
from procstore.testing.faults import FaultyStore, StoreOp


def rebind(originals: list[ProcedureWithId], fresh: list[ProcedureWithId]) -> list[ProcedureWithId]:
    """Freshly built procedures under the original ids (ids are often random)."""
    if len(fresh) != len(originals):
        raise AssertionError("Scenario.procedures() must return the same procedures, in order, every time")
    return [ProcedureWithId(o.id, f.procedure) for o, f in zip(originals, fresh, strict=True)]


def ever_stored(pwid: ProcedureWithId, lives: list[FaultyStore]) -> bool:
    return any(str(pwid.id) in op.key for life in lives for op in life.landed() if op.kind.startswith("put"))


def ended_before(pwid: ProcedureWithId, lives: list[FaultyStore]) -> str:
    """The outcome of a procedure that ended, and whose keys went, before the kill."""
    ops = [op for life in lives for op in life.landed() + life.maybe_landed()]
    ends = [op.key for op in ops if str(pwid.id) in op.key and op.kind.startswith("put")]
    # A `.commit` above a `.rollback` ends a rolled-back procedure: the rollback decides.
    if any(k.endswith(".rollback") for k in ends):
        return "failed"
    if any(k.endswith(".commit") for k in ends):
        return "done"
    raise AssertionError(f"procedure {pwid.id} was lost: stored, then gone without a commit or rollback key")


def check_writes(ops: list[StoreOp], maybe: list[StoreOp]) -> None:
    """No key written twice; each procedure ends once: one `.commit`, or one `.rollback`
    with at most one `.commit` above it (the end of its rollback).

    `maybe` are writes a stop cut off: they count only where nothing else explains the
    outcome (a procedure that ended with no other end key must have had this one land).
    """
    writes = [op for op in ops if op.kind.startswith("put") and "procedure/" in op.key]
    twice = [key for key, n in Counter(op.key for op in writes).items() if n > 1]
    if twice:
        raise AssertionError(f"keys written twice: {twice[:3]}")
    ends: dict[str, list[str]] = {}
    for op in writes:
        ends.setdefault(_folder(op), [])
        if op.key.endswith((".commit", ".rollback")):
            ends[_folder(op)].append(op.key)
    for op in maybe:
        if op.kind.startswith("put") and op.key.endswith((".commit", ".rollback")) and not ends.get(_folder(op)):
            ends[_folder(op)] = [op.key]
    wrong = {pid: [k.rsplit("/", 1)[-1] for k in keys] for pid, keys in ends.items() if not _ends_once(keys)}
    if wrong:
        raise AssertionError(f"procedures not committed or rolled back exactly once: {wrong}")


def _ends_once(keys: list[str]) -> bool:
    """One `.commit`; or one `.rollback`, alone or below one `.commit`."""
    in_step_order = [name.split(".", 1)[1] for name in sorted(k.rsplit("/", 1)[-1] for k in keys)]
    return in_step_order in (["commit"], ["rollback"], ["rollback", "commit"])


def _folder(op: StoreOp) -> str:
    return op.key.rsplit("/", 2)[-2]
