"""Reproductions of the outside review's cases against "What is guaranteed" (issue 14).

Each test failed on the code before its fix. They go through the public API, with real
stores: a local directory, memory://, and moto over HTTP for S3.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from procstore import (
    EndNotRecorded,
    InvalidProcedureId,
    ProcedureFailed,
    ProcedureId,
    ProcedureManager,
    ProcedureWithId,
)
from procstore.store.keys import MAX_STEP, KeyType
from procstore.store.local import LocalDirStore
from procstore.store.message import ProcedureMessage
from procstore.store.open import open_state_store
from procstore.store.procedure_store import ProcedureStore
from procstore.testing import Fault, FaultyStore
from procstore.testing.pytest_plugin import create_bucket, free_port, s3_storage_options
from tests.procedures import World
from tests.runtime.guarantee_procedures import LostCommit, Region, Stamped, Table
from tests.runtime.helpers import blocker, steps
from tests.support import StoreTarget, manager_for

PROCEDURES = (Region, Table, Stamped)


async def _run_until_crash(tmp_path: Path, procedure: ProcedureWithId, crash: Fault) -> None:
    """Submit `procedure` on a local store and let it run until `crash` kills the manager."""
    crashing = FaultyStore(LocalDirStore(tmp_path), faults=[crash])
    async with manager_for(crashing, *PROCEDURES) as manager:
        await manager.submit(procedure)
        while not crashing.crashed.is_set():
            await asyncio.sleep(0.01)


async def _restart_and_settle(store_url: str, seconds: float = 0.5) -> ProcedureManager:
    manager = manager_for(store_url, *PROCEDURES)
    async with manager:
        await asyncio.sleep(seconds)
    return manager


# -- case 1: a partial bulk delete never leaves a step without its end ---------------------


@pytest.fixture
def s3_with_delete_errors() -> Iterator[tuple[str, dict[str, object]]]:
    """moto over HTTP, behind a middleware that fails one key of the first DeleteObjects."""
    from moto.moto_server.werkzeug_app import MotoRequestHandler
    from werkzeug.serving import make_server

    from procstore.testing.s3_server import make_app

    port = free_port()
    server = make_server(
        "127.0.0.1", port, make_app(delete_errors=1), threaded=True, request_handler=MotoRequestHandler
    )
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    endpoint = f"http://127.0.0.1:{port}"
    try:
        yield f"s3://{create_bucket(endpoint)}/cp/", s3_storage_options(endpoint)
    finally:
        server.shutdown()


async def test_s3_per_key_delete_error_is_retried_and_the_commit_goes_last(
    s3_with_delete_errors: tuple[str, dict[str, object]],
) -> None:
    url, options = s3_with_delete_errors
    world = World.new()
    async with manager_for(url, *PROCEDURES, storage_options=options) as manager:
        await (await manager.submit(steps(world, 3))).wait()
    async with manager_for(url, *PROCEDURES, storage_options=options) as manager:
        await asyncio.sleep(0.3)
        assert await manager.store.store.walk("procedure/") == []
    assert world.counts == {"steps/0": 1, "steps/1": 1, "steps/2": 1}


# -- case 2: a finished rollback never runs again -----------------------------------------


async def test_a_childs_finished_rollback_never_runs_again_after_its_parent_committed(tmp_path: Path) -> None:
    world = World.new()
    table = Table.new(world.name)
    # The process dies at the first delete after the table's commit: every key is still there.
    crashing = FaultyStore(LocalDirStore(tmp_path), faults=[Fault("crash", kinds=frozenset({"batch_delete"}), nth=0)])
    manager = manager_for(crashing, *PROCEDURES)
    async with manager:
        watcher = await manager.submit(table)
        while not crashing.crashed.is_set():
            await asyncio.sleep(0.01)
        assert watcher.state.is_running()
    assert world.effects == {"region/r1"}

    await _restart_and_settle(str(tmp_path))
    assert world.effects == {"region/r1"}, "the committed table lost its region"
    assert world.counts["rollback/r1/0"] == 1
    assert await LocalDirStore(tmp_path).walk("procedure/") == []


async def test_a_rolled_back_root_is_sealed_and_its_rollback_never_reruns(tmp_path: Path) -> None:
    world = World.new()
    pwid = ProcedureWithId.new(Region({"world": world.name, "name": "r9", "fail": True, "attempt": 0}))
    await _run_until_crash(tmp_path, pwid, Fault("crash", kinds=frozenset({"batch_delete"}), nth=0))
    names = sorted(k.rsplit("/", 1)[1] for k in await LocalDirStore(tmp_path).walk(f"procedure/{pwid.id}/"))
    assert names == ["0000000000.step", "0000000001.step", "0000000002.rollback", "0000000003.commit"]
    await _restart_and_settle(str(tmp_path))
    assert world.counts["rollback/r9/0"] == 1


# -- case 3: an unreadable value at recovery is never deleted -------------------------------


async def test_a_committed_childs_unreadable_step_is_kept_and_the_child_never_runs_twice(tmp_path: Path) -> None:
    world = World.new()
    table = Table.new(world.name)
    first_child = ProcedureId.parse(table.procedure.data["children"][0])  # type: ignore[attr-defined]
    creates = frozenset({"put_if_absent"})
    await _run_until_crash(tmp_path, table, Fault("crash", kinds=creates, key=f"*{first_child}*.commit", when="after"))
    child_dir = tmp_path / "procedure" / str(first_child)
    rollback_key = sorted(child_dir.iterdir())[-2]
    assert rollback_key.name.endswith(".rollback")
    rollback_key.write_bytes(b"{corrupt")  # the value that says whose child it is

    manager = await _restart_and_settle(str(tmp_path))
    assert any(str(first_child) in p.key for p in manager.recovery_problems)
    assert rollback_key.exists(), "an unreadable value was deleted"
    assert world.counts["rollback/r1/0"] == 1
    assert world.counts["region/r1"] == 1, "the child ran twice"


# -- case 4: never two terminal keys -----------------------------------------------------------


@pytest.mark.parametrize("reads_fail", [False, True])
async def test_a_commit_whose_answer_was_lost_is_read_back_before_anything_else(
    tmp_path: Path, reads_fail: bool
) -> None:
    world = World.new()
    pwid = steps(world, 2)
    async with manager_for(LostCommit(LocalDirStore(tmp_path), reads_fail=reads_fail), *PROCEDURES) as manager:
        watcher = await manager.submit(pwid)
        if reads_fail:
            with pytest.raises(EndNotRecorded, match="cannot say whether"):
                await watcher.wait()
        else:
            await watcher.wait()
    names = [k.rsplit(".", 1)[1] for k in await LocalDirStore(tmp_path).walk(f"procedure/{pwid.id}/")]
    assert "rollback" not in names
    if reads_fail:
        # Left for the next start, which finds the commit and finishes.
        await _restart_and_settle(str(tmp_path))
        assert await LocalDirStore(tmp_path).walk("procedure/") == []


# -- case 5: one dump per step ---------------------------------------------------------------


async def test_a_retried_write_sends_the_bytes_of_its_first_attempt(memory_target: StoreTarget) -> None:
    world = World.new()
    lost_answer = Fault("transient", kinds=frozenset({"put_if_absent"}), key="*/0000000001.step", when="after", nth=0)
    store = FaultyStore(open_state_store(memory_target.url, {}), faults=[lost_answer])
    async with manager_for(store, *PROCEDURES) as manager:
        await (await manager.submit(ProcedureWithId.new(Stamped({"world": world.name})))).wait()
        # The manager is still in charge: an unrelated procedure runs.
        await (await manager.submit(steps(world, 1))).wait()
    assert lost_answer.fired == 1
    assert world.counts["stamped/0"] == 1


# -- case 6: a rolling-back parent's children roll back first --------------------------------


async def test_a_parent_marked_rolling_back_rolls_back_its_unfinished_children(tmp_path: Path) -> None:
    world = World.new()
    table = Table.new(world.name)
    child = ProcedureId.parse(table.procedure.data["children"][0])  # type: ignore[attr-defined]
    # Stop after the child created its region and stored its step, before it fails.
    creates = frozenset({"put_if_absent"})
    await _run_until_crash(
        tmp_path, table, Fault("crash", kinds=creates, key=f"*{child}/0000000001.step", when="after")
    )
    assert world.effects == {"region/r1"}
    # An operator marks the table failed the way GreptimeDB's tools and older procstore did.
    store = ProcedureStore(LocalDirStore(tmp_path))
    message = ProcedureMessage(Table.type_name, table.procedure.dump(), None, 2, "failed by an operator")
    await store.rollback_procedure(table.id, message)

    await _restart_and_settle(str(tmp_path))
    assert world.effects == set(), "the child's region leaked: its keys went without its rollback"
    assert world.counts["rollback/r1/0"] == 1
    assert await LocalDirStore(tmp_path).walk("procedure/") == []


# -- case 7: an operator's fail reaches the running manager ----------------------------------


@pytest.mark.parametrize("lease", [None, 5.0])
async def test_an_operators_request_stops_a_running_procedure_before_its_next_step(
    store_target: StoreTarget, lease: float | None
) -> None:
    world = World.new()
    name, gate = blocker()
    pwid = steps(world, 4, block=name, block_at=1)
    async with manager_for(store_target, lease=lease) as manager:
        await manager.wait_until_leading()
        watcher = await manager.submit(pwid)
        while world.counts["steps/0"] == 0:
            await asyncio.sleep(0.01)
        # Another process's view of the store, as the CLI writes it: beside a leader, a
        # manager without the lease would refuse to start (it would run the leader's work).
        other = ProcedureManager(store_target.url, store_target.storage_options, lease=lease)
        await other.start()
        try:
            await other.cancel(pwid.id, "stuck since 3am")
        finally:
            await other.stop()
        gate.set()
        with pytest.raises(ProcedureFailed, match="stuck since 3am"):
            await watcher.wait()
    assert world.counts["steps/2"] == 0 and world.counts["steps/3"] == 0


async def test_a_request_reaches_a_parent_waiting_for_its_children(memory_target: StoreTarget) -> None:
    world = World.new()
    table = Table.new(world.name)
    async with manager_for(memory_target.url, *PROCEDURES, request_poll_interval=0.05) as manager:
        # Cancel at once: the table is suspended on its first child or about to be.
        watcher = await manager.submit(table)
        await manager.cancel(table.id, "operator says no")
        with pytest.raises(ProcedureFailed, match="operator says no"):
            await watcher.wait()
    assert "region/r1" not in world.effects


async def test_cancelling_an_ended_or_unknown_procedure_is_a_clear_error(memory_target: StoreTarget) -> None:
    world = World.new()
    async with manager_for(memory_target) as manager:
        pwid = steps(world, 1)
        await (await manager.submit(pwid)).wait()
        with pytest.raises(Exception, match="already ended"):
            await manager.cancel(pwid.id, "late")
        with pytest.raises(Exception, match="not in the store"):
            await manager.cancel(ProcedureId.random(), "who?")


# -- case 8: ids ---------------------------------------------------------------------------------


@pytest.mark.parametrize("bad", ["../../escaped", "9F805A1F-05F7-490C-9F91-BD56E3CC54C1", "", "x" * 36])
async def test_an_id_that_is_not_canonical_is_refused_and_nothing_is_written(tmp_path: Path, bad: str) -> None:
    world = World.new()
    async with manager_for(StoreTarget("local", str(tmp_path / "store"))) as manager:
        with pytest.raises(InvalidProcedureId, match="not a procedure id"):
            await manager.submit(ProcedureWithId(bad, steps(world, 1).procedure))  # type: ignore[arg-type]
    assert await LocalDirStore(tmp_path / "store").walk("") == []


# -- case 9: bad stored values ---------------------------------------------------------------


async def test_parent_cycles_and_oversized_steps_are_load_problems_and_kept(tmp_path: Path) -> None:
    store = LocalDirStore(tmp_path)
    procedures = ProcedureStore(store)
    a, b, selfish, huge = (ProcedureId.random() for _ in range(4))
    for pid, parent in ((a, b), (b, a), (selfish, selfish)):
        await procedures.create_procedure(pid, "test::Steps", '{"steps": 2, "world": "nowhere"}', parent)
    await store.put(
        procedures.key(huge, MAX_STEP, KeyType.STEP),
        ProcedureMessage("test::Steps", '{"steps": 2, "world": "nowhere"}', None, 0).encode(),
    )
    before = sorted(await store.walk("procedure/"))
    world = World.new()
    async with manager_for(StoreTarget("local", str(tmp_path))) as manager:
        problems = {p.procedure_id: p.reason for p in manager.recovery_problems}
        assert "cycle" in problems[a] and "cycle" in problems[b] and "cycle" in problems[selfish]
        assert "the largest a procedure can write" in problems[huge]
        await (await manager.submit(steps(world, 2))).wait()  # the others go on
    assert sorted(await store.walk("procedure/")) == before


def test_the_cli_lists_a_parent_cycle_instead_of_overflowing(tmp_path: Path) -> None:
    from click.testing import CliRunner

    from procstore._cli.app import cli

    a, b = ProcedureId.random(), ProcedureId.random()

    async def write() -> None:
        procedures = ProcedureStore(LocalDirStore(tmp_path))
        await procedures.create_procedure(a, "t", "{}", b)
        await procedures.create_procedure(b, "t", "{}", a)

    asyncio.run(write())
    for command in (["ls", str(tmp_path)], ["tree", str(tmp_path), str(a)]):
        result = CliRunner().invoke(cli, command)
        assert result.exit_code == 0, result.output
        assert "cycle" in result.output
