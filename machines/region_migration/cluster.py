"""A simulated cluster for region migration: durable metadata, datanodes and a mailbox.

- Table routes (which datanode leads each region) live in object storage under
  `cluster/tables/{table_id}.json`, updated by compare-and-set on a version number.
- Each datanode keeps its replicas (role and last entry id) durably under
  `cluster/datanodes/{id}.json`, as a real datanode keeps them on its disk.
- The mailbox carries instructions to datanodes and can be made slow, time out, fail, or
  cut a datanode off (a partition). An instruction carries the fencing token of the
  manager's lease term that sent it (`Context.fencing_token`); a datanode keeps the highest
  token it has seen per region and refuses a lower one (`StaleFencingToken`), so a leader
  paused past its lease cannot act on a region after the next leader has.
- A region's leader whose lease is no longer renewed (its route marks it downgrading)
  gives up leadership on its own once the lease has run out, as GreptimeDB's datanodes
  do; that needs no message, so it works across a partition.
- A datanode may open a region asynchronously (`Datanode.open_delay`): it answers at once
  that the region is not open yet, and once it is, sends the migration that asked the
  signal `REGION_OPENED` through the store (`procstore.store.signals`).

Everything survives the procedure manager being killed: only the mailbox and the
datanodes' fencing tokens are in memory (the datanodes outlive every manager).
"""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import dataclass, field
from typing import Any, Literal

import msgspec
import orjson

from procstore import ProcedureError, ProcedureId
from procstore.machine import to_builtins
from procstore.store.procedure_store import ProcedureStore
from procstore.store.signals import send_signal
from procstore.store.state_store import StateStore

Role = Literal["leader", "follower"]

REGION_OPENED = "region-opened"
"""The signal a datanode sends the migration that asked it to open a region, once it is open."""

REGION_LEASE_SECONDS = 0.3
"""How long a leader keeps serving without hearing from the metasrv (short, for tests)."""


def region_id(table_id: int, region_number: int) -> int:
    """GreptimeDB's RegionId: the table id in the high 32 bits."""
    return (table_id << 32) | region_number


def table_of(region: int) -> int:
    return region >> 32


@dataclass
class RegionRoute:
    region_id: int
    leader: int
    followers: list[int] = field(default_factory=list)
    leader_downgrading: bool = False


@dataclass
class TableRoute:
    table_id: int
    version: int
    regions: list[RegionRoute]

    def route(self, region: int) -> RegionRoute | None:
        return next((r for r in self.regions if r.region_id == region), None)


@dataclass
class Replica:
    role: Role
    last_entry_id: int = 0


class VersionConflict(Exception):
    """The route changed since it was read (another writer won the compare-and-set)."""


class MailboxTimeout(Exception):
    """No reply in time: retryable."""


class DatanodeError(Exception):
    """The datanode refused the instruction."""


class StaleFencingToken(DatanodeError):
    """The instruction comes from an older lease term than one the region has seen."""


class ClusterMetadata:
    """Table routes on durable storage."""

    def __init__(self, store: StateStore) -> None:
        self.store = store
        self._lock = asyncio.Lock()

    @staticmethod
    def _key(table_id: int) -> str:
        return f"cluster/tables/{table_id}.json"

    async def get_route(self, table_id: int) -> TableRoute | None:
        raw = await self.store.get(self._key(table_id))
        return None if raw is None else msgspec.convert(orjson.loads(raw), TableRoute)

    async def put_route(self, route: TableRoute) -> None:
        await self.store.put(self._key(route.table_id), orjson.dumps(to_builtins(route)))

    async def update_route(self, table_id: int, expected_version: int, route: TableRoute) -> TableRoute:
        """Store `route` as the next version if the stored one is still `expected_version`."""
        async with self._lock:
            current = await self.get_route(table_id)
            if current is None or current.version != expected_version:
                raise VersionConflict(f"table {table_id}: route changed since version {expected_version}")
            route.version = expected_version + 1
            await self.put_route(route)
            return route

    async def delete_route(self, table_id: int) -> None:
        await self.store.delete(self._key(table_id))

    async def get_table_info(self, table_id: int) -> dict[str, Any] | None:
        raw = await self.store.get(f"cluster/table_info/{table_id}.json")
        return None if raw is None else dict(orjson.loads(raw))

    async def put_table_info(self, table_id: int, info: dict[str, Any]) -> None:
        await self.store.put(f"cluster/table_info/{table_id}.json", orjson.dumps(info))

    async def delete_table_info(self, table_id: int) -> None:
        await self.store.delete(f"cluster/table_info/{table_id}.json")

    async def table_ids(self) -> list[int]:
        keys = await self.store.walk("cluster/tables/")
        return sorted(int(k.rsplit("/", 1)[1].split(".")[0]) for k in keys)


class Datanode:
    """One datanode: its replicas, persisted after every change."""

    def __init__(self, node_id: int, store: StateStore) -> None:
        self.id = node_id
        self.store = store
        self.replicas: dict[int, Replica] = {}
        self.fences: dict[int, int] = {}
        """The highest fencing token seen per region. Kept in memory: a datanode here lives
        as long as its cluster, longer than any manager (a real one would keep it on disk
        with its replicas)."""
        self.lock = asyncio.Lock()
        self._loaded = False
        self.open_delay = 0.0
        """Seconds an `open` takes when asked with a `reply_to`: it answers `opened: False`
        at once and, once open, signals the procedure `reply_to` (`REGION_OPENED`)."""
        self.opening: set[asyncio.Task[None]] = set()

    @property
    def key(self) -> str:
        return f"cluster/datanodes/{self.id}.json"

    async def load(self) -> None:
        raw = await self.store.get(self.key)
        if raw is not None:
            self.replicas = msgspec.convert(orjson.loads(raw), dict[int, Replica], strict=False)
        self._loaded = True

    async def ensure_loaded(self) -> None:
        """Read the replicas from the store the first time they are needed."""
        if not self._loaded:
            await self.load()

    async def save(self) -> None:
        await self.store.put(self.key, orjson.dumps(to_builtins(self.replicas)))

    def admit(self, region: int, fencing_token: int | None) -> None:
        """Refuse an instruction whose token is below the highest seen for `region`: it
        comes from a deposed leader (paused past its lease, say) acting late. An instruction
        without a token (a manager without a lease) is not fenced."""
        if fencing_token is None:
            return
        highest = self.fences.get(region, fencing_token)
        if fencing_token < highest:
            raise StaleFencingToken(
                f"datanode {self.id}: region {region} has seen fencing token {highest}, refusing {fencing_token}"
            )
        self.fences[region] = fencing_token

    async def handle(
        self, instruction: str, region: int, fencing_token: int | None = None, **args: Any
    ) -> dict[str, Any]:
        # One instruction at a time: each save writes the whole replica map, and two
        # overlapping saves could land out of order and lose a change.
        async with self.lock:
            self.admit(region, fencing_token)
            await self.ensure_loaded()
            before = {rid: Replica(r.role, r.last_entry_id) for rid, r in self.replicas.items()}
            try:
                return await self._handle(instruction, region, **args)
            except BaseException:
                # The change did not reach the disk: forget it, or a retry would find it
                # done in memory and never write it.
                self.replicas = before
                raise

    async def _handle(self, instruction: str, region: int, **args: Any) -> dict[str, Any]:
        replica = self.replicas.get(region)
        if instruction == "create":
            if replica is None:
                self.replicas[region] = Replica("leader")
                await self.save()
            return {"created": True}
        if instruction == "open":
            reply_to = args.get("reply_to")
            if replica is None and self.open_delay and reply_to:
                task = asyncio.get_running_loop().create_task(self._open_later(region, reply_to))
                self.opening.add(task)
                task.add_done_callback(self.opening.discard)
                return {"opened": False}
            if replica is None:
                self.replicas[region] = Replica("follower")
                await self.save()
            return {"opened": True}
        if instruction == "downgrade":
            if replica is None:
                return {"exists": False, "last_entry_id": None}
            if replica.role == "leader":
                replica.role = "follower"
                await self.save()
            return {"exists": True, "last_entry_id": replica.last_entry_id}
        if instruction == "upgrade":
            if replica is None:
                raise DatanodeError(f"region {region} is not open on datanode {self.id}")
            if replica.role != "leader":
                replica.role = "leader"
                replica.last_entry_id = max(replica.last_entry_id, args.get("last_entry_id") or 0)
                await self.save()
            return {"ready": True}
        if instruction == "lease_expired":  # from inside the datanode, not the mailbox
            if replica is not None and replica.role == "leader":
                replica.role = "follower"
                await self.save()
            return {"leader": False}
        if instruction == "close":
            if self.replicas.pop(region, None) is not None:
                await self.save()
            return {"closed": True}
        raise DatanodeError(f"unknown instruction {instruction!r}")

    async def _open_later(self, region: int, reply_to: str) -> None:
        """Open `region` after `open_delay`, then tell the procedure that asked, as a
        datanode's report reaches GreptimeDB's metasrv: by a signal in the store."""
        await asyncio.sleep(self.open_delay)
        await self.handle("open", region)
        pid = ProcedureId.parse_canonical(reply_to)
        if pid is not None:
            with contextlib.suppress(ProcedureError):  # the migration ended meanwhile
                await send_signal(ProcedureStore(self.store), pid, REGION_OPENED, {"region": region, "node": self.id})


@dataclass
class Fault:
    """How the mailbox treats one datanode."""

    delay: float = 0.0
    timeouts: int = 0
    """The next `timeouts` instructions time out."""
    failures: int = 0
    """The next `failures` instructions are refused."""
    partitioned: bool = False
    """Unreachable: every instruction times out."""


class Mailbox:
    """Delivers instructions to datanodes, with the faults set in `faults`."""

    def __init__(self, datanodes: dict[int, Datanode]) -> None:
        self.datanodes = datanodes
        self.faults: dict[int, Fault] = {}
        self.sent: list[tuple[int, str, int]] = []

    def fault(self, node_id: int) -> Fault:
        return self.faults.setdefault(node_id, Fault())

    async def send(
        self,
        node_id: int,
        instruction: str,
        region: int,
        timeout: float,  # noqa: ASYNC109 - the timeout is simulated, part of the fault model
        fencing_token: int | None = None,
        **args: Any,
    ) -> dict[str, Any]:
        self.sent.append((node_id, instruction, region))
        fault = self.faults.get(node_id, Fault())
        if fault.partitioned:
            await asyncio.sleep(min(timeout, 0.01))
            raise MailboxTimeout(f"datanode {node_id} is unreachable ({instruction} region {region})")
        if fault.timeouts > 0:
            fault.timeouts -= 1
            raise MailboxTimeout(f"datanode {node_id} did not answer {instruction} of region {region} in time")
        if fault.failures > 0:
            fault.failures -= 1
            raise DatanodeError(f"datanode {node_id} refused {instruction} of region {region}")
        if fault.delay > timeout:
            await asyncio.sleep(timeout)
            raise MailboxTimeout(f"datanode {node_id} is too slow for {instruction} of region {region}")
        if fault.delay:
            await asyncio.sleep(fault.delay)
        node = self.datanodes.get(node_id)
        if node is None:
            raise DatanodeError(f"no datanode {node_id}")
        return await node.handle(instruction, region, fencing_token=fencing_token, **args)


class SimCluster:
    """Metadata, datanodes and mailbox over one store."""

    def __init__(self, store: StateStore, node_ids: list[int]) -> None:
        self.store = store
        self.metadata = ClusterMetadata(store)
        self.datanodes = {n: Datanode(n, store) for n in node_ids}
        self.mailbox = Mailbox(self.datanodes)

    async def load(self) -> None:
        """Read every datanode's replicas now (they are otherwise read on first use)."""
        for node in self.datanodes.values():
            await node.load()

    async def create_table(self, table_id: int, leaders: dict[int, int], followers: dict[int, list[int]]) -> None:
        """A table whose region `n` is led by datanode `leaders[n]`."""
        for node in self.datanodes.values():
            await node.ensure_loaded()
        regions = []
        for number, leader in sorted(leaders.items()):
            rid = region_id(table_id, number)
            regions.append(RegionRoute(rid, leader, list(followers.get(number, []))))
            self.datanodes[leader].replicas[rid] = Replica("leader", last_entry_id=100 + number)
            for f in followers.get(number, []):
                self.datanodes[f].replicas[rid] = Replica("follower")
        for node in self.datanodes.values():
            await node.save()
        await self.metadata.put_route(TableRoute(table_id, 0, regions))

    def open_regions_asynchronously(self, delay: float) -> None:
        """From now on every datanode opens a region `delay` seconds after it is asked to,
        then signals the migration that asked (`Datanode.open_delay`)."""
        for node in self.datanodes.values():
            node.open_delay = delay

    async def stop_opening(self) -> None:
        """Cancel the asynchronous opens under way (their process is gone)."""
        tasks = [task for node in self.datanodes.values() for task in node.opening]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    async def expire_lease(self, node_id: int, region: int, fencing_token: int | None = None) -> None:
        """The leader's lease on `region` ran out (nobody renewed it): it stops leading.

        This happens inside the datanode, with no message from the metasrv, which is why it
        works when the datanode cannot be reached. A procedure waits out the lease and then
        calls this to stand for it; `fencing_token` is its term's, so a deposed leader's late
        call cannot demote a region a later leader gave back to this datanode.
        """
        node = self.datanodes.get(node_id)
        if node is None:
            return
        await node.handle("lease_expired", region, fencing_token=fencing_token)


async def check_cluster(store: StateStore) -> list[str]:
    """Invariants, read from the store alone: each routed region has exactly one leading
    replica, on the datanode the route names, and no route is left mid-downgrade."""
    broken: list[str] = []
    metadata = ClusterMetadata(store)
    leaders: dict[int, list[int]] = {}
    for key in await store.walk("cluster/datanodes/"):
        node_id = int(key.rsplit("/", 1)[1].split(".")[0])
        raw = await store.get(key)
        replicas = msgspec.convert(orjson.loads(raw or b"{}"), dict[int, Replica], strict=False)
        for rid, replica in replicas.items():
            if replica.role == "leader":
                leaders.setdefault(rid, []).append(node_id)
    routed: set[int] = set()
    for table_id in await metadata.table_ids():
        route = await metadata.get_route(table_id)
        assert route is not None
        routed.update(r.region_id for r in route.regions)
        for r in route.regions:
            nodes = leaders.get(r.region_id, [])
            if nodes != [r.leader]:
                broken.append(f"region {r.region_id}: route says leader {r.leader}, datanodes leading: {nodes}")
            if r.leader_downgrading:
                broken.append(f"region {r.region_id}: route left with its leader downgrading")
    for rid, nodes in sorted(leaders.items()):
        if rid not in routed:
            broken.append(f"region {rid}: led by datanodes {nodes} but in no table route (a leaked region)")
    return broken
