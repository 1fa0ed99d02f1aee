"""Durable waits in a cluster simulation: the signals it sent, what the steps saw, and the checks.

The simulation sends signals (`SentSignal`, each with a payload `{"sig": N}` that names it)
through the public paths, and a world whose procedures sleep and wait for signals records,
in a `WaitLog`, what each call of `execute` after a wait saw (`Woke`) and what each
procedure's state had consumed when it ended (`WaitLog.consumed`). `check_waits` compares
the two with what docs/guarantees.md ("Durable waits") promises:

- a signal refused by its sender's call is never stored, nor seen by any step;
- a signal to a procedure the store did not hold unfinished (an unknown id, or one whose
  end was stored) is refused, unless the procedure ran again meanwhile;
- a procedure's state never holds one signal twice (consumed once), and holds the signals
  of one name in the order they were sent (one sent after another's send returned comes
  after it), none skipped;
- a wait ends by itself (a sleep, a timeout) no earlier than its wake-up time by the
  manager's clock, a wait with a timeout that ends unsignalled sees `ctx.signals` empty,
  and a signal stored before a wait began is delivered to it rather than let it time out;
- a wait ends unsignalled before its time only when an operator resumed or rewound the
  procedure (its copy carries no wait).
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Literal, Protocol, runtime_checkable

import msgspec

from procstore.store.keys import PROC_PATH, KeyType, ParsedKey
from procstore.testing.cluster_checks import OperatorAction
from procstore.testing.cluster_store import LoggedOp

SIGNALS_FOLDER = "requests/signals/"

_ticks = itertools.count()

Outcome = Literal["accepted", "refused", "unknown"]
"""How a send ended for its caller: returned, refused (`ProcedureError`, not a store's), or
anything else (a store error, a crash: it may or may not have been stored)."""

Target = Literal["waiting", "unfinished", "ended", "unknown", "heal"]
"""What the sender knew of the procedure when it sent: its latest stored step waits for
this signal, or it is unfinished, or its `.commit` is its latest key, or the store never
held it; `heal`: sent by the heal to a procedure still waiting at the end."""


@dataclass
class SentSignal:
    number: int
    procedure_id: str
    name: str
    via: str
    target: Target
    issued_at: float
    looked_at: float
    """When the sender read the procedure's state that `target` says (before `issued_at`
    for the later signals of a burst)."""
    returned_at: float | None = None
    outcome: Outcome = "unknown"
    result: str = ""
    issued_tick: int = field(default_factory=lambda: next(_ticks))
    returned_tick: int | None = None
    """When it was issued and returned, in the order things happened (two at one virtual
    instant may have run in either order): a send that returned before another was issued
    was sent before it."""

    def returned(self, outcome: Outcome, result: str, at: float) -> None:
        self.outcome, self.result, self.returned_at, self.returned_tick = outcome, result, at, next(_ticks)

    def line(self) -> str:
        return (
            f"{self.issued_at:9.2f}  sig#{self.number} {self.name!r} to {self.procedure_id} ({self.target}) "
            f"via {self.via}: {self.outcome} {self.result}"
        )[:220]


@dataclass(frozen=True)
class Woke:
    """A call of `execute` after a durable wait, in a process holding the lease: what it saw."""

    procedure_id: str
    kind: str
    """`sleep`, `until` or `signal`."""
    name: str | None
    """The signal waited for."""
    timeout: bool
    """A signal wait with a timeout."""
    began_at: float
    """Loop time of the call of `execute` that returned the wait (as its stored state says)."""
    wake_at: float | None
    """Wall time, by that call's clock, at which the wait ends by itself (None: never)."""
    seen: tuple[tuple[str, int | None], ...]
    """`ctx.signals`: each name and the number of its signal (None: a payload not the simulation's)."""
    at: float
    wall: float
    consumed_before: tuple[int, ...]
    """The signals its stored state had consumed before this call."""


@dataclass
class WaitLog:
    """What a world's procedures saw after their durable waits."""

    woke: list[Woke] = field(default_factory=list)
    consumed: dict[str, list[int]] = field(default_factory=dict)
    """The signals each procedure's state had consumed when its step returned `done`."""


@runtime_checkable
class RecordsWaits(Protocol):
    """A world whose procedures record what they saw after their waits (`LedgerWorld` does)."""

    waits: WaitLog


def landed_signals(log: Iterable[LoggedOp]) -> dict[int, LoggedOp]:
    """The first landed write of each of the simulation's signals, by its number."""
    found: dict[int, LoggedOp] = {}
    for op in log:
        if not (op.landed and op.created and op.value and SIGNALS_FOLDER in op.key):
            continue
        number = signal_number(op.value)
        if number is not None:
            found.setdefault(number, op)
    return found


class _Stored(msgspec.Struct):
    payload: object = None


def signal_number(value: bytes) -> int | None:
    """The number of a stored signal the simulation sent (None for any other value)."""
    try:
        payload = msgspec.json.decode(value, type=_Stored).payload
    except msgspec.DecodeError:
        return None
    return payload_number(payload)


def payload_number(payload: object) -> int | None:
    number = payload.get("sig") if isinstance(payload, dict) else None
    return number if isinstance(number, int) else None


def check_waits(
    sent: list[SentSignal],
    log: list[LoggedOp],
    waits: WaitLog | None,
    operator: list[OperatorAction],
) -> list[str]:
    """What went against the guarantees of durable waits (see the module's docstring)."""
    problems: list[str] = []
    landed = landed_signals(log)
    ran_again = _step_writes(log)
    seen_by: dict[int, list[Woke]] = {}
    for woke in waits.woke if waits is not None else []:
        for _, number in woke.seen:
            if number is not None:
                seen_by.setdefault(number, []).append(woke)
    for signal in sent:
        if signal.outcome == "refused":
            if signal.number in landed:
                op = landed[signal.number]
                problems.append(f"sig#{signal.number}: refused ({signal.result}), yet stored at {op.at:.2f}: {op.key}")
            if signal.number in seen_by:
                problems.append(f"sig#{signal.number}: refused ({signal.result}), yet a step of its procedure saw it")
        elif signal.outcome == "accepted" and signal.target in ("ended", "unknown"):
            runs = ran_again.get(signal.procedure_id, [])
            end = signal.returned_at if signal.returned_at is not None else signal.issued_at
            if not any(signal.looked_at <= t <= end for t in runs):
                problems.append(
                    f"sig#{signal.number}: accepted for {signal.procedure_id}, which the store did not hold "
                    f"unfinished ({signal.target}) from {signal.looked_at:.2f}, when its sender looked, to its "
                    f"return at {end:.2f}"
                )
    if waits is None:
        return problems
    restarts: dict[str, list[float]] = {}
    for action in operator:
        if action.kind in ("resume", "rewind"):
            restarts.setdefault(action.procedure_id, []).append(action.issued_at)
    by_number = {s.number: s for s in sent}
    for woke in waits.woke:
        problems += _check_woke(woke, restarts.get(woke.procedure_id, []), sent, seen_by)
    for pid, consumed in sorted(waits.consumed.items()):
        problems += _check_consumed(pid, consumed, by_number, sent, seen_by, bool(restarts.get(pid)))
    return problems


def _step_writes(log: Iterable[LoggedOp]) -> dict[str, list[float]]:
    """When a key of each procedure other than its end landed: a send that overlaps one may
    have found the procedure unfinished (a resume's or rewind's run, say)."""
    found: dict[str, list[float]] = {}
    for op in log:
        if op.landed and op.created and op.kind not in ("delete", "batch_delete"):
            for key in op.key.split(","):
                parsed = ParsedKey.parse(PROC_PATH, key)
                if parsed is not None and parsed.key_type is not KeyType.COMMIT:
                    found.setdefault(str(parsed.procedure_id), []).append(op.at)
    return found


def _restarted_between(restarts: list[float], began: float, at: float) -> bool:
    return any(began <= t <= at for t in restarts)


def _check_woke(woke: Woke, restarts: list[float], sent: list[SentSignal], seen_by: dict[int, list[Woke]]) -> list[str]:
    pid = woke.procedure_id
    where = f"{pid}: the call of execute at {woke.at:.2f} after its {woke.kind} wait begun at {woke.began_at:.2f}"
    names = {name for name, _ in woke.seen}
    if woke.kind != "signal" and names:
        return [f"{where} saw signals {sorted(names)} after a sleep"]
    if woke.kind == "signal" and names - {woke.name}:
        return [f"{where} for {woke.name!r} saw signals of other names: {sorted(names)}"]
    if names:
        return []
    if _restarted_between(restarts, woke.began_at, woke.at):
        return []  # an operator's resume or rewind: its copy carries no wait, and the next step runs at once
    if woke.wake_at is None:
        return [f"{where} for {woke.name!r} (no timeout) ended with ctx.signals empty"]
    problems = []
    if woke.wall < woke.wake_at - 1e-6:
        problems.append(
            f"{where} came {woke.wake_at - woke.wall:.2f}s before its wake-up time (wall {woke.wake_at:.2f})"
        )
    if woke.kind == "signal":
        # A signal whose send returned before the wait began was stored then: the wait reads
        # it, rather than time out (unless a step saw it already: consumed, or about to be).
        for signal in sent:
            if (
                signal.procedure_id == pid
                and signal.name == woke.name
                and signal.outcome == "accepted"
                and signal.returned_at is not None
                and signal.returned_at < woke.began_at
                and signal.number not in seen_by
            ):
                problems.append(f"{where} for {woke.name!r} timed out, though sig#{signal.number} was stored before it")
                break
    return problems


def _check_consumed(
    pid: str,
    consumed: list[int],
    by_number: dict[int, SentSignal],
    sent: list[SentSignal],
    seen_by: dict[int, list[Woke]],
    restarted: bool,
) -> list[str]:
    problems = []
    twice = sorted({n for n in consumed if consumed.count(n) > 1})
    if twice:
        problems.append(f"{pid}: its state consumed signals {twice} more than once (in order: {consumed})")
    position = {n: i for i, n in enumerate(consumed)}
    for later in consumed:
        b = by_number.get(later)
        if b is None:
            continue
        for a in sent:
            if (
                a.procedure_id != pid
                or a.name != b.name
                or a.outcome != "accepted"
                or a.returned_at is None
                or a.returned_tick is None
                or a.returned_tick > b.issued_tick
            ):
                continue
            if a.number in position and position[a.number] > position[later]:
                problems.append(
                    f"{pid}: consumed sig#{later} before sig#{a.number} of the same name {a.name!r}, "
                    f"though sig#{a.number}'s send returned (at {a.returned_at:.2f}) before sig#{later}'s "
                    f"began (at {b.issued_at:.2f}; consumed in order: {consumed})"
                )
            elif a.number not in position and a.number not in seen_by and not restarted:
                problems.append(
                    f"{pid}: consumed sig#{later} but never sig#{a.number} of the same name {a.name!r}, "
                    f"whose send returned (at {a.returned_at:.2f}) before sig#{later}'s began (at {b.issued_at:.2f})"
                )
    return problems
