"""What an operator does to a store's procedures: cancel, fail, resume and rewind, as
checks and writes on the store alone. `procstore.Client` and the CLI both call these: they
take no lease and need no manager, so they are safe while managers run (see
`procstore.store.requests` and `procstore.store.restart` for what each write means).

Every refusal is an `OperationRefused` saying why and what to do instead, raised before
anything is written. The CLI turns it into its exit code 6.

Resume and rewind, in order: a rewind deletes the procedure's operator request, writes the
copy, then the nudge. A crash before the copy changes nothing that matters (run it again);
after it, the procedure is unfinished at the copy, which the next start runs, and a resume
(which accepts a latest `.step` right above a `.commit`: a copy not run past) nudges a
running leader to run it. A resume writes only the nudge (the leader writes its copy).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import msgspec

from procstore._client.inventory import status_of_keys
from procstore._client.words import status_word
from procstore.errors import OperationRefused, ProcedureError, ProcedureNotFound
from procstore.ids import ProcedureId
from procstore.store.folder import StoredStatus, decode_or_problem, latest_key
from procstore.store.history import History, HistoryRecord, HistoryStore
from procstore.store.message import ProcedureMessage
from procstore.store.procedure_store import ProcedureStore
from procstore.store.requests import OperatorRequest, RequestKind
from procstore.store.restart import RestartedMeanwhile, RestartPlan, apply_restart, check_restart, plan_restart
from procstore.store.settings import SettingsStore


@dataclass(frozen=True, slots=True)
class Stoppable:
    """An unfinished procedure with a readable latest step: one a request can stop."""

    procedure_id: ProcedureId
    type_name: str
    step: int


async def stoppable(store: ProcedureStore, procedure_id: ProcedureId, kind: RequestKind) -> Stoppable:
    """The procedure, if a `kind` request (cancel, fail) can stop it; `ProcedureNotFound`
    if the store holds no key of it, else `OperationRefused` saying why not."""
    keys = await store.procedure_keys(procedure_id)
    if not keys:
        raise ProcedureNotFound(procedure_id)
    status = status_of_keys(keys)
    latest = latest_key(keys)
    message = None
    if status is StoredStatus.UNFINISHED:
        read = decode_or_problem(await store.store.get(str(latest)))
        message = read if isinstance(read, ProcedureMessage) else None
        if message is None:
            status = StoredStatus.UNREADABLE
    if status in (StoredStatus.COMMITTED, StoredStatus.FAILED):
        raise OperationRefused(f"procedure {procedure_id} has ended ({status_word(status)}): nothing to {kind}")
    if message is None:
        raise OperationRefused(
            f"procedure {procedure_id} is {status.value}; only an unfinished procedure with a readable latest step "
            f"can be asked to {kind}"
        )
    return Stoppable(procedure_id, message.type_name, latest.step)


class AlreadyRequested(OperationRefused):
    """The procedure has a request already (the first one stands): `existing`."""

    def __init__(self, key: str, procedure_id: ProcedureId, existing: OperatorRequest | None) -> None:
        self.existing = existing
        said = existing.describe() if existing else "it changed while this one was written; try again"
        super().__init__(f"procedure {procedure_id} already has a request ({key}): {said}")


async def write_stop_request(
    store: ProcedureStore, procedure_id: ProcedureId, kind: RequestKind, reason: str | None
) -> OperatorRequest:
    """Store a `kind` request for the procedure (create-only); `AlreadyRequested` if it has one."""
    request = OperatorRequest.new(kind, reason)
    if not await store.requests.put(procedure_id, request):
        raise AlreadyRequested(store.requests.key(procedure_id), procedure_id, await store.requests.get(procedure_id))
    return request


@dataclass(frozen=True, slots=True)
class PreparedRestart:
    """A resume or rewind checked and ready to write: nothing is written yet."""

    plan: RestartPlan
    message: ProcedureMessage
    """The state it runs from."""
    to_step: int | None
    record: HistoryRecord | None = None
    """A resume of an ended procedure: its history record, if there is one."""
    notes: list[str] = field(default_factory=list)
    """What the operator should know before the writes (a copy found pending)."""

    @property
    def procedure_id(self) -> ProcedureId:
        return self.plan.procedure_id


@dataclass(frozen=True, slots=True)
class Nudged:
    """What a resume or rewind left for the leader at `key`."""

    key: str
    step: int | None
    """The latest step key the nudge names (a rewind's copy)."""
    wrote_copy: bool
    """A rewind: its copy is written."""
    written: bool
    """False: a nudge was already waiting (`existing`), and covers this one."""
    existing: OperatorRequest | None = None
    notes: list[str] = field(default_factory=list)
    """What the operator should know after the writes."""


async def _plan(store: ProcedureStore, procedure_id: ProcedureId, to_step: int | None) -> RestartPlan:
    try:
        return await plan_restart(store, procedure_id, to_step)
    except ProcedureError as e:
        raise OperationRefused(str(e)) from e


async def _checked(store: ProcedureStore, plan: RestartPlan) -> ProcedureMessage:
    try:
        return await check_restart(store, plan)
    except ProcedureError as e:
        raise OperationRefused(str(e)) from e


async def prepare_resume(store: ProcedureStore, procedure_id: ProcedureId, *, force: bool = False) -> PreparedRestart:
    """Check a resume: refused (a subprocedure, one that finished successfully, one rolled
    back, one that is unfinished, which a manager may be running, unless `force`: for one
    the running manager could not load). A restart's copy no manager has run past is
    resumed: only the nudge is written, which a manager running it ignores."""
    plan = await _plan(store, procedure_id, None)
    pid = plan.procedure_id
    if not plan.ended and not plan.copy_pending and not force:
        raise OperationRefused(
            f"procedure {pid} is unfinished (its latest key is {plan.latest.step}.{plan.latest.key_type.value}): "
            "a manager may be running it, and the next one to start resumes it anyway. Resume is for a "
            f"procedure that has ended: cancel it first (procstore cancel {pid}), or pass --force if the "
            "running manager could not load it (POISONED)"
        )
    message = await _checked(store, plan)
    notes = []
    if plan.copy_pending:
        notes.append(
            f"its latest key, {plan.latest.step}.step, is a restart's copy that no manager has run past (a "
            "rewind or resume interrupted before its nudge, or one a manager is just starting): nudging the "
            "leader to run it (one that runs it already ignores the nudge)"
        )
    record = await HistoryStore(store.store, store.parent_path).find(pid) if plan.ended else None
    if record is not None and (record.outcome == "rolled back" or record.rolled_back):
        how = "cancelled and rolled back" if record.outcome == "cancelled" else "rolled back"
        raise OperationRefused(
            f"procedure {pid} was {how}: resuming would run its later steps over undone work; "
            f"rewind it instead (procstore rewind {pid} --to-step 0 to run it again from the start)"
        )
    return PreparedRestart(plan, message, None, record, notes)


async def carry_out_resume(store: ProcedureStore, prepared: PreparedRestart, reason: str | None) -> Nudged:
    """Write the resume's nudge (`reason` is kept for the new run's history record)."""
    plan = prepared.plan
    pid = plan.procedure_id
    nudge = OperatorRequest.new("resume", reason, plan.latest.step)  # the reason checked before any change
    if not plan.ended and not plan.copy_pending:
        # `--force` on one its manager could not load: the operator's word is newer than
        # any request stored for it. (A request stored after a restart's copy stands.)
        await store.requests.delete([pid])
    nudged = await _nudge(store, pid, nudge, wrote_copy=False)
    if plan.ended and prepared.record is None:
        nudged.notes.append(
            "no history record says whether it was rolled back: the manager checks, and refuses (in its log) "
            "to resume a rolled-back one"
        )
    return nudged


async def prepare_rewind(
    store: ProcedureStore, procedure_id: ProcedureId, to_step: int, *, force: bool = False
) -> PreparedRestart:
    """Check a rewind to `to_step`: refused on an unfinished procedure (a manager may be
    running it) unless `force` (for a store no manager runs on), a subprocedure, one that
    finished successfully, or a step that is not stored or cannot be read."""
    plan = await _plan(store, procedure_id, to_step)
    pid = plan.procedure_id
    if plan.copy_pending and not force:
        raise OperationRefused(
            f"procedure {pid} is unfinished: its latest key, {plan.latest.step}.step, is a restart's copy that "
            "no manager has run past (a rewind or resume interrupted before its nudge, or one a manager is just "
            f"starting). Run it: procstore resume {pid} (a manager that runs it already ignores that); rewind it "
            "once it has ended, or pass --force if no manager runs on this store"
        )
    if not plan.ended and not force:
        raise OperationRefused(
            f"procedure {pid} is unfinished (its latest key is {plan.latest.step}.{plan.latest.key_type.value}): "
            f"a manager may be running it. Cancel it first (procstore cancel {pid}) and rewind it once it has "
            "ended, or pass --force if no manager runs on this store"
        )
    return PreparedRestart(plan, await _checked(store, plan), to_step)


async def carry_out_rewind(store: ProcedureStore, prepared: PreparedRestart, reason: str | None) -> Nudged:
    """Write the rewind: the request goes, the copy, then the nudge. `OperationRefused` if
    another operator restarted it first (nothing of this one written but the deletion)."""
    plan = prepared.plan
    pid = plan.procedure_id
    # Checked (the reason) before anything changes: a refused restart keeps the request.
    asked = OperatorRequest.new("resume", reason, to_step=prepared.to_step)
    # The old request first: left in place, it would fail the rewound run at once. Read
    # before: the ended run's record, if written with the copy, names it.
    stop_request = await store.requests.get(pid)
    await store.requests.delete([pid])
    # An ended run's record the copy may write is kept as long as the store's settings say.
    retention = (await SettingsStore(store.store, store.parent_path).read()).history(History()).retention
    try:
        # The copy keeps who, when and why itself: the nudge may be gone before a manager
        # that runs the copy sees it (the next start runs the copy at its recovery).
        copied = await apply_restart(
            store, plan, prepared.message, retention=retention, started=asked.action(), stop_request=stop_request
        )
    except RestartedMeanwhile as e:
        raise OperationRefused(str(e)) from e
    return await _nudge(store, pid, msgspec.structs.replace(asked, step=copied.step), wrote_copy=True)


async def _nudge(store: ProcedureStore, pid: ProcedureId, nudge: OperatorRequest, wrote_copy: bool) -> Nudged:
    """Write the nudge naming `nudge.step` (the latest key as the leader should find it);
    say truthfully what happened if a nudge was there already."""
    key = store.resumes.key(pid)
    for _ in range(3):
        if await store.resumes.put(pid, nudge):
            return Nudged(key, nudge.step, wrote_copy, written=True)
        existing = await store.resumes.get(pid)
        if existing is None:
            continue  # acted on and deleted since: write ours again
        if wrote_copy or existing.step == nudge.step:
            # The leader deletes a nudge only after acting on it, then reads the store again:
            # it runs what it finds, the copy written above included.
            return Nudged(key, nudge.step, wrote_copy, written=False, existing=existing)
        raise OperationRefused(
            f"a nudge for an earlier state of {pid} is waiting at {key} ({existing.describe()}): the leader deletes "
            "it unused at its next look (within a second or so; with no manager running, at the next start). Run "
            "this command again then"
        )
    raise OperationRefused(f"the nudge at {key} kept changing while it was written; try again")
