"""The invariants a `ClusterSimulation` checks after each run, against its model of the world.

The model is built from what the simulation saw: the log of every store write that landed
(who wrote which key, in order), the roots it submitted, and the operator requests it made.
From the log, each procedure's runs follow, by the run number its messages carry
(`ProcedureMessage.run`): a message of a new number starts a run (a submit's `0.step`, a
resume's or rewind's copy), a `.commit` ends the current one (failed if a `.rollback` lies
right below it in that run). A message of a run that has ended already is a late write
(an attempt still in flight, a paused process's): it starts nothing, and must be gone by
the end (the "keys remain" check), never run (nothing a late key leads to may land).
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, field

import msgspec

from procstore._client.inventory import status_of_keys
from procstore.store.folder import StoredStatus, latest_key
from procstore.store.history import HistoryRecord, ended_run
from procstore.store.keys import PROC_PATH, KeyType, ParsedKey
from procstore.store.message import MessageDecodeError, ProcedureMessage
from procstore.testing.cluster_store import LoggedOp

REQUEST_TAG = re.compile(r"op#(\d+)\b")
"""How an operator request's reason names it, so that an error can be traced to it."""


@dataclass
class Run:
    number: int
    started_at: float
    ended_at: float | None = None
    outcome: str | None = None
    """`done` or `failed` (a `.rollback` right below its `.commit`)."""
    rollbacks: set[int] = field(default_factory=set)
    deleted_while_running: str | None = None
    """The problem, if its keys were deleted before it ended (reported unless the run turns
    out never to have started: see `runs_from_log`)."""
    top_step: int = 0
    """The highest step of a key it wrote before it ended."""
    written: set[tuple[int, str]] = field(default_factory=set)
    """The keys (step, type) it wrote: a deletion of a key of the same name that lands
    before the run writes it takes an earlier run's key, not this one's."""
    ended_late: bool = False
    """Its `.commit` landed late: its writer had been told the write failed, and may record
    the run's failure right above it (see `_late`)."""


@dataclass
class Procedure:
    runs: list[Run] = field(default_factory=list)
    zero_deleted: bool = False
    parent: str | None = None
    """Its parent, from its messages."""
    ended_numbers: set[int] = field(default_factory=set)
    """The run numbers whose `.commit` landed."""
    operator_deleted: bool = False
    """An operator (`procstore delete`, `gc`) deleted some of its keys: its runs may end unrecorded."""
    problems: list[str] = field(default_factory=list)

    @property
    def current(self) -> Run | None:
        return self.runs[-1] if self.runs else None


@dataclass
class OperatorAction:
    """One operator request the simulation made."""

    number: int
    kind: str
    procedure_id: str
    via: str
    issued_at: float
    stored_at: float | None = None
    """When its write had surely landed (None: refused, or its outcome is unknown)."""
    result: str = ""
    ended_with: str | None = None
    """For a restart through the API: the error its run's watcher raised (None: none seen)."""

    def line(self) -> str:
        return f"{self.issued_at:9.2f}  op#{self.number} {self.kind} {self.procedure_id} via {self.via}: {self.result}"


@dataclass
class Model:
    """What the simulation knows of the world it ran."""

    roots: set[str] = field(default_factory=set)
    keep_failed: bool = False
    deleted: set[str] = field(default_factory=set)
    """Procedures an operator deleted: their runs may end without a record."""
    operator: list[OperatorAction] = field(default_factory=list)


def runs_from_log(log: Iterable[LoggedOp], roots: set[str]) -> dict[str, Procedure]:
    procedures: dict[str, Procedure] = {}
    for op in log:
        if not op.landed:
            continue
        for key in op.key.split(","):
            if op.created and (ended := _end_record(key, op.value)) is not None:
                _recorded(procedures.setdefault(ended[0], Procedure()), *ended[1:], op)
                continue
            parsed = ParsedKey.parse(PROC_PATH, key)
            if parsed is None:
                continue
            proc = procedures.setdefault(str(parsed.procedure_id), Procedure())
            if op.kind in ("batch_delete", "delete"):
                _deleted(proc, str(parsed.procedure_id), parsed, op)
                continue
            if op.created:
                _created(proc, str(parsed.procedure_id), parsed, op, _run_number(op))
                if proc.parent is None and op.value:
                    proc.parent = _parent(op.value)
    # A child created in a run of its parent that ended without it (the parent failed as
    # the create landed: it never ran) is that ended tree's leftover, not a run of its own.
    for proc in procedures.values():
        creator = procedures.get(proc.parent) if proc.parent is not None else None
        if creator is not None:
            proc.runs = [
                r
                for r in proc.runs
                if not (r.ended_at is None and r.top_step == 0 and r.number in creator.ended_numbers)
            ]
    for proc in procedures.values():
        proc.problems += [r.deleted_while_running for r in proc.runs if r.deleted_while_running is not None]
    # `procstore delete` takes a tree: what its leader still writes below a deleted parent
    # (a child it was creating) is left to nobody, by design.
    for proc in procedures.values():
        seen: set[str] = set()
        parent = proc.parent
        while parent is not None and parent not in seen and parent in procedures:
            seen.add(parent)
            if procedures[parent].operator_deleted:
                proc.operator_deleted = True
                break
            parent = procedures[parent].parent
    return procedures


OPERATOR = "op"
"""The process name of operator commands in the log."""


def _deleted(proc: Procedure, pid: str, parsed: ParsedKey, op: LoggedOp) -> None:
    proc.zero_deleted = proc.zero_deleted or parsed.step == 0
    if op.process == OPERATOR:
        proc.operator_deleted = True
    if proc.operator_deleted:
        return  # `procstore delete` is destructive by design: what a leader still writes may go
    run = proc.current
    if run is not None and (parsed.step, parsed.key_type.value) not in run.written:
        return  # an earlier run's key (below the running one's copy, or not written by it yet)
    if run is not None and run.ended_at is None and run.deleted_while_running is None:
        run.deleted_while_running = (
            f"{pid}: {parsed.step}.{parsed.key_type.value} deleted at {op.at:.2f} by {op.process} while run "
            f"{len(proc.runs)} (begun at {run.started_at:.2f}) had not ended: a running procedure's keys went"
        )


def _end_record(key: str, value: bytes | None) -> tuple[str, int, str] | None:
    """(id, run, outcome) of an end record's key and value; None for any other key."""
    if not key.startswith("history/") or not value or (run := ended_run(key)) is None:
        return None
    try:
        record = msgspec.json.decode(value, type=HistoryRecord)
    except msgspec.DecodeError:
        return None
    return run[0], run[1], record.outcome


def _recorded(proc: Procedure, number: int, outcome: str, op: LoggedOp) -> None:
    """An end record of a run no `.commit` ended: it ended without its end being stored (or
    was stuck) and an operator's restart superseded it; the record is that run's end."""
    run = next((r for r in proc.runs if r.number == number), None)
    if run is not None and run.ended_at is None:
        run.ended_at = op.at
        run.outcome = "done" if outcome == "done" else "failed"
        proc.ended_numbers.add(number)


def _parent(value: bytes) -> str | None:
    try:
        parent = ProcedureMessage.decode(value).parent_id
    except MessageDecodeError:
        return None
    return None if parent is None else str(parent)


def _run_number(op: LoggedOp) -> int | None:
    """The run a written message belongs to; None for a key without a message (`.commit`)."""
    if not op.value:
        return None
    try:
        return ProcedureMessage.decode(op.value).run
    except MessageDecodeError:
        return None


def _created(proc: Procedure, pid: str, parsed: ParsedKey, op: LoggedOp, number: int | None) -> None:
    run = proc.current
    if parsed.key_type is not KeyType.COMMIT:
        number = 1 if number is None else number
        if number in proc.ended_numbers:
            ended = next(r for r in proc.runs if r.number == number)
            _late(proc, pid, parsed, op, ended)
            return
        if run is None or run.number != number:
            proc.runs.append(Run(number, op.at))
            run = proc.current
        assert run is not None
        run.written.add((parsed.step, parsed.key_type.value))
        run.top_step = max(run.top_step, parsed.step)
        if parsed.key_type is KeyType.ROLLBACK:
            run.rollbacks.add(parsed.step)
    elif run is None:
        proc.problems.append(f"{pid}: {parsed.step}.{parsed.key_type.value} landed before any step")
    elif run.ended_at is None and parsed.step < run.top_step:
        pass  # a late `.commit` below the run's later keys: its failure went one step above it
    elif run.ended_at is None:
        run.ended_at = op.at
        run.top_step = max(run.top_step, parsed.step)
        run.outcome = "failed" if parsed.step - 1 in run.rollbacks else "done"
        run.ended_late = op.note == " (late)"
        proc.ended_numbers.add(run.number)
    else:
        _late(proc, pid, parsed, op, run)


def _late(proc: Procedure, pid: str, parsed: ParsedKey, op: LoggedOp, ended: Run) -> None:
    """A key of a run that has ended: a late write of one it wrote is harmless (it must be
    gone by the end); a key above every one it wrote means something ran it again, but for
    the failure its writer records right above a `.commit` it was told had failed, which
    landed late before that: the run goes on, and its next `.commit` ends it, failed."""
    if ended.ended_late and parsed.key_type is KeyType.ROLLBACK and parsed.step == ended.top_step + 1:
        ended.ended_at, ended.outcome, ended.ended_late = None, None, False
        ended.top_step = parsed.step
        ended.rollbacks.add(parsed.step)
        ended.written.add((parsed.step, parsed.key_type.value))
        proc.ended_numbers.discard(ended.number)
        return
    if parsed.step > ended.top_step:
        proc.problems.append(
            f"{pid}: {parsed.step}.{parsed.key_type.value} of run {ended.number} landed at {op.at:.2f} by "
            f"{op.process}, above every key that run wrote before it ended at {ended.ended_at:.2f}: a finished "
            "procedure came back and ran again"
        )
        ended.top_step = parsed.step


def check_runs(
    procedures: dict[str, Procedure],
    history: dict[str, list[HistoryRecord]],
    remaining: dict[str, list[ParsedKey]],
    model: Model,
) -> list[str]:
    """Every run ends once, with one history record of the right outcome; no keys remain."""
    problems: list[str] = []
    for pid, proc in sorted(procedures.items()):
        if pid in model.deleted or proc.operator_deleted:
            continue  # an operator deleted it (or its tree) while it ran: what follows is by design
        problems += proc.problems
        unfinished = [i + 1 for i, r in enumerate(proc.runs) if r.ended_at is None]
        if unfinished:
            problems.append(f"{pid}: run {unfinished[-1]} of {len(proc.runs)} never ended (by the deadline)")
        ended = [r for r in proc.runs if r.ended_at is not None]
        records = history.get(pid, [])
        if len(records) != len(ended):
            said = ", ".join(r.outcome for r in records) or "none"
            problems.append(
                f"{pid}: {len(ended)} run(s) ended ({', '.join(str(r.outcome) for r in ended)}) but history holds "
                f"{len(records)} record(s) ({said})"
            )
            if ended and records and ended[-1].outcome == "done" and records[-1].outcome != "done":
                problems.append(
                    f"{pid}: its last run committed, but its newest history record says {records[-1].outcome}"
                )
        else:
            for i, (run, record) in enumerate(zip(ended, records, strict=True)):
                if (run.outcome == "done") != (record.outcome == "done"):
                    problems.append(f"{pid}: run {i + 1} ended {run.outcome}, but history says {record.outcome}")
    for pid, keys in sorted(remaining.items()):
        if pid in model.deleted or (pid in procedures and procedures[pid].operator_deleted):
            continue
        status = status_of_keys(keys)
        kept = model.keep_failed and pid in model.roots and status is StoredStatus.FAILED
        if latest_key(keys).key_type is KeyType.COMMIT and not kept:
            names = ", ".join(f"{k.step}.{k.key_type.value}" for k in sorted(keys, key=lambda k: k.step))
            problems.append(f"{pid}: keys of an ended procedure remain: {names}")
    return problems


def _requests_honoured(error: str | None) -> set[int]:
    """The operator requests (`op#N`) an error says ended the run: its own request's text
    (`OperatorRequest.describe`, perhaps inherited from an ancestor). A request named further
    in (a child's failure of an earlier run that the procedure's own code reports) did not."""
    text = re.sub(r"^procedure \S+ failed: ", "", error or "")
    if not text.startswith(("cancelled by an operator", "failed by an operator")):
        return set()
    return {int(n) for n in REQUEST_TAG.findall(text)}


def check_requests(
    procedures: dict[str, Procedure], history: dict[str, list[HistoryRecord]], model: Model, left: list[str]
) -> list[str]:
    """Every stored request is honoured or refused once, by the run it was made for."""
    problems = [f"an operator request outlived its procedure: {key}" for key in left]
    actions = {a.number: a for a in model.operator}
    for restart in model.operator:
        for number in _requests_honoured(restart.ended_with):
            action = actions.get(number)
            if action is not None and action.stored_at is not None and action.stored_at < restart.issued_at:
                problems.append(
                    f"{restart.procedure_id}: the run op#{restart.number} ({restart.kind}) began at "
                    f"{restart.issued_at:.2f} failed by op#{number} ({action.kind} of {action.procedure_id}), "
                    f"stored at {action.stored_at:.2f}, before that run began: {restart.ended_with}"[:600]
                )
    for pid, records in sorted(history.items()):
        runs = [r for r in procedures.get(pid, Procedure()).runs if r.ended_at is not None]
        # A first run may inherit its parent's request (it belongs to the parent's run); a
        # later run (a restart, or a child named again by its restarted parent) may not.
        for run, record in list(zip(runs, records, strict=False))[1:]:
            for number in _requests_honoured(record.error):
                action = actions.get(number)
                if action is None or action.stored_at is None:
                    continue
                # An ancestor's request reaches the children its current run creates: it
                # must have been stored in that run of the ancestor, not before it.
                began = run.started_at
                if action.procedure_id != pid and (target := procedures.get(action.procedure_id)) is not None:
                    began = max((r.started_at for r in target.runs if r.started_at <= run.started_at), default=began)
                if began <= action.stored_at:
                    continue
                problems.append(
                    f"{pid}: its run begun at {run.started_at:.2f} ended {record.outcome} by op#{number} "
                    f"({action.kind} of {action.procedure_id}), stored at {action.stored_at:.2f}, before that "
                    "run began"
                )
    return problems
