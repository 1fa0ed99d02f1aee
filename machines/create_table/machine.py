"""Create a table and its regions: a parent machine with one subprocedure per region.

    Prepare        table info says "creating"
    CreateRegions  one CreateRegion child per region (locks `catalog.schema.table.region-N`)
    Join           every child done? (re-suspends on any child a crash left unknown)
    RegisterTable  the route is written and the table info says "ready"

Rollback closes the regions that were created and removes the table's metadata, so a
failed create leaves nothing behind. Children never lock the parent's key
(`catalog.schema.table`): they lock their own region's.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import Any

from procstore import LockKey, ProcedureId, ProcedureWithId, RetryLater, Status, StringKey
from procstore.machine import MachineContext, State, StateMachine, StateRegistry
from procstore_machines.region_migration.cluster import (
    DatanodeError,
    MailboxTimeout,
    RegionRoute,
    SimCluster,
    TableRoute,
    region_id,
)

CREATE_TABLE = "metasrv-procedure::CreateTable"
CREATE_REGION = "metasrv-procedure::CreateRegion"
_CHILD_NAMESPACE = uuid.UUID("8a3cfb5e-3d0e-4f4b-9e11-4f3b0b8f2c71")


@dataclass
class RegionPlan:
    number: int
    leader: int


@dataclass
class TableContext:
    catalog: str
    schema: str
    table: str
    table_id: int
    regions: list[RegionPlan]

    @property
    def full_name(self) -> str:
        return f"{self.catalog}.{self.schema}.{self.table}"


@dataclass
class RegionContext:
    catalog: str
    schema: str
    table: str
    table_id: int
    number: int
    leader: int


@dataclass
class ClusterHandle:
    """The volatile context of both machines: how to reach the cluster."""

    cluster: SimCluster


TableCtx = MachineContext[TableContext, ClusterHandle]
RegionCtx = MachineContext[RegionContext, ClusterHandle]
table_states = StateRegistry("create_table_state", machine=CREATE_TABLE)
region_states = StateRegistry("create_region_state", machine=CREATE_REGION)


async def _send(cluster: SimCluster, node: int, instruction: str, region: int) -> None:
    try:
        await cluster.mailbox.send(node, instruction, region, timeout=1.0)
    except (MailboxTimeout, DatanodeError) as e:
        raise RetryLater.from_exc(e) from e


# -- the child ---------------------------------------------------------------------------


@region_states.state
@dataclass
class OpenRegion(State[RegionCtx]):
    async def next(self, ctx: RegionCtx) -> tuple[State[RegionCtx], Status]:
        p = ctx.persistent
        await _send(ctx.volatile.cluster, p.leader, "create", region_id(p.table_id, p.number))
        return RegionOpened(), Status.executing()


@region_states.state
@dataclass
class RegionOpened(State[RegionCtx]):
    async def next(self, ctx: RegionCtx) -> tuple[State[RegionCtx], Status]:
        return self, Status.done(region_id(ctx.persistent.table_id, ctx.persistent.number))


class CreateRegion(StateMachine[RegionContext, ClusterHandle]):
    type_name = CREATE_REGION
    states = region_states
    persistent_type = RegionContext

    @classmethod
    def initial_state(cls) -> State[RegionCtx]:
        return OpenRegion()

    def lock_key(self) -> LockKey:
        p = self.persistent
        return LockKey([StringKey.exclusive(f"{p.catalog}.{p.schema}.{p.table}.region-{p.number}")])


# -- the parent --------------------------------------------------------------------------


def _child_id(ctx: TableCtx, number: int) -> ProcedureId:
    """Deterministic, so a replay names the same children."""
    return ProcedureId(uuid.uuid5(_CHILD_NAMESPACE, f"{ctx.runtime.procedure_id}/{number}"))


def _children(ctx: TableCtx, plans: list[RegionPlan]) -> list[ProcedureWithId]:
    p = ctx.persistent
    out = []
    for plan in plans:
        child_ctx = RegionContext(p.catalog, p.schema, p.table, p.table_id, plan.number, plan.leader)
        out.append(
            ProcedureWithId(_child_id(ctx, plan.number), CreateRegion.create(child_ctx, lambda _c: ctx.volatile))
        )
    return out


@table_states.state
@dataclass
class Prepare(State[TableCtx]):
    async def next(self, ctx: TableCtx) -> tuple[State[TableCtx], Status]:
        p, metadata = ctx.persistent, ctx.volatile.cluster.metadata
        info = await metadata.get_table_info(p.table_id)
        if info is not None and info.get("state") == "ready":
            return TableCreated(), Status.executing()
        await metadata.put_table_info(p.table_id, {"name": p.full_name, "state": "creating"})
        return CreateRegions(), Status.executing()


@table_states.state
@dataclass
class CreateRegions(State[TableCtx]):
    async def next(self, ctx: TableCtx) -> tuple[State[TableCtx], Status]:
        return Join(), Status.suspended(_children(ctx, ctx.persistent.regions))


@table_states.state
@dataclass
class Join(State[TableCtx]):
    async def next(self, ctx: TableCtx) -> tuple[State[TableCtx], Status]:
        provider = ctx.runtime.provider
        states = {plan.number: provider.procedure_state(_child_id(ctx, plan.number)) for plan in ctx.persistent.regions}
        missing = [plan for plan in ctx.persistent.regions if states[plan.number] is None]
        if missing:  # a crash came between this state's write and those children's first
            return self, Status.suspended(_children(ctx, missing))
        failed = sorted(n for n, s in states.items() if s is not None and not s.is_done())
        if failed:
            raise RuntimeError(f"regions {failed} of {ctx.persistent.full_name} could not be created")
        return RegisterTable(), Status.executing()


@table_states.state
@dataclass
class RegisterTable(State[TableCtx]):
    async def next(self, ctx: TableCtx) -> tuple[State[TableCtx], Status]:
        p, metadata = ctx.persistent, ctx.volatile.cluster.metadata
        if await metadata.get_route(p.table_id) is None:
            regions = [RegionRoute(region_id(p.table_id, r.number), r.leader) for r in p.regions]
            await metadata.put_route(TableRoute(p.table_id, 0, regions))
        await metadata.put_table_info(p.table_id, {"name": p.full_name, "state": "ready"})
        return TableCreated(), Status.executing(persist=False)


@table_states.state
@dataclass
class TableCreated(State[TableCtx]):
    async def next(self, ctx: TableCtx) -> tuple[State[TableCtx], Status]:
        return self, Status.done({"table_id": ctx.persistent.table_id, "regions": len(ctx.persistent.regions)})


class CreateTable(StateMachine[TableContext, ClusterHandle]):
    type_name = CREATE_TABLE
    states = table_states
    persistent_type = TableContext
    rollback_supported = True

    @classmethod
    def initial_state(cls) -> State[TableCtx]:
        return Prepare()

    def lock_key(self) -> LockKey:
        p = self.persistent
        return LockKey(
            [
                StringKey.share(f"catalog/{p.catalog}"),
                StringKey.share(f"schema/{p.catalog}/{p.schema}"),
                StringKey.exclusive(p.full_name),
            ]
        )

    async def rollback(self, ctx: Any) -> None:
        """Close every region this table may have created, then forget the table."""
        p, cluster = self.persistent, self.volatile.cluster
        for plan in p.regions:
            await _send(cluster, plan.leader, "close", region_id(p.table_id, plan.number))
        await cluster.metadata.delete_route(p.table_id)
        await cluster.metadata.delete_table_info(p.table_id)


def register(manager: Any, cluster: SimCluster) -> None:
    """Register both machines' loaders on `manager`, reaching `cluster`."""
    handle = ClusterHandle(cluster)
    CreateTable.register_with(manager, lambda _p: handle)
    CreateRegion.register_with(manager, lambda _p: handle)


def new_create_table(cluster: SimCluster, table: str, table_id: int, leaders: list[int]) -> CreateTable:
    regions = [RegionPlan(n, leader) for n, leader in enumerate(leaders, start=1)]
    return CreateTable.create(
        TableContext("greptime", "public", table, table_id, regions), lambda _p: ClusterHandle(cluster)
    )
