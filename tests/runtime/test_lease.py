"""Leadership by lease: one manager runs procedures, the others stand by and take over."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import time
import uuid
from pathlib import Path
from typing import Any, ClassVar

import pytest
from click.testing import CliRunner

from procstore import (
    Context,
    DuplicateProcedure,
    LeaseExpired,
    NotLeader,
    Procedure,
    ProcedureId,
    ProcedureManager,
    ProcedureWithId,
    RetryLater,
    Status,
    StoreError,
    StoreUnavailable,
)
from procstore._cli.app import cli
from procstore._runtime.lease import LEASE_KEY, Lease, LeaseRecord
from procstore.store import open_state_store
from procstore.store.keys import KeyType
from procstore.store.local import LocalDirStore
from procstore.store.memory import MemoryStore
from procstore.store.message import ProcedureMessage
from procstore.store.state_store import StateStore
from procstore.store.wrapping import WrappingStore
from procstore.testing import Fault, FaultyStore, kill_manager
from tests.conftest import gcs_bucket_target
from tests.procedures import World
from tests.runtime.helpers import blocker, eventually, steps
from tests.support import StoreTarget, manager_for, store_targets

TTL = 1.0
SERVER_TTL = 2.0
"""For stores behind a server (moto answers from a thread of the test process; the GCS
emulator from another process, one request at a time): a busy CI machine slows every
request, and a second of lease is then too tight to be fair."""


def ttl_for(target: StoreTarget | StateStore) -> float:
    return SERVER_TTL if isinstance(target, StoreTarget) and target.kind in ("s3", "gcs") else TTL


def leased(target: StoreTarget | StateStore, name: str, **options: Any) -> ProcedureManager:
    return manager_for(target, lease=Lease(ttl=ttl_for(target), holder=name), **options)


shared_target = store_targets("local", "s3", "memory", "gcs")


def test_lease_record_round_trips() -> None:
    record = LeaseRecord("cp-1:7000", 3, 17, 10.0)
    assert LeaseRecord.decode(record.encode()) == record
    assert record.encode() == b'{"holder":"cp-1:7000","epoch":3,"renewal":17,"ttl":10.0,"released":false}'
    with pytest.raises(ValueError, match="not a lease record"):
        LeaseRecord.decode(b'{"holder": "x"}')


async def test_one_leads_the_other_stands_by_and_refuses_submissions(shared_target: StoreTarget) -> None:
    world = World.new()
    first, second = leased(shared_target, "cp-1"), leased(shared_target, "cp-2")
    await first.start()
    await second.start()
    try:
        assert first.is_leader and not second.is_leader
        assert second.leader == "cp-1"
        with pytest.raises(NotLeader, match="cp-2 is a standby.*the leader is 'cp-1'") as raised:
            await second.submit(steps(world, 1))
        assert raised.value.leader == "cp-1"
        watcher = await first.submit(steps(world, 2))
        assert await watcher.wait() == "steps done"
        # Renewals keep the standby waiting well past one TTL.
        await asyncio.sleep(ttl_for(shared_target) * 2.5)
        assert first.is_leader and not second.is_leader
    finally:
        await first.stop()
        await second.stop()


async def test_a_standby_takes_over_a_dead_leader_and_resumes_its_work(shared_target: StoreTarget) -> None:
    world = World.new()
    gate, opened = blocker()
    first, second = leased(shared_target, "cp-1"), leased(shared_target, "cp-2")
    await first.start()
    await second.start()
    pid = (await first.submit(steps(world, 3, block=gate, block_at=2))).procedure_id
    await eventually(lambda: world.counts["steps/1"] == 1)
    # A dead leader: its tasks stop with no release, as under kill -9.
    await kill_manager(first)
    await second.wait_until_leading()
    assert second.is_leader and second.leader == "cp-2"
    opened.set()
    watcher = second.procedure_watcher(pid)
    assert watcher is not None
    await asyncio.wait_for(watcher.wait(), 10)
    await second.stop()
    await first.stop()


async def test_a_lease_write_cut_off_by_a_killed_leader_is_taken_over_after_a_ttl(local_target: StoreTarget) -> None:
    """moto keeps the empty body of a renewal whose sender was killed after its headers: the
    standby takes it for a lease nobody holds, takes over after a TTL, and counts epochs on."""
    world = World.new()
    first, second = leased(local_target, "cp-1"), leased(local_target, "cp-2")
    await first.start()
    await second.start()
    pid = (await first.submit(steps(world, 3))).procedure_id
    await kill_manager(first)  # killed while renewing: no release...
    store = open_state_store(local_target.url)
    await store.put(LEASE_KEY, b"")  # ...and the renewal it was sending stored empty
    assert second.leader == "cp-1"
    await second.wait_until_leading()
    assert second.lease_epoch == 2
    await eventually(lambda: (s := second.procedure_state(pid)) is not None and s.is_done(), timeout=10)
    await second.stop()
    await first.stop()
    # A manager that never read a good record takes such a lease over too, counting from 1.
    await store.put(LEASE_KEY, b'{"holder": "cp-3", "epo')
    third = leased(local_target, "cp-3")
    await third.start()
    await third.wait_until_leading()
    assert third.lease_epoch == 1
    await third.stop()


async def test_a_clean_stop_hands_over_at_once(shared_target: StoreTarget, caplog: pytest.LogCaptureFixture) -> None:
    first, second = leased(shared_target, "cp-1"), leased(shared_target, "cp-2")
    await first.start()
    await second.start()
    await first.stop()
    await second.wait_until_leading()
    # Taken over because the lease was released, not because it expired (that is logged).
    assert "not renewed" not in caplog.text
    await second.stop()


async def test_a_holder_that_cannot_renew_stops_its_runners_before_the_lease_ends(local_target: StoreTarget) -> None:
    world = World.new()
    store = FaultyStore(open_state_store(local_target.url))
    first = leased(store, "cp-1")
    second = leased(local_target, "cp-2")
    await first.start()
    await second.start()
    gate, opened = blocker()
    pid = (await first.submit(steps(world, 3, block=gate, block_at=1))).procedure_id
    # From now on every write of the leader's fails: renewals too.
    store.plan.faults.append(Fault("transient"))
    await eventually(lambda: not first.is_leader, timeout=TTL * 2)
    opened.set()
    await second.wait_until_leading()
    watcher = second.procedure_watcher(pid)
    assert watcher is not None
    await asyncio.wait_for(watcher.wait(), 10)
    await first.stop()
    await second.stop()
    await store.inner.close()


async def test_a_paused_leader_is_fenced_by_its_own_lease(local_target: StoreTarget) -> None:
    """The event loop blocked past the lease (as a SIGSTOP would): the runner that wakes up
    first is refused its write; nothing is written until the lease is won again."""
    world = World.new()
    store = FaultyStore(open_state_store(local_target.url))
    manager = leased(store, "cp-1")
    await manager.start()
    gate, opened = blocker()
    pid = (await manager.submit(steps(world, 3, block=gate, block_at=1))).procedure_id
    await eventually(lambda: world.counts["steps/0"] == 1)
    time.sleep(TTL * 1.2)  # noqa: ASYNC251 - the point: nothing in this process runs, no renewal, no runner
    paused_at = len(store.ops)
    opened.set()  # the runner may run before the lease task: its write of 2.step must be refused
    await eventually(lambda: (s := manager.procedure_state(pid)) is not None and s.is_done(), timeout=10)
    writes = [op for op in store.ops[paused_at:] if op.kind in ("put", "put_if_absent", "put_if_version")]
    # The lease was taken again (epoch 2) before any step was written, and the new term
    # resumed the procedure from the store.
    assert writes[0].key == LEASE_KEY, writes[:3]
    assert manager.lease_epoch == 2
    await manager.stop()
    await store.inner.close()


async def test_lease_mode_needs_compare_and_swap(wrapped_target: StoreTarget) -> None:
    """fsspec's own local filesystem checks, then writes: no lease can be kept on it."""
    manager = ProcedureManager(wrapped_target.url, wrapped_target.storage_options, lease=Lease(ttl=1))
    with pytest.raises(StoreUnavailable, match="needs compare-and-swap and create-only writes"):
        await manager.start()
    assert not manager.is_running


async def test_lease_mode_refuses_a_server_that_ignores_preconditions(plain_gcs_endpoint: str) -> None:
    """The GCS emulator as it ships accepts every conditional write: start() tries one and says so."""
    target = gcs_bucket_target(plain_gcs_endpoint)
    manager = ProcedureManager(target.url, target.storage_options, lease=Lease(ttl=1))
    with pytest.raises(StoreUnavailable, match=r"lease/probe-.*replaced an existing object.*cannot be fenced"):
        await manager.start()
    assert not manager.is_running
    plain = ProcedureManager(target.url, target.storage_options)  # a single manager needs no lease
    await plain.start()
    await plain.stop()


class IgnoresIfMatch(WrappingStore):
    """A store whose compare-and-swap writes whatever the version (a proxy dropping If-Match)."""

    async def put_if_version(self, key: str, value: bytes, version: str | None) -> bool:
        await self.inner.put(key, value)
        return True


async def test_lease_mode_refuses_a_store_whose_compare_and_swap_ignores_the_version(
    memory_target: StoreTarget,
) -> None:
    store = IgnoresIfMatch(open_state_store(memory_target.url))
    manager = ProcedureManager(store, lease=Lease(ttl=1))
    with pytest.raises(StoreUnavailable, match="compare-and-swap on a replaced version was accepted"):
        await manager.start()
    assert await store.walk("") == []  # the probe's key is gone


def test_lease_option_takes_a_lease_a_ttl_or_true() -> None:
    assert Lease.from_option(None) is None and Lease.from_option(False) is None
    default, three = Lease.from_option(True), Lease.from_option(3)
    assert default is not None and default.ttl == 10.0
    assert three is not None and three.ttl == 3.0
    lease = Lease(ttl=2, holder="cp-1")
    assert Lease.from_option(lease) is lease
    with pytest.raises(ValueError, match="ttl must be between"):
        Lease(ttl=0)


async def test_a_leader_that_finds_a_former_leaders_late_step_reloads_and_goes_on(
    local_target: StoreTarget, caplog: pytest.LogCaptureFixture
) -> None:
    """The late write of a paused former leader lands before the new leader's own: different
    bytes at the same step. The term restarts from the store, that step included."""
    world = World.new()
    manager = leased(local_target, "cp-2")
    await manager.start()
    gate, opened = blocker()
    pid = (await manager.submit(steps(world, 4, block=gate, block_at=1))).procedure_id
    await eventually(lambda: world.counts["steps/0"] == 1)
    late = {"world": world.name, "steps": 4, "at": 2, "by": "the former leader"}
    await manager.store.store_procedure(pid, 2, "test::Steps", json.dumps(late, sort_keys=True), None)
    opened.set()  # the runner computes its own 2.step and finds the late one there
    await eventually(lambda: (s := manager.procedure_state(pid)) is not None and s.is_done(), timeout=10)
    assert manager.is_leader
    assert [world.counts[f"steps/{at}"] for at in range(4)] == [1, 1, 1, 1]
    assert "already written by another manager" in caplog.text and "reloading every procedure" in caplog.text
    # The same lease (epoch 1): the term restarted, the leadership did not change hands.
    assert manager.lease_epoch == 1
    await manager.stop()


async def test_a_leader_adopts_a_procedure_stored_after_its_recovery(local_target: StoreTarget) -> None:
    """A submit whose answer came back after its manager lost the lease: the write landed,
    but after the new leader's recovery had listed the store."""
    world = World.new()
    manager = manager_for(local_target, lease=Lease(ttl=TTL, holder="cp-2", adopt_interval=0.1))
    await manager.start()
    late = steps(world, 2)
    await manager.store.create_procedure(late.id, "test::Steps", late.procedure.dump(), None)
    await eventually(lambda: (s := manager.procedure_state(late.id)) is not None and s.is_done(), timeout=10)
    assert world.counts["steps/0"] == world.counts["steps/1"] == 1
    await manager.stop()


async def test_a_leader_deletes_keys_a_late_write_re_created_after_the_procedure_finished(
    local_target: StoreTarget,
) -> None:
    """A former leader paused beyond the grace delivers a step or a commit of a procedure
    that has finished and been deleted since: the folder holds that one key. Nothing runs
    it, and the leader's next looks delete it."""
    world = World.new()
    manager = manager_for(local_target, lease=Lease(ttl=TTL, holder="cp-2", adopt_interval=0.1, late_write_grace=0))
    await manager.start()
    late_step, late_commit = steps(world, 5), steps(world, 5)
    message = ProcedureMessage("test::Steps", late_step.procedure.dump(), None, 3).encode()
    await manager.store.store.put_if_absent(manager.store.key(late_step.id, 3, KeyType.STEP), message)
    await manager.store.store.put_if_absent(manager.store.key(late_commit.id, 4, KeyType.COMMIT), b"")
    folders = Path(local_target.url) / "procedure"
    assert {p.name for p in folders.iterdir()} == {str(late_step.id), str(late_commit.id)}
    await eventually(lambda: not any(folders.iterdir()), timeout=10)
    assert manager.procedure_state(late_step.id) is None and world.log == []
    await manager.stop()


@pytest.mark.parametrize("torn", ["0000000001.step", "0000000001.rollback"])
async def test_a_leader_resumes_past_an_empty_latest_key_without_writing_it_again(tmp_path: Path, torn: str) -> None:
    """A create cut off by a killed writer can leave an empty object on a test S3 server. The
    procedure resumes from the step below and writes its next key one above: no key is ever
    created twice, even an empty one (a versioned bucket would show a second version)."""
    world = World.new()
    submitted = steps(world, 3)
    folder = tmp_path / "procedure" / str(submitted.id)
    folder.mkdir(parents=True)
    first = ProcedureMessage("test::Steps", submitted.procedure.dump(), None, 0).encode()
    (folder / "0000000000.step").write_bytes(first)
    (folder / torn).write_bytes(b"")
    store = FaultyStore(LocalDirStore(tmp_path))
    manager = manager_for(store, lease=Lease(ttl=TTL, holder="cp-1"))
    await manager.start()
    assert manager.recovery_problems == []
    await eventually(lambda: (s := manager.procedure_state(submitted.id)) is not None and s.is_done(), timeout=10)
    assert [world.counts[f"steps/{at}"] for at in range(3)] == [1, 1, 1]
    written = [
        op.key.rsplit("/", 1)[1]
        for op in store.ops
        if op.kind == "put_if_absent" and f"procedure/{submitted.id}" in op.key
    ]
    # Never 1 again, and 2 is left free for a former leader's late write (`Runner._message_step`).
    assert written == ["0000000003.step", "0000000004.step", "0000000005.commit"]
    await manager.stop()


async def test_a_leader_deletes_an_empty_submitted_state(tmp_path: Path) -> None:
    """An empty step 0 is a submit cut off before it returned: there is nothing to resume."""
    folder = tmp_path / "procedure" / str(ProcedureId.random())
    folder.mkdir(parents=True)
    (folder / "0000000000.step").write_bytes(b"")
    manager = manager_for(StoreTarget("local", str(tmp_path)), lease=Lease(ttl=TTL, holder="cp-1"))
    await manager.start()
    assert manager.recovery_problems == [] and manager.list_procedures() == []
    assert not list(folder.glob("*"))
    await manager.stop()


async def test_a_submit_whose_lease_ends_while_it_retries_reports_an_unknown_outcome(
    local_target: StoreTarget,
) -> None:
    """The first create lands but its answer is lost; the lease ends during the backoff.
    `LeaseExpired` would claim nothing was stored: submit says the outcome is unknown, and
    the new leader, which recovered the procedure, answers a resubmit with DuplicateProcedure."""
    world = World.new()
    store = FaultyStore(open_state_store(local_target.url))
    first = leased(store, "cp-1", retry_delay=TTL * 2, max_retry_delay=TTL * 2)
    second = leased(local_target, "cp-2")
    await first.start()
    await second.start()
    create = frozenset({"put_if_absent"})
    store.plan.faults += [
        Fault("transient", kinds=create, key="*/0000000000.step", nth=0, when="after"),
        Fault("transient", kinds=frozenset({"put_if_version"}), key=LEASE_KEY),  # no renewal succeeds
    ]
    procedure = steps(world, 2)
    with pytest.raises(StoreError, match="may have landed") as info:
        await first.submit(procedure)
    assert not isinstance(info.value, LeaseExpired)
    await second.wait_until_leading()
    watcher = second.procedure_watcher(procedure.id)
    assert watcher is not None
    await asyncio.wait_for(watcher.wait(), 10)
    with pytest.raises(DuplicateProcedure):
        await second.submit(procedure)
    assert world.log == ["steps/0", "steps/1"]
    await first.stop()
    await second.stop()
    await store.inner.close()


class SideEffect(Procedure):
    """Two steps; the second checks the lease, then records its fencing token (its side effect)."""

    type_name = "tests::SideEffect"
    effects: ClassVar[dict[str, list[int | None]]] = {}
    gates: ClassVar[dict[str, asyncio.Event]] = {}

    def __init__(self, name: str, at: int = 0) -> None:
        self.name, self.at = name, at

    async def execute(self, ctx: Context) -> Status:
        if self.at == 0:
            self.at = 1
            return Status.executing(persist=True)
        await self.gates[self.name].wait()
        ctx.check_lease()
        self.effects.setdefault(self.name, []).append(ctx.fencing_token)
        return Status.done()

    def dump(self) -> str:
        return json.dumps([self.name, self.at])

    @classmethod
    def load(cls, data: str) -> SideEffect:
        return cls(*json.loads(data))

    @classmethod
    def new(cls) -> tuple[ProcedureWithId, str, asyncio.Event]:
        name = uuid.uuid4().hex
        cls.gates[name] = asyncio.Event()
        return ProcedureWithId.new(cls(name)), name, cls.gates[name]


async def test_a_step_sees_its_leaders_epoch_as_fencing_token(memory_target: StoreTarget) -> None:
    first, second = leased(memory_target, "cp-1"), leased(memory_target, "cp-2")
    alone = manager_for(memory_target)
    for manager in (first, second, alone):
        manager.register(SideEffect)
    await first.start()
    await second.start()
    procedure, name, gate = SideEffect.new()
    await first.submit(procedure)
    await eventually(lambda: first.procedure_state(procedure.id) is not None)
    await kill_manager(first)  # dies without releasing, after its first step
    await second.wait_until_leading()
    gate.set()
    watcher = second.procedure_watcher(procedure.id)
    assert watcher is not None
    await asyncio.wait_for(watcher.wait(), 10)
    assert SideEffect.effects[name] == [2]  # cp-1 held epoch 1, cp-2 took over with 2
    await first.stop()
    await second.stop()
    # Without a lease there is no token and nothing to check.
    await alone.start()
    procedure, name, gate = SideEffect.new()
    gate.set()
    await (await alone.submit(procedure)).wait()
    assert SideEffect.effects[name] == [None]
    await alone.stop()


async def test_a_step_that_finds_its_lease_gone_before_a_side_effect_resumes_under_the_next_term(
    local_target: StoreTarget,
) -> None:
    manager = leased(local_target, "cp-1")
    manager.register(SideEffect)
    await manager.start()
    procedure, name, gate = SideEffect.new()
    await manager.submit(procedure)
    await eventually(lambda: (s := manager.procedure_state(procedure.id)) is not None and s.kind.name == "RUNNING")
    time.sleep(TTL * 1.2)  # noqa: ASYNC251 - a paused process: no renewal
    gate.set()  # the step may wake before the lease task: its check must refuse the side effect
    await eventually(lambda: SideEffect.effects.get(name) is not None, timeout=10)
    # Not failed: the step ran again in the next term (epoch 2), and only there acted.
    assert SideEffect.effects[name] == [2]
    await eventually(lambda: (s := manager.procedure_state(procedure.id)) is not None and s.is_done())
    await manager.stop()


class RetriesUntilAllowed(Procedure):
    """One step that asks to be retried until the test allows it; records each attempt's token."""

    type_name = "tests::RetriesUntilAllowed"
    attempts: ClassVar[dict[str, list[int | None]]] = {}
    allowed: ClassVar[set[str]] = set()

    def __init__(self, name: str) -> None:
        self.name = name

    async def execute(self, ctx: Context) -> Status:
        self.attempts.setdefault(self.name, []).append(ctx.fencing_token)
        if self.name not in self.allowed:
            raise RetryLater("not yet")
        return Status.done()

    def dump(self) -> str:
        return json.dumps(self.name)

    @classmethod
    def load(cls, data: str) -> RetriesUntilAllowed:
        return cls(json.loads(data))


async def test_no_attempt_starts_once_the_lease_may_have_passed(local_target: StoreTarget) -> None:
    """A retry due after the lease lapsed (a pause, a long backoff) is not attempted: the term
    ends, and the step runs again only under the next one."""
    store = FaultyStore(open_state_store(local_target.url))
    manager = leased(store, "cp-1", retry_delay=0.02, max_retry_delay=0.02, max_retry_times=10_000)
    manager.register(RetriesUntilAllowed)
    await manager.start()
    name = uuid.uuid4().hex
    await manager.submit(ProcedureWithId.new(RetriesUntilAllowed(name)))
    await eventually(lambda: len(RetriesUntilAllowed.attempts.get(name, [])) >= 3)
    # No renewal succeeds from here: the lease as this manager counts it runs out while
    # retries keep falling due every 20 ms.
    store.plan.faults.append(Fault("transient", kinds=frozenset({"put_if_version"}), key=LEASE_KEY))
    await eventually(lambda: not manager.is_leader, timeout=10)
    store.plan.faults.clear()
    before = len(RetriesUntilAllowed.attempts[name])
    RetriesUntilAllowed.allowed.add(name)
    await eventually(lambda: RetriesUntilAllowed.attempts[name][-1] == 2, timeout=10)
    assert set(RetriesUntilAllowed.attempts[name][:before]) == {1}
    assert RetriesUntilAllowed.attempts[name][before:] == [2]  # no attempt under the lapsed term
    await manager.stop()
    await store.inner.close()


@pytest.mark.parametrize(("ttl", "warned"), [(0.4, True), (3.9, True), (4.0, False), (10.0, False)])
async def test_a_lease_renewed_faster_than_gcs_allows_is_warned_about_at_start(
    ttl: float, warned: bool, caplog: pytest.LogCaptureFixture
) -> None:
    """GCS takes about one write a second to one object; renewals come every ttl / 4."""
    store = MemoryStore(f"gcs-limit-{uuid.uuid4()}")
    store.url = "gs://bucket/cp/"  # what the warning goes by: the store's URL
    async with manager_for(store, lease=Lease(ttl=ttl, holder="cp-1")):
        pass
    said = [r.getMessage() for r in caplog.records if "write/s per object" in r.getMessage()]
    assert bool(said) == warned, said
    if warned:
        assert "Lease(ttl >= 4)" in said[0]


@pytest.mark.parametrize(("n", "left"), [(1, ["0000000001.commit"]), (2, ["0000000002.step", "0000000003.commit"])])
def test_a_former_leaders_late_rollback_never_reads_as_the_end_of_a_run_that_committed(
    tmp_path: Path, n: int, left: list[str]
) -> None:
    """A former leader's `.rollback`, sent before it lost the lease and landing late at the
    step above the latest key, must not turn the run the next leader committed into a failed
    one (cluster simulator, ledger seed 14188). The next leader's first message leaves that
    step free; a commit ends the message below its own step."""
    world = World.new()
    submitted = steps(world, n)
    folder = tmp_path / "procedure" / str(submitted.id)
    folder.mkdir(parents=True)
    first = ProcedureMessage("test::Steps", submitted.procedure.dump(), None, 0)
    (folder / "0000000000.step").write_bytes(first.encode())

    async def take_over() -> None:
        manager = manager_for(LocalDirStore(tmp_path), lease=Lease(ttl=TTL, holder="cp-2"))
        await manager.start()
        await eventually(lambda: (s := manager.procedure_state(submitted.id)) is not None and s.is_done(), timeout=10)
        await manager.stop()  # within the late-write grace: its keys are kept

    asyncio.run(take_over())
    late = dataclasses.replace(first, step=1, error="the former leader's failure")
    (folder / "0000000001.rollback").write_bytes(late.encode())
    listed = CliRunner().invoke(cli, ["ls", str(tmp_path), "--json"]).stdout
    assert [json.loads(row)["status"] for row in listed.splitlines()] == ["done"], sorted(os.listdir(folder))
    assert sorted(os.listdir(folder)) == sorted(["0000000000.step", "0000000001.rollback", *left])
