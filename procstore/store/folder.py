"""What a procedure's folder of keys means: the one reading of `{id}/{step:010}.{type}`.

GreptimeDB's reading rules (`common_procedure::store::ProcedureStore::load_messages`), which
procstore keeps:

- the key at the highest step decides: `.step` is unfinished (resume it), `.rollback` is
  failed (run its rollback), `.commit` is finished (delete its keys);
- a `.commit` is empty, a `.step` or `.rollback` holds a `ProcedureMessage`;
- a value that cannot be decoded is logged and its procedure skipped, never deleted, and
  never stops the others from loading;
- a key of another shape is ignored.

procstore's deliberate differences, each for a store GreptimeDB's rules read one way only
by chance or not at all:

- At one step, a `.commit` ranks above a `.rollback` above a `.step` (`latest_first`).
  GreptimeDB keeps the first key listed at the highest step, which is the same key only
  because a listing is sorted (`commit` < `rollback` < `step`); the rank here does not
  depend on the order keys come in.
- A `.commit` above a `.rollback` (the highest message below the commit's step) is
  `FAILED`: the procedure failed and ended (a root kept by `keep_failed`, or a child whose
  parent is still alive). GreptimeDB sees only a finished procedure and deletes it. A
  message at the commit's own step is not the one it ends: procstore writes a commit above
  the message it ends, and a message beside it is a former leader's write that landed late
  (`Runner._message_step` in `procstore._runtime.runner` says where it can land and why).
  Only a folder with no message below its commit (never one procstore wrote) reads the
  message at the commit's step, ranked as above.
- A finished procedure's highest message below its `.commit` is read for its parent: a
  finished child of a live parent is kept for that parent (GreptimeDB deletes it, and a
  re-submit of the parent would run it again). Unreadable there, the procedure is kept.
- A `.step` right above a `.commit` is a restart's copy (`procstore resume` or `rewind`):
  unfinished again. GreptimeDB reads it the same way (the highest key is a `.step`).
- Message fields that procstore does not know (GreptimeDB's `context`, say) are read and
  written back on every key procstore writes for the procedure (`ProcedureMessage.extra`).
  The `run` field procstore adds is one GreptimeDB ignores.
- Elsewhere, each beside the code it constrains: a key is one only in the exact shape
  written, never one GreptimeDB's right-to-left parser would also take, nor above step
  2^32 - 1 (`keys.ParsedKey.parse`); a message that cannot be read is reported and kept,
  where GreptimeDB only logs it (`ProcedureStore.load_messages`); with managers sharing a
  store by lease, an unfinished-looking procedure without a step 0 is a stray a paused
  leader re-created, and an empty latest value a torn create (`skip_strays`).
- What GreptimeDB never reads, it cannot act on: `requests/` (operator requests and
  resume nudges) and `history/` (end records). docs/stores.md, "What GreptimeDB sees",
  says what a switch in either direction does.
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Iterable
from dataclasses import dataclass

from procstore.store.keys import KeyType, ParsedKey, StepAndType
from procstore.store.message import MessageDecodeError, ProcedureMessage

_RANK = {KeyType.STEP: 0, KeyType.ROLLBACK: 1, KeyType.COMMIT: 2}


def latest_first(key: StepAndType) -> tuple[int, int]:
    """The latest-step rule as a sort key: the highest step wins, and at one step a
    `.commit` over a `.rollback` over a `.step`."""
    return key[0], _RANK[key[1]]


def latest_key(keys: Iterable[ParsedKey]) -> ParsedKey:
    """The latest of a non-empty collection of one procedure's keys (`latest_first`)."""
    return max(keys, key=lambda k: latest_first((k.step, k.key_type)))


class StoredStatus(enum.StrEnum):
    """A procedure's status as its keys tell it (the latest-step rule)."""

    UNFINISHED = "unfinished"
    """Highest key `.step`: the next start resumes it."""
    COMMITTED = "committed"
    """Highest key `.commit`: finished; its keys are waiting to be deleted."""
    ROLLING_BACK = "rolling back"
    """Highest key `.rollback`: failed; the next start (re)runs its rollback."""
    FAILED = "failed"
    """Highest key `.commit` above a `.rollback`: it failed and ended, its rollback (if it
    has one) run to its end. The keys do not say whether it had a rollback: a procedure
    that rolled back and one without rollback (kept by `keep_failed`) are stored alike."""
    UNREADABLE = "unreadable"
    """Its highest value cannot be decoded: recovery skips it and leaves it alone."""
    PARENT_CYCLE = "parent cycle"
    """Its parent links form a cycle (a corrupt or hand-edited store): nothing resumes it."""


@dataclass(frozen=True, slots=True)
class ProcedureKeys:
    """One procedure's keys, read by the latest-step rule."""

    latest: StepAndType
    """The key at the highest step (ranked by `latest_first`)."""
    newest_message: StepAndType | None
    """The highest key that holds a message (not a `.commit`); with a `.commit` latest, the
    highest one below the commit's step (the message the commit ends: its parent, type and
    outcome), or, with none below, the highest at its step. None if every key is a `.commit`."""
    lowest: int
    """The lowest step: an unfinished procedure always has 0 (steps start there, and only
    a finished procedure loses keys)."""

    @classmethod
    def of(cls, keys: Iterable[StepAndType]) -> ProcedureKeys:
        """Read a non-empty collection of one procedure's keys, in any order."""
        ordered = sorted(keys, key=latest_first)
        top = ordered[-1]
        messages = [k for k in ordered if k[1] is not KeyType.COMMIT]
        if top[1] is KeyType.COMMIT:
            messages = [k for k in messages if k[0] < top[0]] or messages
        return cls(top, messages[-1] if messages else None, ordered[0][0])

    @property
    def below_commit(self) -> StepAndType | None:
        """With a `.commit` latest, the message below it that says how it ended."""
        return self.newest_message if self.latest[1] is KeyType.COMMIT else None

    @property
    def status(self) -> StoredStatus:
        kind = self.latest[1]
        if kind is KeyType.STEP:
            return StoredStatus.UNFINISHED
        if kind is KeyType.ROLLBACK:
            return StoredStatus.ROLLING_BACK
        return ended_as(None if self.newest_message is None else self.newest_message[1])


def ended_as(below: KeyType | None) -> StoredStatus:
    """What a `.commit` ends its procedure as, by the highest message below it (its key
    type): `FAILED` above a `.rollback`, else `COMMITTED`."""
    return StoredStatus.FAILED if below is KeyType.ROLLBACK else StoredStatus.COMMITTED


def decode_or_problem(raw: bytes | Exception | None, step: int | None = None) -> ProcedureMessage | str:
    """The message a value read holds, or why there is none: the one wording of a key that
    vanished, could not be read, or holds no valid message. With `step`, the key's step
    number replaces the message's (resuming writes at the key's step + 1, never over a key)."""
    if raw is None:
        return "the key vanished while it was being read (deleted meanwhile?)"
    if isinstance(raw, Exception):
        return f"cannot be read: {type(raw).__name__}: {raw}"
    try:
        message = ProcedureMessage.decode(raw)
    except MessageDecodeError as e:
        return f"is not a valid procedure message: {e}"
    if step is not None and message.step != step:
        return dataclasses.replace(message, step=step)
    return message
