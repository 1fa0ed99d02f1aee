"""`Leadership`: the task that keeps a manager's lease, and the owner of its terms.

A manager with `lease=` is a standby until it wins the lease; it then begins a `Term` (a
fresh context that recovers everything the store holds, as `start()` does), holds it as
`term`, and renews the lease every `ttl / 4` seconds. The term ends, with every runner
cancelled and awaited, when:

- the lease is found held by another manager (a renewal's compare-and-swap is refused);
- no renewal succeeded in time: at `ttl - stop_margin` seconds after the last renewal was
  sent, before any standby can take over (see `procstore._runtime.lease` for the clocks);
- a runner was refused a write because the lease ran out (`LeaseExpired`), which can
  happen before this task notices, for instance after the process was paused.

A runner that finds another manager's value in a step key while this manager still holds
the lease (the late write of a paused former leader) makes the term restart: the new
term reloads every procedure from the store, that value included, and goes on from it.

Before any term, `start()` checks the lease: a store for managers with a lease must keep
its promise of conditional writes (`check_lease_support`), and a manager without `lease=`
refuses a store whose lease has a live holder (`refuse_if_lease_is_live`). Such a manager
runs every procedure the store holds, the leader's included: each step would run twice,
and the two managers' identical bytes read as each one's own earlier write, so fencing
never notices. A lease is *live* when its holder is seen renewing it: stored records carry
no wall-clock time (no two machines' clocks are compared), so a record is judged as a
standby judges it. Released, or no lease object: not live, at once. Otherwise (unreadable
records too) the version is watched for the stored TTL times `1 + drift`: a change that
is not a release means a holder renews it (live, refused); none means its holder stopped
renewing, as a standby would then take it over (not live, the start goes on).
"""

from __future__ import annotations

import asyncio
import contextlib
import time

from procstore._logs import get_logger
from procstore._runtime.lease import LEASE_KEY, Lease, LeaseKeeper, LeaseRecord
from procstore._runtime.lease_clock import LeaseClock
from procstore._runtime.telemetry import timed
from procstore._runtime.term import Term, TermLease, TermSettings, obeying_the_store
from procstore.errors import Fenced, LeaseExpired, LeaseHeld, ManagerStopped, StoreError, StoreUnavailable
from procstore.store.deletes_in_doubt import DeletesInDoubt
from procstore.store.keys import parent_folder
from procstore.store.probe import ConditionalWritesIgnored, probe_conditional_writes
from procstore.store.state_store import StateStore

logger = get_logger("procstore.lease")


class Leadership:
    """Owns the `LeaseKeeper`, the `procstore:lease` task and the terms of one manager.

    The same interface as `SingleTerm`, a manager's terms without a lease.
    """

    def __init__(
        self,
        settings: TermSettings,
        store: StateStore,
        lease: Lease,
        *,
        highest_epoch: int = 0,
        deletes_in_doubt: DeletesInDoubt | None = None,
    ) -> None:
        self.settings = settings
        self.deletes_in_doubt = deletes_in_doubt
        """The manager's: its terms share it (`ProcedureStore.deletes_in_doubt`)."""
        self.telemetry = settings.telemetry
        self.keeper = LeaseKeeper(store, lease_key(settings.parent_path), lease)
        # Fencing tokens never go backwards, not even across this manager's restarts.
        self.keeper.highest_epoch = highest_epoch
        self.term: Term | None = None
        """The current term, or the last one: its metadata stays readable after it ends."""
        self.is_leading = False
        """While a term runs (the lease itself may lapse first)."""
        self._task: asyncio.Task[None] | None = None
        self._stopped = False
        self._broken = asyncio.Event()
        self._leading_changed = asyncio.Event()

    async def start(self) -> None:
        """Try the lease once (leading at once if it is free), then keep at it in a task."""
        started = time.time_ns()
        leading = await self.keeper.acquire_once()
        if leading:
            await self._begin(started)
        # Renewals must run while a long recovery does.
        self._task = asyncio.get_running_loop().create_task(self._run(), name="procstore:lease")
        if leading and self.term is not None:
            await self.term.wait_recovered()

    async def stop(self) -> None:
        """Cancel the task and end the term, as a kill would: the lease is kept until `release()`."""
        self._stopped = True
        self._leading_changed.set()  # wakes `wait_until_leading`, which then raises
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None
        await self._end(None)

    async def release(self) -> None:
        """Mark the lease released (if the stored record is still this manager's), so that a
        standby takes over at once; after `stop()`."""
        await self.keeper.release()

    async def close(self) -> None:
        await self.keeper.store.close()

    def _term_lease(self) -> TermLease:
        """What a term begun now takes from this leadership (its epoch is the fencing token)."""
        keeper = self.keeper
        lease = keeper.lease
        return TermLease(
            on_fenced=self.on_fenced,
            check_writable=keeper.check_writable,
            is_holding=lambda: keeper.is_holding,
            fencing_token=keeper.epoch,
            keep_inherited_until=time.monotonic() + lease.late_write_grace,
            adopt_interval=lease.adopt_interval,
            holder=keeper.holder,
        )

    def on_fenced(self, fenced: Fenced) -> None:
        """A runner was fenced: let the task end or restart the term (never from the runner)."""
        if isinstance(fenced, LeaseExpired):
            logger.error("%s", fenced)
        else:
            logger.warning("%s; reloading every procedure from the store", fenced)
        self._broken.set()

    async def wait_until_leading(self) -> None:
        """Return once leading; raise `ManagerStopped` if the manager stops first."""
        while not (self.is_leading or self._stopped):
            self._leading_changed.clear()
            await self._leading_changed.wait()
        if self._stopped:
            raise ManagerStopped(what="waiting to lead")

    async def _begin(self, acquiring_since: int | None = None) -> None:
        """Begin a term; its recovery runs in its own task, so renewals go on meanwhile.

        `acquiring_since`: `time.time_ns()` when the attempt that won the lease began, where
        its span starts (a standby's attempts that lose make no span)."""
        self._broken.clear()
        epoch = self.keeper.epoch or 0
        logger.info("%s leads (lease epoch %d)", self.keeper.holder, epoch)
        attributes = {"procstore.lease.holder": self.keeper.holder, "procstore.lease.epoch": epoch}
        with self.telemetry.span("procstore.lease.acquire", start_ns=acquiring_since, **attributes):
            self.telemetry.lease_gained(epoch)
        self.term = Term(
            await obeying_the_store(self.settings), self._term_lease(), deletes_in_doubt=self.deletes_in_doubt
        )
        self.term.begin()
        self.is_leading = True
        self._leading_changed.set()

    async def _end(self, why: str | None) -> None:
        """End the term; `why` it ends, unless the manager stops."""
        if self.is_leading:
            if why is not None:
                logger.warning("%s stops leading: %s", self.keeper.holder, why)
            self.telemetry.lease_lost()
        self.is_leading = False
        self._leading_changed.set()
        if self.term is not None:
            await self.term.end()

    async def _run(self) -> None:
        interval = self.keeper.lease.renew_interval
        while True:
            try:
                await self._step(interval)
            except Exception:
                # This task dying would leave a manager that neither leads nor takes over.
                logger.exception("%s: error in the lease task; trying again", self.keeper.holder)
                await asyncio.sleep(interval)

    async def _step(self, interval: float) -> None:
        """One turn: a standby looks at the lease; a leader waits, then renews or ends its term."""
        if not self.is_leading:
            await self._stand_by(interval)
            return
        # Wait until the renewal is due: an interval after the last one was sent, or at once
        # after a failed attempt, so that every second left is used for trying again.
        wait = min(self.keeper.seconds_to_renewal, self.keeper.seconds_left)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._broken.wait(), timeout=max(wait, 0))
        if self._broken.is_set():
            holding = self.keeper.is_holding
            await self._end("a runner was fenced" if holding else "the lease ran out before a write")
            if holding:
                await self._begin()
            return
        if self.term is not None and (error := self.term.recovery_error()) is not None:
            # Leading without running anything helps nobody: give the lease up, so that
            # this or another manager tries again.
            self.keeper.give_up()
            await self._end(f"recovery failed: {type(error).__name__}: {error}")
            await self.keeper.release()
            return
        await self._renew()

    async def _stand_by(self, interval: float) -> None:
        started = time.time_ns()
        try:
            won = await self.keeper.acquire_once()
        except StoreError as e:
            logger.warning("cannot look at the lease: %s", e)
            won = False
        if won:
            await self._begin(started)
        else:
            await asyncio.sleep(interval)

    async def _renew(self) -> None:
        keeper = self.keeper
        if keeper.seconds_left <= 0:
            keeper.give_up()
            await self._end("no renewal succeeded in time")
            return
        with timed() as elapsed:
            renewed = await self._renew_hedged()
        self.telemetry.lease_renewed(elapsed())
        if renewed is False:
            leader = keeper.leader
            await self._end(f"the lease is held by {leader}" if leader else "its renewal landed too late to count on")

    async def _renew_hedged(self) -> bool | None:
        """One renewal, as `renew_once` answers it; None if no attempt succeeded in time.

        No attempt is abandoned while the lease lasts: a slow store's answer (one moto
        process serving a leader's recovery) is still worth having. An attempt that has not
        answered within a renewal interval (a request the store holds) gets a second one
        beside it, on a fresh request; both write the same record, so whichever lands second
        is refused and reads back its twin (see `LeaseKeeper._write`). The first answer
        decides, and the other attempt is cancelled.
        """
        keeper = self.keeper
        attempts: set[asyncio.Task[bool]] = set()
        try:
            while keeper.seconds_left > 0:
                if len(attempts) < 2:
                    attempts.add(asyncio.get_running_loop().create_task(keeper.renew_once()))
                timeout = min(keeper.lease.renew_interval, keeper.seconds_left)
                done, attempts = await asyncio.wait(attempts, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
                for task in done:
                    if (error := task.exception()) is None:
                        return task.result()
                    if not isinstance(error, StoreError):
                        raise error
                    logger.warning("lease renewal failed (%s); %.2fs left to renew", error, keeper.seconds_left)
                if done and not attempts:
                    # A short pause, so that a store refusing at once is not asked in a tight loop.
                    await asyncio.sleep(min(keeper.lease.renew_interval / 8, max(keeper.seconds_left, 0)))
            return None
        finally:
            for task in attempts:
                task.cancel()
            await asyncio.gather(*attempts, return_exceptions=True)


def lease_key(parent_path: str) -> str:
    """The lease's key under a manager's `parent_path`."""
    return f"{parent_folder(parent_path)}{LEASE_KEY}"


async def check_lease_support(state_store: StateStore, lease_folder: str) -> None:
    """A store for managers with a lease must promise conditional writes, and keep that
    promise when tried (on a scratch key under `lease_folder`); `StoreUnavailable` if not."""
    remedy = "use S3, GCS, a local directory or memory://, or run a single manager without `lease=`"
    if not (state_store.supports_compare_and_swap and state_store.supports_create_only):
        raise StoreUnavailable(
            f"{state_store.url}: a manager with a lease needs compare-and-swap and create-only writes, which "
            f"this store ({type(state_store).__name__}) cannot guarantee across processes; {remedy}"
        )
    try:
        await probe_conditional_writes(state_store, lease_folder)
    except ConditionalWritesIgnored as e:
        raise StoreUnavailable(f"{e}: a manager with a lease cannot be fenced on this store; {remedy}") from e
    except StoreError as e:
        raise StoreUnavailable(
            f"{state_store.url}: a manager with a lease could not try a conditional write ({e}); check that "
            "these credentials may write to the store"
        ) from e


LOOKS_PER_TTL = 8
"""How often the lease is read while watched: a live holder renews four times a TTL."""


async def refuse_if_lease_is_live(store: StateStore, key: str, clock: LeaseClock | None = None) -> None:
    """Return once the lease at `key` is absent, released or expired; raise `LeaseHeld`
    (naming the key, the holder and what to do) if its holder renews it meanwhile.

    Waits up to the stored TTL times `1 + drift` for a lease left by a holder that did not
    release it (killed, say). Raises `StoreError` if the store cannot be read.
    """
    clock = clock or LeaseClock()
    found = await store.get_versioned(key)
    if found is None:
        return
    raw, version = found
    record = _decoded(raw)
    if record is not None and record.released:
        return
    ttl = record.ttl if record is not None else Lease().ttl
    watch = ttl * (1 + Lease().drift)
    logger.warning(
        "%s%s names %s and was not released: watching it for up to %.1fs, as a manager without `lease=` must not "
        "run while a leader renews it",
        store.url,
        key,
        record.holder if record is not None else "no readable holder",
        watch,
    )
    deadline = clock.now() + watch
    while (left := deadline - clock.now()) > 0:
        await asyncio.sleep(min(ttl / LOOKS_PER_TTL, left))
        found = await store.get_versioned(key)
        if found is None:
            return  # deleted by hand: nobody holds it
        raw, now_version = found
        if now_version == version:
            continue
        renewed = _decoded(raw)
        if renewed is not None and renewed.released:
            return
        raise _held(store, key, renewed)
    logger.info("%s%s was not renewed for %.1fs: its holder is gone; starting", store.url, key, watch)


def _decoded(raw: bytes) -> LeaseRecord | None:
    try:
        return LeaseRecord.decode(raw)
    except ValueError:
        return None  # a torn write: judged by whether its version changes, as a standby does


def _held(store: StateStore, key: str, record: LeaseRecord | None) -> LeaseHeld:
    holder = record.holder if record is not None else "an unreadable record"
    about = "" if record is None else f" (epoch {record.epoch}, ttl {record.ttl:g}s)"
    return LeaseHeld(
        f"{store.url}{key}: the lease of this store is held by {holder}{about}, which renewed it while this manager "
        "looked: a manager leads this store, and one without `lease=` would run its procedures a second time. "
        "Start this manager with a `lease=` (it then stands by and takes over when that leader stops), or stop "
        "that leader (a clean stop releases the lease at once; a killed one's expires a TTL after its last "
        "renewal) and start this one again",
        key=key,
        holder=holder,
    )
