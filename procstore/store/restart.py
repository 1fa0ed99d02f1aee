"""Resume and rewind, as writes to the store: what an operator's restart changes.

Step keys are never overwritten, so a restart adds one key: the state to run from, copied
from an earlier `.step` key to `{latest + 1}.step`, as a new run (`ProcedureMessage.run`,
one above the last run's). The copy makes that state the latest
again; every earlier key stays for audit. What may be restarted, by the latest key:

- `.step` or `.rollback` (unfinished): resumed as stored, nothing written. A manager may
  be running it, so only the manager that knows (`ProcedureManager.resume`) acts on it,
  or an operator who says no manager runs (`procstore rewind --force`).
- `.commit` above a `.rollback` (ended FAILED, kept by `keep_failed`): resume copies its
  last `.step`; rewind copies the step asked for. No manager runs an ended procedure, so
  this is safe while managers run.
- `.commit` alone (DONE): refused.
- `.step` right above a `.commit` (`RestartPlan.copy_pending`): a restart's copy that no
  manager has run past yet, say after a `procstore rewind` crashed before its nudge. A
  resume only nudges (writes nothing here): a manager running it ignores the nudge.

Crash points: the copy is one create-only write. Lost answer: the key holds our bytes,
which counts as written. A crash before it changes nothing; after it, the procedure is
unfinished at `latest + 1` and the next start (or the running manager, nudged) runs it.
Two restarts at once: the second to write `latest + 1` gets `RestartedMeanwhile`, having
written nothing (two copies of the same bytes both count as written: one run).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from datetime import UTC, datetime

from procstore.errors import Fenced, LeaseExpired, ProcedureError
from procstore.ids import ProcedureId
from procstore.store.folder import ProcedureKeys, StoredStatus, decode_or_problem
from procstore.store.history import Action, History, HistoryStore, iso, record_from_keys
from procstore.store.keys import MAX_STEP, KeyType, ParsedKey, procedure_dir
from procstore.store.message import MAX_RUN, ProcedureMessage, StepWait
from procstore.store.procedure_store import ProcedureStore
from procstore.store.requests import OperatorRequest, ended_by
from procstore.store.run_origin import run_origin, with_run_origin
from procstore.wake_time import calendar_time


class RestartedMeanwhile(ProcedureError):
    """Another restart (an operator's resume or rewind) wrote the copy's key first.

    Nothing was written: the procedure runs from the other restart's copy.
    """

    def __init__(self, procedure_id: ProcedureId, key: str) -> None:
        super().__init__(
            f"procedure {procedure_id} was restarted by another operator first ({key} was written meanwhile, by "
            "another resume or rewind): this one wrote nothing, and the procedure runs from the other's state. "
            "Look at it again and retry if it still needs it"
        )
        self.procedure_id = procedure_id
        self.key = key


@dataclass(frozen=True, slots=True)
class RestartPlan:
    """What restarting one procedure takes, read from its keys."""

    procedure_id: ProcedureId
    latest: ParsedKey
    source: ParsedKey | None
    """The `.step` key whose state is copied to `latest.step + 1`; None: resumed as stored."""
    ended: bool
    """Its latest key is a `.commit` above a `.rollback`: it ended FAILED and was kept."""
    copy_pending: bool = False
    """Its latest key is a `.step` right above a `.commit`: a restart's copy, not run past yet."""
    newest_message: ParsedKey | None = None
    """Its highest `.step` or `.rollback`: the last run's (whose number the copy's run follows)."""

    @property
    def rolling_back(self) -> bool:
        """Resumed as stored, it continues a rollback."""
        return self.source is None and self.latest.key_type is KeyType.ROLLBACK


async def plan_restart(store: ProcedureStore, procedure_id: ProcedureId, to_step: int | None) -> RestartPlan:
    """How to resume (`to_step` None) or rewind `procedure_id`; `ProcedureError` saying why not."""
    keys = await store.procedure_keys(procedure_id)
    if not keys:
        raise ProcedureError(
            f"procedure {procedure_id} is not in the store: it never existed, or it ended and its keys were "
            "deleted (managers keep a failed procedure's keys with keep_failed=True)"
        )
    folder = ProcedureKeys.of((k.step, k.key_type) for k in keys)
    latest = ParsedKey(store.proc_path, procedure_id, *folder.latest)
    if latest.step >= MAX_STEP:
        raise ProcedureError(f"procedure {procedure_id} is at the highest step number a key can carry ({latest})")
    steps = {k.step: k for k in keys if k.key_type is KeyType.STEP}
    # Only the message right below the commit says how it ended: a rewound procedure has an
    # older `.rollback` further down, from the run before.
    ended = folder.status is StoredStatus.FAILED
    if folder.status is StoredStatus.COMMITTED:
        raise ProcedureError(f"procedure {procedure_id} finished successfully ({latest}): nothing to restart")
    pending = latest.key_type is KeyType.STEP and any(
        k.step == latest.step - 1 and k.key_type is KeyType.COMMIT for k in keys
    )
    newest = None if folder.newest_message is None else ParsedKey(store.proc_path, procedure_id, *folder.newest_message)
    if to_step is None:
        source = steps[max(steps)] if ended and steps else None
        if ended and source is None:
            raise ProcedureError(f"procedure {procedure_id} has no stored step to resume from (keys: {_listed(keys)})")
        return RestartPlan(procedure_id, latest, source, ended, pending, newest)
    if to_step not in steps:
        raise ProcedureError(
            f"procedure {procedure_id} has no step {to_step} to rewind to; its stored steps: "
            f"{', '.join(map(str, sorted(steps))) or 'none'}"
        )
    return RestartPlan(procedure_id, latest, steps[to_step], ended, pending, newest)


async def check_restart(store: ProcedureStore, plan: RestartPlan) -> ProcedureMessage:
    """Read the state the plan runs from, writing nothing: `ProcedureError` saying why it
    cannot run (a value that cannot be read, a subprocedure). Check before changing anything
    else (an operator request is deleted only once the restart is certain)."""
    message = await _read(store, plan.source or plan.latest, plan.procedure_id)
    if message.parent_id is not None:
        raise ProcedureError(
            f"procedure {plan.procedure_id} is a subprocedure of {message.parent_id}: restart its root instead"
        )
    # The copy's run is one above the last run's: read here too (the copy reads it again),
    # so that an unreadable one or a run at the limit refuses before any change.
    if plan.source is not None and max(message.run, (await _last_run(store, plan, message)).run) >= MAX_RUN:
        raise ProcedureError(
            f"procedure {plan.procedure_id} is at run {MAX_RUN}, the highest a stored message can carry: a new "
            "run's copy could not be read by any manager"
        )
    return message


async def _last_run(store: ProcedureStore, plan: RestartPlan, source: ProcedureMessage) -> ProcedureMessage:
    """The newest message (the last run's), `source` itself when it is that one."""
    if plan.newest_message in (None, plan.source):
        return source
    return await _read(store, plan.newest_message, plan.procedure_id)


async def apply_restart(
    store: ProcedureStore,
    plan: RestartPlan,
    message: ProcedureMessage,
    *,
    retention: float = History().retention,
    started: Action | None = None,
    stop_request: OperatorRequest | None = None,
) -> ProcedureMessage:
    """Write the copy the plan needs (if any) of `message` (from `check_restart`); return
    the message to run from. `started`: who asked, when and why, kept in the copy (and so in
    every key of the new run: `procstore.store.run_origin`). `stop_request`: the cancel or
    fail the store held for the procedure before the restart deleted it (the ended run's
    record, if written here, names it when it ended the run). Raises `RestartedMeanwhile` if
    someone else wrote `latest + 1` first (and `LeaseExpired` from a manager's store that no
    longer leads).
    """
    store.keep_unknown_fields(plan.procedure_id, message)
    if plan.source is None:
        return message
    step = plan.latest.step + 1
    # A new run: one above the last run's (a rewind's source may be an older run's step).
    last = await _last_run(store, plan, message)
    run = max(message.run, last.run) + 1
    if plan.ended and plan.newest_message is not None and plan.newest_message.key_type is KeyType.ROLLBACK:
        # The ended run's end record, if whoever ended it did not get to write it (killed
        # between its `.commit` and its record): once the new run's copy is the latest key,
        # nothing else would (create-only: the record its manager wrote stands). It says when
        # the `.commit` was written, and is not written once `retention` has passed since
        # (history swept it: it must not come back as ending now).
        modified = await store.store.walk_modified(procedure_dir(store.proc_path, plan.procedure_id))
        now = datetime.now(UTC).timestamp()
        ended = modified.get(str(plan.latest)) or now
        if now - ended <= retention:
            at = iso(calendar_time(ended)) or ""  # a key's modified time is the store's to say
            record = record_from_keys(
                plan.procedure_id,
                last,
                rolled_back=True,
                ended_at=at,
                started=run_origin(last),
                ended_by=ended_by(stop_request, last.error),
            )
            await HistoryStore(store.store, store.parent_path).put_unrecorded([record])
    if started is not None:
        message = dataclasses.replace(message, extra=with_run_origin(message.extra, run, started))
        store.keep_unknown_fields(plan.procedure_id, message)
    # The copy keeps the step's durable wait: the restarted run waits again for the signal
    # (one stored and not consumed meanwhile is delivered), or until the stored time, as a
    # run resumed after a crash does; and the signals the step consumed stay consumed, with
    # those the last run's newest message names (a failed step's, a later step's for a
    # rewind) whose deletion was cut short: the new run deletes them, never delivers them.
    copied = frozenset(message.consumed)  # a set: a stored list is anyone's to make long
    if later := tuple(key for key in dict.fromkeys(last.consumed) if key not in copied):
        message = dataclasses.replace(message, consumed=message.consumed + later)
    wait = StepWait.of(message)
    try:
        await store.store_procedure(plan.procedure_id, step, message.type_name, message.data, None, run, wait)
    except LeaseExpired:
        raise
    except Fenced as e:
        raise RestartedMeanwhile(plan.procedure_id, e.key or store.key(plan.procedure_id, step, KeyType.STEP)) from e
    return dataclasses.replace(message, parent_id=None, step=step, error=None, run=run)


async def _read(store: ProcedureStore, key: ParsedKey, procedure_id: ProcedureId) -> ProcedureMessage:
    raw = await store.store.get(str(key))
    if raw is None:
        raise ProcedureError(f"procedure {procedure_id}: {key} disappeared while restarting it; try again")
    read = decode_or_problem(raw)
    if isinstance(read, str):
        raise ProcedureError(f"procedure {procedure_id}: {key} cannot be read ({read}); rewind it to another step")
    return read


def _listed(keys: list[ParsedKey]) -> str:
    return ", ".join(f"{k.step}.{k.key_type.value}" for k in keys)
