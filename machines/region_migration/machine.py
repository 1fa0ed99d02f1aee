"""Region migration, after GreptimeDB's `meta_srv::procedure::region_migration`.

    RegionMigrationStart -> OpenCandidateRegion [-> WaitCandidateOpened] -> UpdateMetadata(Downgrade)
      -> DowngradeLeaderRegion -> UpgradeCandidateRegion -> UpdateMetadata(Upgrade)
      -> CloseDowngradedRegion -> RegionMigrationEnd
    UpgradeCandidateRegion (timed out) -> UpdateMetadata(Rollback) -> RegionMigrationAbort

Several regions of one table may move together: every state acts on all of them. Every
state is idempotent, because after a crash the machine resumes from its last persisted
state and replays the ones after it. Mailbox timeouts and route conflicts are retryable
(`RetryLater`); a missing table or an impossible request aborts.

A datanode that opens the candidate region asynchronously answers "not open yet": the
migration then waits, without polling, for the datanode's `region-opened` signal
(`WaitCandidateOpened`), for at most the migration's timeout; after that it falls back to
polling the datanode (`RetryLater`).
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from procstore import LockKey, RetryLater, Status, StringKey
from procstore.machine import SKIP_IF_EMPTY, Duration, MachineContext, State, StateMachine, StateRegistry
from procstore_machines.region_migration.cluster import (
    REGION_LEASE_SECONDS,
    REGION_OPENED,
    DatanodeError,
    MailboxTimeout,
    SimCluster,
    TableRoute,
    VersionConflict,
    table_of,
)

TYPE_NAME = "metasrv-procedure::RegionMigration"
registry = StateRegistry("region_migration_state", machine=TYPE_NAME)


@dataclass
class Peer:
    id: int
    addr: str = ""


@dataclass
class PersistentContext:
    """Stored with every persisted state (field order and names as GreptimeDB's)."""

    catalog: str
    schema: str
    from_peer: Peer
    to_peer: Peer
    region_id: int
    timeout: Duration = field(default_factory=lambda: Duration(seconds=10))
    region_ids: list[int] = field(default_factory=list, metadata=SKIP_IF_EMPTY)
    """All the regions to move, when there are several (`region_id` is then the first)."""

    def regions(self) -> list[int]:
        return self.region_ids or [self.region_id]

    @property
    def table_id(self) -> int:
        return table_of(self.region_id)


@dataclass
class VolatileContext:
    """Rebuilt after every load; never stored."""

    cluster: SimCluster
    lease_deadline: float | None = None
    last_entry_ids: dict[int, int | None] = field(default_factory=dict)
    operations_elapsed: float = 0.0


Ctx = MachineContext[PersistentContext, VolatileContext]


class MigrationAbort(Exception):
    """The migration cannot go on; not retryable."""


class TableRouteNotFound(Exception):
    """Not retryable: there is nothing to migrate."""


def _retry(exc: Exception) -> RetryLater:
    return RetryLater.from_exc(exc)


async def _route(ctx: Ctx) -> TableRoute:
    route = await ctx.volatile.cluster.metadata.get_route(ctx.persistent.table_id)
    if route is None:
        raise TableRouteNotFound(f"table {ctx.persistent.table_id} has no route")
    return route


async def _update_route(ctx: Ctx, change: Any) -> None:
    """Apply `change(route) -> bool` (True if it changed something) with compare-and-set."""
    route = await _route(ctx)
    version = route.version
    if change(route):
        try:
            await ctx.volatile.cluster.metadata.update_route(route.table_id, version, route)
        except VersionConflict as e:
            raise _retry(e) from e


def _timeout_left(ctx: Ctx) -> float:
    return ctx.persistent.timeout.total_seconds() - ctx.volatile.operations_elapsed


def _fencing_token(ctx: Ctx) -> int | None:
    """The lease term this step runs in. Every datanode call carries it: a datanode refuses
    a lower token than it has seen for the region, so a leader paused past its lease cannot
    act on a region after the next leader has (as GreptimeDB's datanodes refuse a stale
    lease)."""
    return None if ctx.procedure is None else ctx.procedure.fencing_token


async def _send(ctx: Ctx, peer: Peer, instruction: str, region: int, **args: Any) -> dict[str, Any]:
    started = time.monotonic()
    try:
        timeout = max(_timeout_left(ctx), 0.05)
        mailbox = ctx.volatile.cluster.mailbox
        return await mailbox.send(peer.id, instruction, region, timeout, _fencing_token(ctx), **args)
    finally:
        ctx.volatile.operations_elapsed += time.monotonic() - started


def _led_by_others(route: TableRoute, p: PersistentContext) -> list[int]:
    """The regions to move that neither peer leads (another migration moved them)."""
    routes = [route.route(region) for region in p.regions()]
    return [r.region_id for r in routes if r is not None and r.leader not in (p.from_peer.id, p.to_peer.id)]


def _not_led_by_from_peer(regions: list[int], p: PersistentContext) -> State[Ctx]:
    return RegionMigrationAbort(f"regions {regions} are not led by {p.from_peer.id}")


@registry.state
@dataclass
class RegionMigrationStart(State[Ctx]):
    async def next(self, ctx: Ctx) -> tuple[State[Ctx], Status]:
        p = ctx.persistent
        if p.from_peer.id == p.to_peer.id:
            return RegionMigrationAbort(f"from_peer and to_peer are both datanode {p.to_peer.id}"), Status.executing()
        route = await _route(ctx)
        routes = [route.route(r) for r in p.regions()]
        if any(r is None for r in routes):
            missing = [rid for rid, r in zip(p.regions(), routes, strict=True) if r is None]
            return RegionMigrationAbort(f"regions {missing} are not in table {p.table_id}"), Status.executing()
        if all(r is not None and r.leader == p.to_peer.id and not r.leader_downgrading for r in routes):
            return RegionMigrationEnd(), Status.executing()
        if strangers := _led_by_others(route, p):
            return _not_led_by_from_peer(strangers, p), Status.executing()
        if all(r is not None and p.to_peer.id in r.followers for r in routes):
            return UpdateMetadata(MetadataUpdate.DOWNGRADE), Status.executing()
        return OpenCandidateRegion(), Status.executing()


@registry.state
@dataclass
class OpenCandidateRegion(State[Ctx]):
    async def next(self, ctx: Ctx) -> tuple[State[Ctx], Status]:
        p = ctx.persistent
        if await _open_candidates(ctx):
            timeout = p.timeout.total_seconds()
            return WaitCandidateOpened(), Status.wait_for_signal(REGION_OPENED, timeout=timeout)

        def add_follower(route: TableRoute) -> bool:
            changed = False
            for region in p.regions():
                r = route.route(region)
                if r is not None and r.leader != p.to_peer.id and p.to_peer.id not in r.followers:
                    r.followers.append(p.to_peer.id)
                    changed = True
            return changed

        await _update_route(ctx, add_follower)
        return UpdateMetadata(MetadataUpdate.DOWNGRADE), Status.executing(persist=False)


async def _open_candidates(ctx: Ctx) -> list[int]:
    """Ask the candidate to open every region; the regions it is still opening."""
    p = ctx.persistent
    opening = []
    for region in p.regions():
        try:
            reply = await _send(ctx, p.to_peer, "open", region, reply_to=str(ctx.runtime.procedure_id))
        except (MailboxTimeout, DatanodeError) as e:
            raise _retry(e) from e
        if not reply.get("opened", True):
            opening.append(region)
    return opening


@registry.state
@dataclass
class WaitCandidateOpened(State[Ctx]):
    """Waiting for the candidate's `region-opened` signal. A signal sends the migration back
    to `OpenCandidateRegion` (which asks again: other regions may still be opening); a
    timeout falls back to polling the candidate."""

    async def next(self, ctx: Ctx) -> tuple[State[Ctx], Status]:
        if REGION_OPENED not in ctx.runtime.signals and await _open_candidates(ctx):
            raise RetryLater("the candidate has not opened the region yet")
        return OpenCandidateRegion(), Status.executing(persist=False)


class MetadataUpdate(enum.Enum):
    DOWNGRADE = "Downgrade"
    UPGRADE = "Upgrade"
    ROLLBACK = "Rollback"


@registry.state
@dataclass
class UpdateMetadata(State[Ctx]):
    """Route changes; stored as `{"region_migration_state":"UpdateMetadata","kind":"Downgrade"}`
    and also read in the short form `{"UpdateMetadata":"Downgrade"}`."""

    kind: MetadataUpdate

    async def next(self, ctx: Ctx) -> tuple[State[Ctx], Status]:
        p = ctx.persistent
        if self.kind is MetadataUpdate.DOWNGRADE:
            # The start's check again: a migration resumed from its stored state (after a
            # run whose end the store refused, which let go of its locks) may find that
            # another migration has moved the region meanwhile. Every path to the upgrade
            # passes here, in the same run, so nothing acts on a route read before that.
            if strangers := _led_by_others(await _route(ctx), p):
                return _not_led_by_from_peer(strangers, p), Status.executing(persist=False)
            await _update_route(ctx, lambda route: _set_downgrading(route, p, True))
            return DowngradeLeaderRegion(), Status.executing(persist=False)
        if self.kind is MetadataUpdate.UPGRADE:
            await _update_route(ctx, lambda route: _switch_leader(route, p))
            return CloseDowngradedRegion(), Status.executing(persist=False)
        await rollback_downgraded_leader(ctx)
        return RegionMigrationAbort("the candidate could not be upgraded in time"), Status.executing(persist=False)


def _set_downgrading(route: TableRoute, p: PersistentContext, value: bool) -> bool:
    changed = False
    for region in p.regions():
        r = route.route(region)
        # A region already led by to_peer is migrated (a replay after a crash): leave it.
        if r is not None and r.leader == p.from_peer.id and r.leader_downgrading != value:
            r.leader_downgrading = value
            changed = True
    return changed


def _switch_leader(route: TableRoute, p: PersistentContext) -> bool:
    changed = False
    for region in p.regions():
        r = route.route(region)
        if r is not None and (r.leader != p.to_peer.id or r.leader_downgrading):
            r.followers = [f for f in r.followers if f not in (p.to_peer.id, p.from_peer.id)]
            r.leader, r.leader_downgrading = p.to_peer.id, False
            changed = True
    return changed


async def rollback_downgraded_leader(ctx: Ctx) -> None:
    """Give leadership back to from_peer for regions still marked downgrading. Idempotent.

    The candidate may already have been upgraded (a failure or crash after its upgrade but
    before the route named it): it is demoted first, so that there is never a second leader.
    """
    p = ctx.persistent
    route = await _route(ctx)
    downgraded = [r.region_id for r in route.regions if r.region_id in p.regions() and r.leader_downgrading]
    for region in downgraded:
        await _demote(ctx, p.to_peer, region)
        try:
            await _send(ctx, p.from_peer, "upgrade", region)
        except (MailboxTimeout, DatanodeError) as e:
            raise _retry(e) from e
    await _update_route(ctx, lambda r: _set_downgrading(r, p, False))


async def _demote(ctx: Ctx, peer: Peer, region: int) -> None:
    try:
        await _send(ctx, peer, "downgrade", region)
    except (MailboxTimeout, DatanodeError):
        # Unreachable: the route does not name it, so nobody renews its lease; once the
        # lease has run out it has stopped leading.
        await asyncio.sleep(REGION_LEASE_SECONDS)
        await ctx.volatile.cluster.expire_lease(peer.id, region, _fencing_token(ctx))


async def _send_with_backoff(
    ctx: Ctx, peer: Peer, instruction: str, region: int, give_up: Callable[[], bool], **args: Any
) -> dict[str, Any] | None:
    """Send until the datanode answers, backing off from 5 ms to 50 ms; None once `give_up()`."""
    delay = 0.005
    while True:
        try:
            return await _send(ctx, peer, instruction, region, **args)
        except (MailboxTimeout, DatanodeError):
            if give_up():
                return None
            await asyncio.sleep(delay)
            ctx.volatile.operations_elapsed += delay
            delay = min(delay * 2, 0.05)


@registry.state
@dataclass
class DowngradeLeaderRegion(State[Ctx]):
    async def next(self, ctx: Ctx) -> tuple[State[Ctx], Status]:
        p, v = ctx.persistent, ctx.volatile

        def lease_ran_out() -> bool:
            # The route marks the leader downgrading, so the metasrv no longer renews its
            # lease: past the deadline the old leader has stopped serving, even unreachable.
            if v.lease_deadline is None:
                v.lease_deadline = time.monotonic() + REGION_LEASE_SECONDS
            return time.monotonic() >= v.lease_deadline

        for region in p.regions():
            if region in v.last_entry_ids:
                continue
            reply = await _send_with_backoff(ctx, p.from_peer, "downgrade", region, lease_ran_out)
            if reply is None:  # slow path: go on without the old leader
                await v.cluster.expire_lease(p.from_peer.id, region, _fencing_token(ctx))
            v.last_entry_ids[region] = None if reply is None else reply.get("last_entry_id")
        return UpgradeCandidateRegion(), Status.executing(persist=False)


@registry.state
@dataclass
class UpgradeCandidateRegion(State[Ctx]):
    async def next(self, ctx: Ctx) -> tuple[State[Ctx], Status]:
        p, v = ctx.persistent, ctx.volatile
        for region in p.regions():
            last_entry_id = v.last_entry_ids.get(region)
            reply = await _send_with_backoff(
                ctx, p.to_peer, "upgrade", region, lambda: _timeout_left(ctx) <= 0, last_entry_id=last_entry_id
            )
            if reply is None:
                return UpdateMetadata(MetadataUpdate.ROLLBACK), Status.executing(persist=False)
        return UpdateMetadata(MetadataUpdate.UPGRADE), Status.executing(persist=False)


@registry.state
@dataclass
class CloseDowngradedRegion(State[Ctx]):
    async def next(self, ctx: Ctx) -> tuple[State[Ctx], Status]:
        p = ctx.persistent
        for region in p.regions():
            # Best effort: the route no longer points at it, and it is a follower.
            with contextlib.suppress(MailboxTimeout, DatanodeError):
                await _send(ctx, p.from_peer, "close", region)
        return RegionMigrationEnd(), Status.executing(persist=False)


@registry.state
@dataclass
class RegionMigrationEnd(State[Ctx]):
    async def next(self, ctx: Ctx) -> tuple[State[Ctx], Status]:
        p = ctx.persistent
        return self, Status.done({"regions": p.regions(), "leader": p.to_peer.id})


@registry.state
@dataclass
class RegionMigrationAbort(State[Ctx]):
    reason: str

    async def next(self, ctx: Ctx) -> tuple[State[Ctx], Status]:
        raise MigrationAbort(self.reason)


class RegionMigration(StateMachine[PersistentContext, VolatileContext]):
    """Moves the leadership of one or more regions from one datanode to another."""

    type_name = TYPE_NAME
    states = registry
    persistent_type = PersistentContext
    rollback_supported = True

    @classmethod
    def initial_state(cls) -> State[Ctx]:
        return RegionMigrationStart()

    def lock_key(self) -> LockKey:
        p = self.persistent
        return LockKey(
            [
                StringKey.share(f"catalog/{p.catalog}"),
                StringKey.share(f"schema/{p.catalog}/{p.schema}"),
                StringKey.exclusive(f"table/{p.table_id}"),
                *(StringKey.exclusive(f"region/{r}") for r in p.regions()),
            ]
        )

    async def rollback(self, ctx: Any) -> None:
        self.context.procedure = ctx
        await rollback_downgraded_leader(self.context)


def new_migration(
    cluster: SimCluster,
    regions: list[int],
    from_peer: int,
    to_peer: int,
    *,
    catalog: str = "greptime",
    schema: str = "public",
    timeout: Duration | None = None,
) -> RegionMigration:
    persistent = PersistentContext(
        catalog,
        schema,
        Peer(from_peer),
        Peer(to_peer),
        regions[0],
        timeout or Duration(seconds=10),
        regions if len(regions) > 1 else [],
    )
    return RegionMigration.create(persistent, lambda _p: VolatileContext(cluster))
