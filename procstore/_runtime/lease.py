"""Leadership through the store: one lease object, renewed by compare-and-swap.

Several managers on one store elect a leader without any other service. The lease is a
small JSON object (`LeaseRecord`) at `{parent_path}lease/procedures.json`. The holder
rewrites it every `ttl / 4` seconds with `put_if_version` (S3 `If-Match`, a file lock
locally); a standby that sees the same version for longer than the TTL replaces it, again
by compare-and-swap, so exactly one standby wins.

Clocks. No two machines' wall clocks are compared. Each side measures on its own
`LeaseClock`, which counts the time its machine spends suspended (`CLOCK_BOOTTIME`):

- the holder counts its lease from the moment it *sent* the renewal that succeeded, and
  stops writing `stop_margin` before `ttl` has passed since then;
- a standby counts from the moment a *read* returned a version it had not seen, and takes
  over only after `ttl * (1 + drift)` more seconds without a change.

A read that returns a version ends after that version was written, which was after its
writer sent it, so the holder's window closes first provided the two clocks' *rates*
differ by less than `drift` (5% by default; quartz clocks differ by about 0.01%) and a
write reaches the store within `stop_margin` of being sent. A holder that is paused
(SIGSTOP, a long GC, a frozen VM) past its lease learns it on waking: every write first
checks the lease and is refused with `LeaseExpired`. A holder whose machine was suspended
since its last renewal, however briefly, takes its lease as lapsed (see `lease_clock`). A
write already past that check when the pause began can still land late; step keys are create-only, so it cannot replace
anything the new leader wrote (see docs/many-managers.md).
"""

from __future__ import annotations

import os
import socket
import uuid
import warnings
from dataclasses import dataclass, field
from typing import Annotated, overload

import msgspec
import orjson

from procstore._logs import get_logger
from procstore._runtime.lease_clock import SUSPEND_TOLERANCE, LeaseClock
from procstore.errors import LeaseExpired, StoreError
from procstore.store.message import UNDECODABLE
from procstore.store.state_store import StateStore

logger = get_logger("procstore.lease")

LEASE_FOLDER = "lease/"
"""The lease's folder under the manager's `parent_path` (also where `start()` probes the store)."""
LEASE_KEY = f"{LEASE_FOLDER}procedures.json"
"""Where the lease lives, under the manager's `parent_path`."""
NO_HOLDER = ""
"""The holder of a stored lease that cannot be read (`LeaseKeeper` reads it as held by nobody)."""


def default_holder_name() -> str:
    """`host:pid:random`: unique per manager, and says where the leader runs."""
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"


class _Renamed:
    """An older name of a `Lease` option, still read with a warning (never a constructor
    argument). A descriptor, not a `__getattr__`: the name stays in `dir()` and on the class,
    and a type checker still rejects a misspelt attribute of a `Lease`."""

    def __init__(self, option: str) -> None:
        self.option = option
        self.name = ""

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name

    @overload
    def __get__(self, lease: None, owner: type) -> _Renamed: ...
    @overload
    def __get__(self, lease: Lease, owner: type) -> float: ...
    def __get__(self, lease: Lease | None, owner: type) -> float | _Renamed:
        if lease is None:
            return self
        warnings.warn(f"Lease.{self.name} is deprecated: use Lease.{self.option}", DeprecationWarning, stacklevel=2)
        value: float = getattr(lease, self.option)
        return value


@dataclass(frozen=True, slots=True)
class Lease:
    """How a manager takes part in leadership (`ProcedureManager(url, lease=Lease())`).

    Args:
        ttl: seconds a lease lasts after its last renewal. A dead leader is replaced after
            about `ttl * (1 + drift)` seconds; a shorter TTL also means more writes (four
            renewals per TTL) and less slack for a slow store.
        holder: this manager's name in the lease, which standbys report in `NotLeader`;
            make it something a client can route to (`"cp-2.internal:7000"`). Must be
            unique among the managers of a store.
        drift: the largest relative difference between two managers' clock rates.
        stop_margin: seconds before the lease would end at which a holder that could not
            renew stops writing; covers the time a sent write takes to reach the store.
            Defaults to a fifth of the TTL.
        late_write_grace: seconds after winning the lease during which a procedure resumed
            from the store keeps its keys when it finishes (they are deleted afterwards). A
            former leader that was paused with a write already sent can deliver it when it
            resumes; while the keys are there, that write cannot re-create one. Also how
            long a folder whose deletion failed waits before it is created again (a request
            that failed may still land). Defaults to five TTLs.
        adopt_interval: seconds between a leader's looks for procedures stored after its
            recovery (by a submit that lost the lease while writing, or a late write); each
            look lists the store. Defaults to three TTLs.
        clock: how this manager measures the lease's time (a `LeaseClock`: by default one
            that counts suspend, `CLOCK_BOOTTIME` on Linux); tests inject their own.
    """

    ttl: float = 10.0
    holder: str = field(default_factory=default_holder_name)
    drift: float = 0.05
    # Each option has one name: left out (None), it is set to its default from the TTL when
    # the Lease is made, so reading it always gives the value in force.
    stop_margin: float = None  # type: ignore[assignment]
    late_write_grace: float = None  # type: ignore[assignment]
    adopt_interval: float = None  # type: ignore[assignment]
    clock: LeaseClock = field(default_factory=LeaseClock, compare=False, repr=False)

    def __post_init__(self) -> None:
        for name in ("ttl", "drift", "stop_margin", "late_write_grace", "adopt_interval"):
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int | float)):
                raise ValueError(f"lease {name} must be a number of seconds, got {value!r}")
        if not _MIN_TTL <= self.ttl <= _MAX_TTL:  # also refuses NaN and infinity
            raise ValueError(f"lease ttl must be between {_MIN_TTL} s and a year ({_MAX_TTL:.0f} s), got {self.ttl}")
        if not 0 <= self.drift < 1:
            raise ValueError(f"lease drift must be in [0, 1), got {self.drift}")
        if not isinstance(self.clock, LeaseClock):
            raise ValueError(f"lease clock must be a LeaseClock, got {self.clock!r}")
        if not isinstance(self.holder, str) or not self.holder:
            raise ValueError(f"lease holder must be a non-empty string, got {self.holder!r}")
        try:
            self.holder.encode()
        except UnicodeEncodeError as e:
            raise ValueError(f"lease holder must be valid text: {e}") from None
        defaults = {"stop_margin": self.ttl / 5, "late_write_grace": 5 * self.ttl, "adopt_interval": 3 * self.ttl}
        for name, default in defaults.items():
            if getattr(self, name) is None:
                object.__setattr__(self, name, default)
        if not 0 <= self.stop_margin <= self.ttl - _MIN_WINDOW:
            raise ValueError(
                f"lease stop_margin must be in [0, ttl - {_MIN_WINDOW}] (a holder must have time to write), "
                f"got {self.stop_margin}"
            )
        for name in ("late_write_grace", "adopt_interval"):
            if not 0 <= getattr(self, name) <= _MAX_TTL:  # also refuses NaN and infinity
                raise ValueError(f"lease {name} must be in [0, {_MAX_TTL:.0f}] seconds, got {getattr(self, name)}")

    @classmethod
    def from_option(cls, option: Lease | float | bool | None) -> Lease | None:
        """`ProcedureManager`'s `lease=`: a `Lease`, a TTL in seconds, True (defaults), or off."""
        if option is None or option is False:
            return None
        if option is True:
            return cls()
        if isinstance(option, Lease):
            return option
        return cls(ttl=float(option))

    margin = _Renamed("stop_margin")
    grace = _Renamed("late_write_grace")
    adopt_every = _Renamed("adopt_interval")

    @property
    def renew_interval(self) -> float:
        """How often the holder renews, and how often a standby looks."""
        return self.ttl / 4


_MAX_TTL = 86_400.0 * 365
"""A year: far above any sane TTL, and it keeps infinity out."""
_MIN_TTL = 0.1
"""Below it a holder would spend its whole term renewing (each renewal is a store round trip)."""
_MIN_WINDOW = 0.05
"""The least time, in seconds, a holder may write in after each renewal (`ttl - stop_margin`)."""
MAX_EPOCH = 2**63 - 1
"""The highest epoch a record may hold (a signed 64-bit fencing token, as most systems take)."""


class LeaseRecord(msgspec.Struct, frozen=True):
    """The stored lease. Every write changes `renewal`, so no two writes have equal bytes.

    The bounds are those a usable stored record must meet (`decode` checks them; the
    manager's own stand-in for an unreadable record, held by nobody, is made directly)."""

    holder: Annotated[str, msgspec.Meta(min_length=1)]
    epoch: Annotated[int, msgspec.Meta(ge=0, le=MAX_EPOCH)]
    """Counts leaderships: each takeover adds one."""
    renewal: Annotated[int, msgspec.Meta(ge=0)]
    ttl: Annotated[float, msgspec.Meta(gt=0, le=_MAX_TTL)]
    released: bool = False
    """Set by a holder that stopped cleanly: a standby may take over at once."""

    def encode(self) -> bytes:
        return orjson.dumps(msgspec.structs.asdict(self))

    @classmethod
    def decode(cls, raw: bytes) -> LeaseRecord:
        """Raises `ValueError` naming what is wrong (the field's path, for a wrong value).

        Validated, never coerced: a TTL of "inf" or "nan" would mean no standby ever takes
        over, an epoch of 1e300 would break every takeover, and "released": "false" would
        read as released. Any such record is as unreadable as a torn one.
        """
        try:
            return _lease_decoder.decode(raw)
        except UNDECODABLE as e:
            raise ValueError(f"not a lease record ({e}): {raw[:200]!r}") from e


_lease_decoder = msgspec.json.Decoder(LeaseRecord)


class LeaseKeeper:
    """One manager's view of the lease: acquiring, renewing, checking before each write.

    Not a task: the manager calls `acquire_once` and `renew_once` from its own loop, so
    every store call here happens where the caller can see and time it.
    """

    def __init__(self, store: StateStore, key: str, lease: Lease) -> None:
        self.store = store
        self.key = key
        self.lease = lease
        self.record: LeaseRecord | None = None
        """The last record seen or written."""
        self.highest_epoch = 0
        """The highest epoch this manager has read or written: the next term's is above it.
        Invariant: never decreases, so neither do this manager's fencing tokens."""
        self._version: str | None = None
        self._seen_at = 0.0
        self.clock = lease.clock
        self._writable_until = 0.0
        """`clock.now()` after which this manager must not write (0 if not holding)."""
        self._renewed_at = 0.0
        """`clock.now()` when the last successful write of the lease was sent."""
        self._suspended_at_renewal = 0.0
        """`clock.suspended()` when that write was sent: once it has grown, the lease lapsed."""
        self._lapsed_by_suspend = 0.0
        """Seconds the machine was found suspended during the last term (0: it was not)."""
        self._sending: tuple[LeaseRecord, float, float] | None = None
        """The record last sent, and the clocks when it was first sent (attempts can be abandoned)."""

    @property
    def holder(self) -> str:
        return self.lease.holder

    @property
    def epoch(self) -> int | None:
        """The epoch of the last record seen or written (this manager's own while it holds it)."""
        return None if self.record is None else self.record.epoch

    @property
    def is_holding(self) -> bool:
        """Whether this manager holds the lease and may still write."""
        return self.seconds_left > 0

    @property
    def seconds_left(self) -> float:
        """Seconds until this manager must have stopped writing (<= 0: not holding).

        A suspend of the machine since the last renewal ends the lease at once: the
        standbys kept counting, and a write sent before it may arrive late."""
        if self._writable_until == 0.0:
            return 0.0
        suspended = self.clock.suspended() - self._suspended_at_renewal
        if suspended > SUSPEND_TOLERANCE:
            self._lapsed_by_suspend = suspended
            self.give_up()
            return 0.0
        return self._writable_until - self.clock.now()

    @property
    def seconds_to_renewal(self) -> float:
        """Seconds until the next renewal is due (<= 0: now, e.g. after a failed attempt)."""
        return self._renewed_at + self.lease.renew_interval - self.clock.now()

    @property
    def leader(self) -> str | None:
        """The holder named by the last record seen, unless it released the lease.

        None as well when that record is this manager's own lapsed lease: nobody is known to
        lead until a read shows who took it (this manager, again, perhaps).
        """
        if self.is_holding:
            return self.holder
        record = self.record
        if record is None or record.released or record.holder in (self.holder, NO_HOLDER):
            return None
        return record.holder

    def check_writable(self, key: str) -> None:
        """Raise `LeaseExpired` unless this manager may still write (called before each write)."""
        if self.seconds_left <= 0:
            raise LeaseExpired(key, self.holder, self._why_not_holding())

    def _why_not_holding(self) -> str:
        if self._lapsed_by_suspend:
            return (
                f"the machine was suspended for {self._lapsed_by_suspend:.2f}s since its last renewal, so its lease "
                "may have passed to another manager"
            )
        if self._writable_until == 0.0:
            return "it does not hold it"
        return f"its lease ran out {self.clock.now() - self._writable_until:.2f}s ago without a renewal"

    def give_up(self) -> None:
        """Stop writing at once (the manager lost the lease or is stopping)."""
        self._writable_until = 0.0

    async def _read(self) -> tuple[LeaseRecord, str] | None:
        found = await self.store.get_versioned(self.key)
        if found is None:
            return None
        raw, version = found
        try:
            return LeaseRecord.decode(raw), version
        except ValueError as e:
            if version != self._version:
                logger.warning(
                    "%s%s is not a lease record (%s): a write cut off by a killed manager, taken for a lease "
                    "nobody holds; a manager takes it over once it has stayed so for a TTL",
                    self.store.url,
                    self.key,
                    e,
                )
            return self._unreadable(), version

    def _unreadable(self) -> LeaseRecord:
        """What a stored lease that cannot be read stands for: a lease held by nobody.

        A test S3 server (moto) keeps the empty body of a PUT whose sender was killed after
        its headers; a renewal cut off that way would otherwise stop every manager for good.
        Like a lease nobody renews, it is taken over once its version has stayed the same
        for a TTL (the longer of this manager's and the last record's), by compare-and-swap
        on that version: one manager wins. Epochs go on from the last record this manager
        read; a manager that read none counts from 1 again (so do fencing tokens then).
        """
        last = self.record
        ttl = max(self.lease.ttl, last.ttl if last is not None else 0.0)
        return LeaseRecord(NO_HOLDER, self.highest_epoch, -1, ttl)

    async def _write(self, record: LeaseRecord, version: str | None) -> bool:
        """Compare-and-swap `record` in; on success the lease runs from before the send.

        Records never repeat, so a refused swap that reads back our own bytes means an
        earlier, abandoned attempt at the same record landed: the lease then runs from that
        attempt's send, the earliest moment a standby can have seen it.
        """
        sent_at, suspended_at = self.clock.now(), self.clock.suspended()
        if self._sending is not None and self._sending[0] == record:
            _, sent_at, suspended_at = self._sending
        self._sending = (record, sent_at, suspended_at)
        await self.store.put_if_version(self.key, record.encode(), version)
        # Read back whatever the swap answered: it gives the version for the next swap, and
        # a refused swap may be our own earlier attempt whose answer was lost.
        found = await self._read()
        self._seen_at = self.clock.now()
        if found is None:
            self.record, self._version = None, None
            return False
        self.record, self._version = found
        self.highest_epoch = max(self.highest_epoch, found[0].epoch)
        if found[0] != record:
            return False
        self._renewed_at = sent_at
        if self._writable_until == 0.0:
            self._lapsed_by_suspend = 0.0  # a new term
        self._suspended_at_renewal = suspended_at
        self._writable_until = sent_at + self.lease.ttl - self.lease.stop_margin
        # False if the attempt that landed was sent so long ago that the lease has run out.
        return self.is_holding

    async def acquire_once(self) -> bool:
        """Look at the lease once; take it if it is free, released or expired. True if held now.

        Raises `StoreError` if the store cannot be read or written.
        """
        found = await self._read()
        now = self.clock.now()
        # No lease object (a new store, or one deleted by hand) is taken at once: epochs go
        # on from the highest this manager has seen, so its fencing tokens never go backwards.
        version = None
        if found is not None:
            record, version = found
            self.highest_epoch = max(self.highest_epoch, record.epoch)
            if version != self._version:
                self.record, self._version, self._seen_at = record, version, now
            expired = now - self._seen_at >= record.ttl * (1 + self.lease.drift)
            if not (record.released or expired):
                return False
            if expired and not record.released:
                logger.warning(
                    "lease of %s (epoch %d) not renewed for %.1fs: %s takes over",
                    record.holder or "nobody (an unreadable record)",
                    record.epoch,
                    now - self._seen_at,
                    self.holder,
                )
        return await self._write(LeaseRecord(self.holder, self._next_epoch(), 0, self.lease.ttl), version)

    def _next_epoch(self) -> int:
        """The epoch of a new term; raises `StoreError` if none can be higher than the last."""
        if self.highest_epoch >= MAX_EPOCH:
            raise StoreError(
                f"the lease epoch has reached its maximum ({MAX_EPOCH}): no new term can have a higher fencing "
                "token. The record was written by hand or is corrupt; stop every manager, delete the lease object "
                "(epochs then count from 1 again) and restart them",
                key=self.key,
            )
        return self.highest_epoch + 1

    async def renew_once(self) -> bool:
        """Extend the lease; False if another manager holds it now (this one must stop).

        Raises `StoreError` if the store could not be reached: try again until
        `seconds_left` runs out.
        """
        record = self.record
        if record is None or not self.is_holding:
            return False
        renewed = msgspec.structs.replace(record, renewal=record.renewal + 1, ttl=self.lease.ttl)
        if await self._write(renewed, self._version):
            return True
        self.give_up()
        return False

    async def release(self) -> None:
        """Mark the lease released so a standby takes over without waiting for the TTL.

        Call only once nothing more will be written. The stored record is read first: it is
        released if it is still this manager's term (same holder and epoch), even when this
        manager had stopped counting on it (a renewal whose answer was lost, say), since no
        other manager writes a record with our holder and epoch. Errors are logged: an
        unreleased lease simply expires.
        """
        self.give_up()
        record = self.record
        if record is None or record.holder != self.holder:
            return
        try:
            found = await self._read()
            if found is None:
                return
            stored, version = found
            if stored.holder != self.holder or stored.epoch != record.epoch or stored.released:
                return
            await self.store.put_if_version(
                self.key, msgspec.structs.replace(stored, renewal=stored.renewal + 1, released=True).encode(), version
            )
        except StoreError as e:
            logger.warning("could not release the lease (%s); it expires in %.0fs", e, record.ttl)
