"""Operator requests (cancel, fail) in a term: the requests known to apply to its
procedures, how they reach runners, and the watch of the store's `requests/` folder.

A runner reads its procedure's request key before every attempt at a step. What that read
cannot reach is a procedure that is not attempting anything: one waiting for its children,
for a lock or for a retry's backoff. `watch_operator_requests` polls the `requests/`
folder for those, and passes each request down to the procedure's unfinished descendants,
so that the children end first and the parent sees the request at its next attempt.

A write that keeps failing backs off for up to `max_retry_delay` between attempts; a request
must not wait that out. Two rules, by what the write is for:

- The writes of a running procedure (a step's state, its children's first keys, its
  commit): a request ends the backoff, and the next attempt raises `OperatorRequested`
  instead of writing, so the procedure fails (or rolls back) as the request asks
  (`OperatorRequests.unless_requested`).
- The writes of a procedure already failing (its `.rollback` key, its `rollback()`, the
  `.commit` that ends it), and a submit's first key: they must go on whatever is
  requested, since the request asks for exactly what they do (a submitted procedure with
  a request fails before its first step; a request can only be written once that key is
  stored, so the submit's next attempt finds its own bytes). A request that arrives during
  a backoff ends that backoff once (`OperatorRequests.first_wakes`), so the failure is
  recorded as soon as the store allows, and the next backoffs run in full (a set event
  would otherwise spend every retry at once).

Before every attempt a runner reads its procedure's request key, so that a request stored
while a step runs stops the procedure before its next step. With a thousand procedures
stepping at once that is a thousand reads per step on the store (a GET each on S3, a
`stat` each on a local disk, taken on the event loop's thread). Looks asked for in the
same turn of the event loop are answered together instead (`RequestLooks`), by one listing
of `requests/`, which shows every request stored before it began, as each of those reads
would have.
"""

from __future__ import annotations

import asyncio
import contextvars
import time
from collections.abc import Awaitable, Callable, Coroutine, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, TypeVar

from procstore._logs import get_logger, procedure_fields
from procstore._runtime.interrupt import RunningStep, RunningSteps
from procstore._runtime.registry import Registry
from procstore._runtime.restart import restart, runs_here
from procstore.errors import ProcedureError, StoreError, describe
from procstore.ids import ProcedureId
from procstore.store.folder import latest_key
from procstore.store.keys import KeyType, ParsedKey
from procstore.store.procedure_store import ProcedureStore
from procstore.store.requests import OperatorRequest, OperatorRequested, RequestKind, RequestStore
from procstore.store.signals import sent_at
from procstore.store.state_store import walk_readable

if TYPE_CHECKING:
    from procstore._runtime.context import ManagerContext

T = TypeVar("T")

logger = get_logger("procstore.runtime")

STALE_REQUEST_AGE = 600.0
"""Seconds after which a request for a procedure the store no longer holds is deleted."""


Spawn = Callable[[Coroutine[Any, Any, None], str], asyncio.Task[None]]
"""`Term.spawn`: a task of the term."""


class RequestLooks:
    """Answers `get(procedure_id)` as `RequestStore.get` would, from a read begun after the call.

    Invariant: a look answers only the calls made before it began (`_waiting` is taken at
    its start, and calls made while it runs wait for the next one), so a request stored
    before a call is always seen by that call's answer. One caller alone is answered by its
    own read; several, by one listing, then a read of each listed request (of every one, if
    the listing fails). A caller while looks come one to a turn of the event loop (a few
    procedures at a time) reads its own request at once, in its own task, as a batch of one
    would, without the batch's task.
    """

    def __init__(self, requests: RequestStore, spawn: Spawn) -> None:
        self._requests = requests
        self._spawn = spawn
        """Starts a task of the term (`Term.spawn`): a stop cancels a look and waits for it."""
        self._waiting: dict[ProcedureId, list[asyncio.Future[OperatorRequest | None]]] = {}
        """Calls made since the current look began, waiting for the next one."""
        self._look: asyncio.Task[None] | None = None
        self._ahead: dict[ProcedureId, asyncio.Future[OperatorRequest | None]] = {}
        """Looks asked for by `look_ahead`, for the next `get` of their procedure."""
        self._this_turn = 0
        """Looks asked for in the current turn of the event loop (0: none counted yet)."""
        self._last_turn = 0
        """Looks asked for in the last turn that had any."""
        self._last_asker: ProcedureId | None = None
        """The procedure whose look was the last one asked for."""

    def get(self, procedure_id: ProcedureId) -> Awaitable[OperatorRequest | None]:
        """The procedure's request, from a look begun after this call or, if there is one,
        after the procedure's last `look_ahead`: await what it returns at once.

        Not a coroutine itself (one frame fewer in every attempt's chain): the look is
        chosen at the call, and the answer is the awaitable returned."""
        if self._ahead:
            answer = self._ahead.pop(procedure_id, None)
            if answer is not None:
                return answer
        if not self._crowded(procedure_id):
            return self._requests.get(procedure_id)
        return self._ask(procedure_id)

    def _crowded(self, procedure_id: ProcedureId) -> bool:
        """Count this look in its turn of the loop; whether looks are batched now: a batch is
        under way, or the last turn with looks had several.

        A procedure looking again with nobody else looking since, no look counted in this
        turn and none batched, is alone: its look is read at once and not counted (a turn's
        count costs a callback at the turn's end, a tenth of a lone step on memory). Several
        procedures looking take turns as askers, so theirs are counted."""
        if procedure_id is self._last_asker and self._this_turn == 0 and self._last_turn <= 1 and self._look is None:
            return False
        self._last_asker = procedure_id
        if self._this_turn == 0:
            asyncio.get_running_loop().call_soon(self._turn_ended)
        self._this_turn += 1
        return self._look is not None or self._last_turn > 1 or self._this_turn > 1

    def _turn_ended(self) -> None:
        self._last_turn, self._this_turn = self._this_turn, 0

    def look_ahead(self, procedure_id: ProcedureId) -> None:
        """Begin the look the procedure's next `get` will answer from, now.

        For a runner whose `execute()` has returned and whose step's write comes next: the
        look goes on while the write does, instead of after it. That moves no boundary of
        the promise: a request stored before this call is seen by the next attempt, one
        stored after it by the attempt after (or by the watch of `requests/`), as with a
        look begun when the write has landed.
        """
        if procedure_id not in self._ahead:
            answer = self._ahead[procedure_id] = self._ask(procedure_id)
            answer.add_done_callback(_retrieved)  # its error is raised by `get`, or dropped

    def forget(self, procedure_id: ProcedureId) -> None:
        """Drop the procedure's look ahead: no `get` will take it (the procedure ended, its
        submit stored nothing), or it would be older than a request stored since (a retry's
        backoff, a wait or a round trip between the look and the next attempt)."""
        self._ahead.pop(procedure_id, None)

    def _ask(self, procedure_id: ProcedureId) -> asyncio.Future[OperatorRequest | None]:
        answer: asyncio.Future[OperatorRequest | None] = asyncio.get_running_loop().create_future()
        self._waiting.setdefault(procedure_id, []).append(answer)
        if self._look is None:
            # In a context of its own, not the first caller's: its requests are every caller's
            # (log fields, spans), and it goes on after that caller's procedure has ended.
            self._look = look = contextvars.Context().run(self._spawn, self._looks(), "procstore:request-looks")
            look.add_done_callback(self._ended)
        return answer

    async def _looks(self) -> None:
        """Look until nobody waits: each look answers the calls made before it began."""
        try:  # begun at the next turn of the loop: the rest of this turn's callers join it
            while self._waiting:
                batch, self._waiting = self._waiting, {}
                await _answer(self._requests, batch)
        except asyncio.CancelledError:
            self._ended(None)
            raise
        self._look = None

    def _ended(self, look: asyncio.Task[None] | None) -> None:
        """The term cancelled the look (a stop, a step-down), maybe before it began: the calls
        waiting for the next one are cancelled with it (their runners are being cancelled)."""
        if look is None or self._look is look:
            self._look = None
            for answer in _pending(self._waiting):
                answer.cancel()
            self._waiting = {}


async def _answer(
    requests: RequestStore, batch: dict[ProcedureId, list[asyncio.Future[OperatorRequest | None]]]
) -> None:
    """Answer `batch`, each caller by a read of its own request (those the listing shows,
    when several ask), run together: a read's error goes to its caller alone (it retries its
    attempt, as after its own read). A failed listing fails nobody: every caller's request is
    read instead, as without a listing. A single store error must not become every caller's
    failure (with `max_retry_times=0`, a whole batch of procedures failed by one 503), nor one
    exception object shared by many procedures' states."""
    wanted = list(batch)
    try:
        if len(batch) > 1:
            try:
                listed = await requests.stored_ids()
            except Exception:
                pass  # read each one instead
            else:
                wanted = [pid for pid in batch if pid in listed]
                # Those it does not show are answered now, not once the reads are done: the
                # answer is as old as the listing, and a request stored since (a `cancel()`
                # that returned meanwhile) must not find their step starting after it.
                _settle({pid: answers for pid, answers in batch.items() if pid not in listed}, {})
        # With `return_exceptions`, a cancel waits for every read: none outlives the look.
        reads = await asyncio.gather(*(requests.get(pid) for pid in wanted), return_exceptions=True)
    except asyncio.CancelledError:
        for answer in _pending(batch):
            answer.cancel()
        raise
    except BaseException as e:  # a simulated crash of the listing: it ends each caller's task, as its own read would
        for answer in _pending(batch):
            answer.set_exception(e)
        return
    _settle(batch, dict(zip(wanted, reads, strict=True)))


def _settle(
    batch: dict[ProcedureId, list[asyncio.Future[OperatorRequest | None]]],
    found: dict[ProcedureId, OperatorRequest | BaseException | None],
) -> None:
    """Answer each caller in `batch` still waiting: its read (an error, a request) or None."""
    for pid, answers in batch.items():
        read = found.get(pid)
        for answer in answers:
            if answer.done():
                continue
            if isinstance(read, BaseException):
                answer.set_exception(read)
            else:
                answer.set_result(read)


def _retrieved(answer: asyncio.Future[OperatorRequest | None]) -> None:
    if not answer.cancelled():
        answer.exception()


def _pending(
    batch: dict[ProcedureId, list[asyncio.Future[OperatorRequest | None]]],
) -> list[asyncio.Future[OperatorRequest | None]]:
    return [answer for answers in batch.values() for answer in answers if not answer.done()]


class OperatorRequests:
    """The requests known to apply to a term's procedures: read from the store, or passed
    down from an ancestor's. A runner checks here, then the store, before every attempt."""

    __slots__ = ("_known", "_metas", "_steps", "_submit_wakes", "_wake", "looks")

    def __init__(
        self, requests: RequestStore, spawn: Spawn, metas: Registry, wake: Callable[[ProcedureId], object]
    ) -> None:
        self._known: dict[ProcedureId, OperatorRequest] = {}
        self._steps = RunningSteps()
        """The steps inside `execute()` now: a request interrupts them at their current await."""
        self._submit_wakes: dict[ProcedureId, asyncio.Event] = {}
        """For each submit whose first write is under way: set by a request for its id, which
        ends that write's backoff (see `first_wakes`)."""
        self._metas = metas
        self._wake = wake
        """Resumes a procedure parked in a durable wait (`Waits.wake`): a request ends the wait."""
        self.looks = RequestLooks(requests, spawn)

    def get(self, procedure_id: ProcedureId) -> OperatorRequest | None:
        return self._known.get(procedure_id)

    def __contains__(self, procedure_id: object) -> bool:
        return procedure_id in self._known

    def __getitem__(self, procedure_id: ProcedureId) -> OperatorRequest:
        return self._known[procedure_id]

    def forget(self, procedure_id: ProcedureId) -> None:
        """Drop the request of an ended run (or one inherited by it): the id runs again, or its tree ended."""
        self._known.pop(procedure_id, None)

    def noted(self, procedure_id: ProcedureId, request: OperatorRequest | None) -> OperatorRequest | None:
        """`request`, what a look for the procedure's request found, noted (`note`) if any.
        Before every attempt a runner takes the request known here, else looks (`looks.get`)."""
        if request is not None:
            self.note(procedure_id, request)
        return request

    def running_step(self, procedure_id: ProcedureId, step: RunningStep | None = None) -> RunningStep:
        """`with requests.running_step(id, last) as step: await execute(...)`: a request noted
        from now on interrupts the step where it awaits (see `procstore._runtime.interrupt`);
        one noted already raises `OperatorRequested` here. `step`: the runner's last
        attempt's, begun again (one object per run)."""
        request = self._known.get(procedure_id)
        if request is not None:
            raise OperatorRequested(request)
        return self._steps.running(procedure_id, step)

    def note(self, procedure_id: ProcedureId, request: OperatorRequest) -> None:
        """Apply an operator request to a procedure and its unfinished descendants."""
        if not self._apply(procedure_id, request) and (submitting := self._submit_wakes.get(procedure_id)):
            submitting.set()
        inherited = OperatorRequest(
            kind=request.kind,
            reason=f"its ancestor {procedure_id} was {'cancelled' if request.kind == 'cancel' else 'failed'}: "
            f"{request.reason}",
            requested_at=request.requested_at,
            requested_by=request.requested_by,
        )
        for child in self._metas.descendants(procedure_id):
            meta = self._metas.get(child)
            if meta is None or not meta.state.is_ended():
                self._apply(child, inherited)

    def _apply(self, procedure_id: ProcedureId, request: OperatorRequest) -> bool:
        """Note `request` unless one is in force, and interrupt the procedure's step or end
        its waits; whether the procedure is registered here."""
        self._steps.interrupt(procedure_id, self._known.setdefault(procedure_id, request))
        meta = self._metas.get(procedure_id)
        if meta is None:
            return False
        meta.requested().set()
        self._wake(procedure_id)
        return True

    def is_submitting(self, procedure_id: ProcedureId) -> bool:
        """A submit's first write for the id is under way."""
        return procedure_id in self._submit_wakes

    @contextmanager
    def submit_wake(self, procedure_id: ProcedureId) -> Iterator[Callable[[], asyncio.Event]]:
        """For a submit's first write: a `wake` for its retries that a request for the id sets."""
        self._submit_wakes[procedure_id] = woken = asyncio.Event()
        try:
            yield self.first_wakes(procedure_id, lambda: woken)
        finally:
            del self._submit_wakes[procedure_id]

    def unless_requested(
        self, procedure_id: ProcedureId, write: Callable[[int], Awaitable[T]]
    ) -> Callable[[int], Awaitable[T]]:
        """`write`, whose retries (attempt 2 on) raise `OperatorRequested` once the procedure
        has a request: the first attempt always goes, so a request read before it changes
        nothing that is already under way."""

        async def attempt(n: int) -> T:
            if n > 1 and (request := self._known.get(procedure_id)) is not None:
                raise OperatorRequested(request)
            return await write(n)

        return attempt

    def first_wakes(
        self, procedure_id: ProcedureId, requested: Callable[[], asyncio.Event]
    ) -> Callable[[], asyncio.Event]:
        """A `wake` for `RetryPolicy.call` that ends the backoff under way when a request
        arrives (`requested()` is set), and no backoff that begins once the request is known."""

        def wake() -> asyncio.Event:
            return asyncio.Event() if procedure_id in self._known else requested()

        return wake


async def watch_operator_requests(ctx: ManagerContext, interval: float) -> None:
    """Every `interval` seconds, apply new requests to the procedures of this term.

    Survives any error: a store outage must not end the watch for the whole term. A failure
    is logged when it begins or changes, not at every look (one a second, for as long as it
    lasts), and its end is logged too.
    """
    failing: str | None = None
    while True:
        await asyncio.sleep(interval)
        try:
            await _look_once(ctx)
        except asyncio.CancelledError:
            raise
        except Exception as e:
            if describe(e) != failing:
                logger.exception("looking for operator requests failed; trying again every %.1fs", interval)
            failing = describe(e)
        else:
            if failing is not None:
                logger.warning("looking for operator requests works again (it failed with %s)", failing)
            failing = None


async def _look_once(ctx: ManagerContext) -> None:
    # One listing for requests and resume nudges alike: `requests/resume/` is inside
    # `requests/`, and each look is a request to an object store for as long as the term lasts.
    listed = await walk_readable(ctx.store.store, ctx.store.requests.prefix)
    found = await ctx.store.requests.list_all(listed)
    await _look_at_signals(ctx, ctx.store.signals.listed_by_procedure(listed))
    stale: list[ProcedureId] = []
    for pid, request in found.items():
        meta = ctx.metas.get(pid)
        if meta is None and ctx.requests.is_submitting(pid) and pid not in ctx.requests:
            ctx.requests.note(pid, request)  # a submit whose write backs off: it wakes
        elif meta is not None:
            if not meta.state.is_ended() and pid not in ctx.requests:
                logger.warning("procedure %s: %s", pid, request.describe(), extra=procedure_fields(pid, meta.type_name))
                ctx.requests.note(pid, request)
        elif (
            not ctx.is_known(pid)
            and time.time() - request.requested_at > STALE_REQUEST_AGE
            and not await ctx.store.holds_keys(pid)
        ):
            # Its procedure ended (and its keys went) before the request was seen, or never existed.
            stale.append(pid)
    if stale:
        logger.info("deleting %d operator requests for procedures the store no longer holds", len(stale))
        await ctx.store.requests.delete(stale)
    for pid, nudge in (await ctx.store.resumes.list_all(listed)).items():
        try:
            await _load_again(ctx, pid, nudge)
        except StoreError as e:  # this procedure's folder, say: the other nudges go on
            logger.warning("procedure %s: acting on its resume nudge failed (%s); trying again", pid, e)


async def _look_at_signals(ctx: ManagerContext, listed: dict[ProcedureId, list[str]]) -> None:
    """Wake the procedures waiting here for a signal that the listing shows one for (each
    reads its signals, and parks again if none is the one it waits for); delete the signals
    of procedures the store no longer holds (they ended, and their last signals were never
    waited for), once old enough that a procedure being submitted cannot be one of them."""
    for pid in ctx.waits.waiting_for_signals(listed):
        ctx.waits.wake(pid)
    now = time.time()
    for pid, keys in listed.items():
        if ctx.is_known(pid):
            continue
        old = [key for key in keys if (sent := sent_at(key)) is None or now - sent > STALE_REQUEST_AGE]
        if old and not await ctx.store.holds_keys(pid):
            logger.info("deleting %d signals of procedure %s, which the store no longer holds", len(old), pid)
            await ctx.store.signals.delete(old)


async def _load_again(ctx: ManagerContext, procedure_id: ProcedureId, nudge: OperatorRequest) -> None:
    """Apply a resume nudge: run the procedure from what the store now holds, unless it runs
    here already, or the nudge is stale (see `_stale`). Deleted once acted on (a refusal is
    logged); left for the next look while an API restart of the procedure is under way.

    Nudges cannot be deleted only if unchanged, so one written while this one was handled
    (another operator's `rewind`, which finds this one in place) is covered by reading the
    store again after the deletion: a newer key that nothing here runs is run.
    """
    if procedure_id in ctx.metas.restarting:
        return
    if runs_here(ctx, procedure_id):
        await ctx.store.resumes.delete([procedure_id])  # it runs what the store holds
        return
    latest = await _latest_key(ctx, procedure_id)
    if latest is None:
        logger.info("procedure %s: nothing to resume, its keys are gone (it ended and was deleted)", procedure_id)
    elif stale := _stale(ctx, procedure_id, nudge, latest):
        logger.warning(
            "ignoring the resume nudge of procedure %s (%s): %s",
            procedure_id,
            nudge.describe(),
            stale,
            extra=procedure_fields(procedure_id),
        )
    else:
        await _run_again(ctx, procedure_id, nudge)
    await ctx.store.resumes.delete([procedure_id])
    if runs_here(ctx, procedure_id) or procedure_id in ctx.metas.restarting:
        return
    if latest is not None and latest.key_type is KeyType.COMMIT:
        await _delete_if_kept_for_the_nudge(ctx, procedure_id)
    now = await _latest_key(ctx, procedure_id)
    if now is not None and now.key_type is not KeyType.COMMIT and str(now) != str(latest):
        logger.info("procedure %s: %s was written while its resume nudge was handled; running it", procedure_id, now)
        await _run_again(ctx, procedure_id, None)


async def _delete_if_kept_for_the_nudge(ctx: ManagerContext, procedure_id: ProcedureId) -> None:
    """A failed root that recovery kept only because a nudge asked to resume it (without
    `keep_failed`) goes once the nudge was refused or stale, as it would have without the
    nudge: its end record first (recovery wrote it; if it is missing, the next start decides)."""
    kept = ctx.recovered.finished.get(procedure_id)
    if ctx.settings.keep_failed or procedure_id in ctx.metas or kept is None or kept.error is None:
        return
    if await ctx.store.holds_keys(procedure_id) and await ctx.store.history.has_ended(procedure_id, kept.run):
        logger.info("procedure %s: deleting it, kept only for the resume nudge", procedure_id)
        await ctx.store.delete_procedure(procedure_id)
        ctx.forget(procedure_id)


async def _run_again(ctx: ManagerContext, procedure_id: ProcedureId, nudge: OperatorRequest | None) -> None:
    """Run the procedure from what the store holds; `nudge`: the operator's, whose who,
    when and why the new run's history record keeps."""
    try:
        await restart(ctx, procedure_id, None, nudged=True, started=None if nudge is None else nudge.action())
    except ProcedureError as e:
        if isinstance(e, StoreError):
            raise  # not acted on (the store failed, or this manager no longer leads): the nudge stays
        logger.error(
            "cannot resume procedure %s as an operator asked: %s", procedure_id, e, extra=procedure_fields(procedure_id)
        )


async def _latest_key(ctx: ManagerContext, procedure_id: ProcedureId) -> ParsedKey | None:
    keys = await ctx.store.procedure_keys(procedure_id)
    return latest_key(keys) if keys else None


def _stale(ctx: ManagerContext, procedure_id: ProcedureId, nudge: OperatorRequest, latest: ParsedKey) -> str:
    """Why the nudge is for an earlier state (acting on it could undo, say, a cancel); ''
    to act on it. Told by store facts: the nudge names the latest step key its operator saw
    or wrote, and an ended procedure whose latest key is another has run since. An
    unfinished one that does not run here is always run: that is what the nudge is for."""
    if latest.key_type is not KeyType.COMMIT:
        return ""
    if nudge.step is not None:
        if latest.step != nudge.step:
            return f"it was for step {nudge.step}, and the procedure has run since (it ended at {latest})"
        return ""
    # A nudge written by an older release carries no step: compared by the clocks, as it was.
    meta = ctx.metas.get(procedure_id)
    if meta is not None and meta.record.end_time is not None and nudge.requested_at < meta.record.end_time.timestamp():
        return "it was written before the procedure ended here"
    return ""


async def request(
    store: ProcedureStore, procedure_id: ProcedureId, kind: RequestKind, reason: str, ctx: ManagerContext | None
) -> OperatorRequest:
    """Write a request for `procedure_id` and apply it at once in the term `ctx` (None on a
    standby: the leader's look finds it).

    Raises `ProcedureError` if the procedure has ended, or is neither known here nor stored.
    Returns the request in force (an earlier one, if the procedure already had one).
    """
    meta = None if ctx is None else ctx.metas.get(procedure_id)
    if meta is not None and meta.state.is_ended():
        raise ProcedureError(f"procedure {procedure_id} has already ended ({meta.state.kind.name}): nothing to {kind}")
    if meta is None:
        # Not run here: a kept FAILED root, a finished child, or one another manager runs.
        await store.check_unfinished(procedure_id, kind)
    wanted = OperatorRequest.new(kind, reason)
    if not await store.requests.put(procedure_id, wanted):
        existing = await store.requests.get(procedure_id)
        if existing is None:  # deleted (or torn again) since: nothing of ours is stored
            raise ProcedureError(
                f"the request for {procedure_id} at {store.requests.key(procedure_id)} changed while it was "
                "written; try again"
            )
        wanted = existing
    if ctx is not None:
        ctx.requests.note(procedure_id, wanted)
    return wanted
