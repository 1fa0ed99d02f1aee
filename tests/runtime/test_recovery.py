"""Recovery at `start()`: GreptimeDB-format stores, the latest-step rule, bad input, ordering."""

from __future__ import annotations

import asyncio
import json
import os
from pathlib import Path
from typing import Any

import msgspec
import pytest

from procstore import Lease, ProcedureFailed, ProcedureId, ProcedureManager, ProcedureWithId
from procstore.store.keys import KeyType
from procstore.store.local import LocalDirStore
from procstore.store.requests import OperatorRequest
from procstore.testing import FaultyStore
from tests.greptime import greptime_step
from tests.procedures import Steps, Undoable, World
from tests.runtime.helpers import blocker, eventually, steps, wait_for_state
from tests.support import StoreTarget, manager_for


def write_raw(root: Path, key: str, value: bytes) -> None:
    path = root / key
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(value)


async def test_recovers_a_greptimedb_written_store(tmp_path: Path) -> None:
    """Hand-written keys in GreptimeDB's format (no durable submit: steps start at 0)."""
    world = World.new()
    pid = "4f2a1c3e-8a47-4b1e-9d55-1c2b3d4e5f60"
    folder = f"procedure/{pid}"
    first = json.dumps({"world": world.name, "steps": 4, "at": 1})
    latest = json.dumps({"world": world.name, "steps": 4, "at": 2})
    write_raw(tmp_path, f"{folder}/0000000000.step", greptime_step("test::Steps", first, 0))
    write_raw(tmp_path, f"{folder}/0000000001.step", greptime_step("test::Steps", latest, 1))
    done_id = "0d6c9a59-9a3c-4a8f-8a8e-3f7b1f0c2d11"
    write_raw(tmp_path, f"procedure/{done_id}/0000000000.step", greptime_step("test::Steps", first, 0))
    write_raw(tmp_path, f"procedure/{done_id}/0000000001.commit", b"")

    recorder = FaultyStore(LocalDirStore(tmp_path))
    async with manager_for(recorder) as manager:
        assert manager.recovery_problems == []
        watcher = manager.procedure_watcher(ProcedureId.parse(pid))
        assert watcher is not None
        assert await watcher.wait() == "steps done"
    # Resumed from the latest step (at=2): steps 2 and 3 ran, not 0 or 1.
    assert world.log == ["steps/2", "steps/3"]
    puts = [op.key for op in recorder.ops if op.kind.startswith("put") and op.key.startswith("procedure/")]
    # The next state goes at latest step + 1; nothing is overwritten.
    assert puts == [f"{folder}/0000000002.step", f"{folder}/0000000003.commit"]
    # The committed one was deleted at start; the finished one after it ended.
    assert not (tmp_path / "procedure" / done_id).exists()
    assert await LocalDirStore(tmp_path).walk("procedure/") == []


async def test_greptimedb_rollback_key_resumes_rollback(tmp_path: Path) -> None:
    world = World.new()
    world.effects.add("steps/0")
    pid = "7a1d6f0e-2b3c-4d5e-8f90-a1b2c3d4e5f6"
    data = json.dumps({"world": world.name, "steps": 3, "at": 1})
    write_raw(tmp_path, f"procedure/{pid}/0000000000.step", greptime_step("test::Undoable", data, 0))
    write_raw(tmp_path, f"procedure/{pid}/0000000001.rollback", greptime_step("test::Undoable", data, 1, error="boom"))
    async with manager_for(StoreTarget("local", str(tmp_path))) as manager:
        state = await wait_for_state(manager, ProcedureId.parse(pid))
        assert state.is_failed() and state.error == "boom"
    assert world.effects == {"steps/rolled-back"}


async def test_unknown_type_and_corrupt_values_are_skipped_and_kept(tmp_path: Path) -> None:
    world = World.new()
    unknown = "11111111-2222-4333-8444-555555555555"
    corrupt = "66666666-7777-4888-8999-aaaaaaaaaaaa"
    bad_data = "bbbbbbbb-cccc-4ddd-8eee-ffffffffffff"
    write_raw(tmp_path, f"procedure/{unknown}/0000000000.step", greptime_step("app::Unregistered", "{}", 0))
    write_raw(tmp_path, f"procedure/{corrupt}/0000000000.step", b'{"type_name":"test::Steps","da')
    write_raw(tmp_path, f"procedure/{bad_data}/0000000000.step", greptime_step("test::Steps", "not json", 0))
    good = steps(world, 2)
    async with manager_for(StoreTarget("local", str(tmp_path))) as manager:
        await manager.submit(good)
    async with manager_for(StoreTarget("local", str(tmp_path))) as manager:
        problems = {str(p.procedure_id): p for p in manager.recovery_problems}
        assert set(problems) == {unknown, corrupt, bad_data}
        assert "app::Unregistered" in problems[unknown].reason and "register" in problems[unknown].hint.lower()
        assert problems[corrupt].key == f"procedure/{corrupt}/0000000000.step"
        assert "loader rejected" in problems[bad_data].reason
        # The good one went on.
        watcher = manager.procedure_watcher(good.id)
        assert watcher is not None and await watcher.wait() == "steps done"
        assert manager.procedure_state(ProcedureId.parse(unknown)) is None
    for pid in (unknown, corrupt, bad_data):
        assert (tmp_path / "procedure" / pid / "0000000000.step").exists()


async def test_rolling_back_procedures_are_resumed_first(tmp_path: Path) -> None:
    """Both want the same exclusive lock: the rolling-back one must get it first."""
    world = World.new()
    world.effects.add("rb/0")
    rb = "aaaaaaaa-0000-4000-8000-000000000001"
    run = "00000000-0000-4000-8000-000000000002"  # sorts first, so order is not an accident
    rb_data = json.dumps({"world": world.name, "steps": 3, "at": 1, "name": "rb", "exclusive": ["t"]})
    run_data = json.dumps({"world": world.name, "steps": 1, "name": "run", "exclusive": ["t"]})
    write_raw(tmp_path, f"procedure/{rb}/0000000001.rollback", greptime_step("test::Undoable", rb_data, 1, error="x"))
    write_raw(tmp_path, f"procedure/{run}/0000000000.step", greptime_step("test::Steps", run_data, 0))
    async with manager_for(StoreTarget("local", str(tmp_path))) as manager:
        await wait_for_state(manager, ProcedureId.parse(rb))
        await wait_for_state(manager, ProcedureId.parse(run))
    assert world.log == ["undo:rb/0", "rb/rolled-back", "run/0"]


async def test_restart_resumes_where_it_stopped(store_target: StoreTarget) -> None:
    world = World.new()
    name, gate = blocker()
    async with manager_for(store_target) as manager:
        watcher = await manager.submit(steps(world, 4, block=name, block_at=2))
        # Wait until step 1's result is stored (on S3 the write outlasts the step itself).
        while not any(k.endswith("0000000002.step") for k in await manager.store.store.walk("procedure/")):
            await asyncio.sleep(0.005)
    assert world.log == ["steps/0", "steps/1"]
    gate.set()
    async with manager_for(store_target) as manager:
        resumed = manager.procedure_watcher(watcher.procedure_id)
        assert resumed is not None
        assert await resumed.wait() == "steps done"
    # Step 1 persisted its result before the stop, so only steps 2 and 3 ran after it.
    assert world.log == ["steps/0", "steps/1", "steps/2", "steps/3"]


async def test_crashed_rollback_resumes_after_restart(tmp_path: Path) -> None:
    target = StoreTarget("local", str(tmp_path))
    world = World.new()
    data = {"world": world.name, "steps": 3, "fail_at": 1, "rollback_failures": 100}
    async with manager_for(target, max_retry_times=100, retry_delay=0.01) as manager:
        watcher = await manager.submit(ProcedureWithId.new(Undoable(data)))
        await eventually(lambda: watcher.state.is_rolling_back() and world.counts["steps/rollbacks"] >= 1)
    # "Crashed" mid-rollback; the rollback is not recorded as done, so it runs again.
    Undoable_data_fix = {**data, "rollback_failures": 0}
    key = (await LocalDirStore(tmp_path).walk("procedure/"))[-1]
    assert key.endswith(".rollback")
    raw = json.loads((tmp_path / key).read_bytes())
    raw["data"] = json.dumps({**json.loads(raw["data"]), **Undoable_data_fix})
    (tmp_path / key).write_bytes(json.dumps(raw, separators=(",", ":")).encode())
    async with manager_for(target) as manager:
        state = await wait_for_state(manager, watcher.procedure_id)
        assert state.is_failed() and "failed at step 1" in (state.error or "")
    assert "steps/rolled-back" in world.effects


async def test_committed_but_not_deleted_is_deleted_at_start(memory_target: StoreTarget) -> None:
    manager = ProcedureManager(memory_target.url)
    async with manager:
        pid = ProcedureId.random()
        await manager.store.store_procedure(pid, 0, "x", "d", None)
        await manager.store.commit_procedure(pid, 1)
    async with ProcedureManager(memory_target.url) as manager:
        assert await manager.store.store.walk("procedure/") == []
        assert manager.list_procedures() == []


@pytest.mark.parametrize("persist", [True, False])
async def test_recovered_procedure_keeps_step_numbers(tmp_path: Path, persist: bool) -> None:
    world = World.new()
    pid = ProcedureId.random()
    data = json.dumps({"world": world.name, "steps": 3, "at": 1, "persist": persist})
    write_raw(tmp_path, f"procedure/{pid}/0000000004.step", greptime_step("test::Steps", data, 4))
    recorder = FaultyStore(LocalDirStore(tmp_path))
    async with manager_for(recorder) as manager:
        await wait_for_state(manager, pid)
    names = [op.key.rsplit("/", 1)[1] for op in recorder.ops if op.kind.startswith("put") and "procedure/" in op.key]
    assert names == (["0000000005.step", "0000000006.commit"] if persist else ["0000000005.commit"])


def test_default_loader_is_inverse_of_dump() -> None:
    proc = Steps({"world": "w", "steps": 2, "at": 1})
    assert Steps.load(proc.dump()).data == proc.data


async def test_stale_temp_files_are_removed_after_start(tmp_path: Path) -> None:
    pid = ProcedureId.random()
    stale = tmp_path / "procedure" / str(pid) / ".tmp-deadbeef"
    fresh = stale.with_name(".tmp-in-flight")
    write_raw(tmp_path, f"procedure/{pid}/.tmp-deadbeef", b"half a wri")
    write_raw(tmp_path, f"procedure/{pid}/.tmp-in-flight", b"another writer's")
    os.utime(stale, (0, 0))
    async with ProcedureManager(tmp_path) as manager:
        assert manager.list_procedures() == []  # temp files are never procedure keys
        await eventually(lambda: not stale.exists())
        assert fresh.exists()  # younger than an hour: it may be a live writer's


async def test_a_folder_without_a_step_0_is_a_late_write_deleted_not_run(tmp_path: Path) -> None:
    """With a lease, a paused former leader's write may re-create `4.step` of a procedure that
    had finished and been deleted: resuming it would run its last step a second time. (A
    single manager resumes such a folder: `test_message_step_follows_the_key`.)"""
    world = World.new()
    stray = "5b0c3f6e-2d4a-4c8e-9f1a-7e6d5c4b3a21"
    write_raw(
        tmp_path,
        f"procedure/{stray}/0000000004.step",
        greptime_step("test::Steps", json.dumps({"world": world.name, "steps": 6, "at": 5}), 4),
    )
    live = "6c1d4a7f-3e5b-4d9f-8a2b-8f7e6d5c4b32"
    write_raw(
        tmp_path,
        f"procedure/{live}/0000000000.step",
        greptime_step("test::Steps", json.dumps({"world": world.name, "steps": 2, "at": 1}), 0),
    )
    async with manager_for(StoreTarget("local", str(tmp_path)), lease=Lease(ttl=5)) as manager:
        state = await wait_for_state(manager, ProcedureId.parse(live))
        assert state.is_done()
        assert manager.procedure_state(ProcedureId.parse(stray)) is None
    assert not (tmp_path / "procedure" / stray).exists()
    assert world.counts["steps/5"] == 0


async def test_requests_of_trees_ended_at_or_before_start_are_deleted_after_their_keys(tmp_path: Path) -> None:
    """A cancel request outlives its procedure's keys by a crash: recovery deletes the keys of
    a finished tree, then its request; a request whose procedure has no keys left goes too,
    and so does that of a rollback resumed at start; a live procedure's request stays."""
    world = World.new()
    world.effects.add("steps/0")
    data = json.dumps({"world": world.name, "steps": 3, "at": 1})
    finished, rolling_back, gone, live = (str(ProcedureId.random()) for _ in range(4))
    write_raw(tmp_path, f"procedure/{finished}/0000000000.step", greptime_step("test::Undoable", data, 0))
    write_raw(
        tmp_path, f"procedure/{finished}/0000000001.rollback", greptime_step("test::Undoable", data, 1, error="x")
    )
    write_raw(tmp_path, f"procedure/{finished}/0000000002.commit", b"")
    write_raw(tmp_path, f"procedure/{rolling_back}/0000000000.step", greptime_step("test::Undoable", data, 0))
    write_raw(
        tmp_path,
        f"procedure/{rolling_back}/0000000001.rollback",
        greptime_step("test::Undoable", data, 1, error="boom"),
    )
    write_raw(tmp_path, f"procedure/{live}/0000000000.step", greptime_step("test::NoLoader", "{}", 0))
    for pid in (finished, rolling_back, gone, live):
        write_raw(tmp_path, f"requests/{pid}.json", msgspec.json.encode(OperatorRequest.new("cancel", "stop")))
    recorder = FaultyStore(LocalDirStore(tmp_path))
    async with manager_for(recorder) as manager:
        state = await wait_for_state(manager, ProcedureId.parse(rolling_back))
        assert state.is_failed()
        await eventually(lambda: not (tmp_path / "requests" / f"{rolling_back}.json").exists())
    assert sorted(os.listdir(tmp_path / "requests")) == [f"{live}.json"]
    assert await LocalDirStore(tmp_path).walk("procedure/") == [f"procedure/{live}/0000000000.step"]
    deletes = [op.key for op in recorder.ops if "delete" in op.kind]
    last_key = max(i for i, key in enumerate(deletes) if f"procedure/{finished}/" in key)
    assert min(i for i, key in enumerate(deletes) if f"requests/{finished}.json" in key) > last_key


async def test_a_procedure_folder_that_cannot_be_listed_is_a_load_problem_and_nothing_of_its_tree_goes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A parent whose folder cannot be read was left out of the listing: recovery then took
    its committed child for a finished root's and deleted it, and reported nothing. It is a
    load problem now, like an unreadable value: kept, its children kept, the others run;
    once the folder can be read, the next start resumes it."""
    world = World.new()
    parent, child = "aaaaaaaa-1111-4000-8000-000000000001", "aaaaaaaa-1111-4000-8000-000000000002"
    data = json.dumps({"world": world.name, "steps": 2, "at": 1})
    write_raw(tmp_path, f"procedure/{parent}/0000000000.step", greptime_step("test::Steps", data, 0))
    child_step = greptime_step("test::Steps", data, 0).replace(b'"parent_id":null', f'"parent_id":"{parent}"'.encode())
    write_raw(tmp_path, f"procedure/{child}/0000000000.step", child_step)
    write_raw(tmp_path, f"procedure/{child}/0000000001.commit", b"")
    real = os.scandir
    denied = str(tmp_path / "procedure" / parent)

    def scandir(path: str) -> Any:
        if path == denied:
            raise PermissionError(13, "Permission denied", path)
        return real(path)

    monkeypatch.setattr(os, "scandir", scandir)
    async with manager_for(StoreTarget("local", str(tmp_path))) as manager:
        problems = {str(p.procedure_id): p for p in manager.recovery_problems}
        assert set(problems) == {parent}, manager.recovery_problems
        assert problems[parent].key == f"procedure/{parent}/" and "cannot be listed" in problems[parent].reason, (
            problems
        )
        assert "permissions" in problems[parent].hint
        assert any(f"procedure/{parent}/" in r.getMessage() and r.levelname == "ERROR" for r in caplog.records)
        assert await (await manager.submit(steps(world, 2))).wait() == "steps done"  # the others go on
    assert (tmp_path / "procedure" / child / "0000000001.commit").exists()
    monkeypatch.setattr(os, "scandir", real)
    async with manager_for(StoreTarget("local", str(tmp_path))) as manager:
        assert manager.recovery_problems == []
        watcher = manager.procedure_watcher(ProcedureId.parse(parent))
        assert watcher is not None and await watcher.wait() == "steps done"


def deny_listing(monkeypatch: pytest.MonkeyPatch, *folders: Path) -> None:
    """Listing `folders` fails as a folder without read permission does (tests run as root)."""
    real, denied = os.scandir, {str(f) for f in folders}

    def scandir(path: str) -> Any:
        if str(path) in denied:
            raise PermissionError(13, "Permission denied", path)
        return real(path)

    monkeypatch.setattr(os, "scandir", scandir)


@pytest.mark.parametrize("grandchild_committed", [True, False])
async def test_the_descendants_of_a_procedure_that_cannot_be_read_are_kept(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, grandchild_committed: bool
) -> None:
    """P -> C -> G with C's folder unreadable: P claims C, which cannot run, and fails; its
    tree's deletion deleted G, known only as C's child. Whatever cannot be read keeps its
    descendants: their parent may still need them."""
    world = World.new()
    p, c, g = (str(ProcedureId.random()) for _ in range(3))
    join = {"world": world.name, "stage": "join"}
    write_raw(
        tmp_path,
        f"procedure/{p}/0000000000.step",
        greptime_step("test::Parent", json.dumps({**join, "children": {"c": c}}), 0),
    )
    write_raw(
        tmp_path,
        f"procedure/{c}/0000000000.step",
        greptime_step("test::Parent", json.dumps({**join, "children": {"g": g}}), 0, p),
    )
    write_raw(
        tmp_path,
        f"procedure/{g}/0000000000.step",
        greptime_step("test::Child", json.dumps({"world": world.name, "name": "g", "stage": 1}), 0, c),
    )
    if grandchild_committed:
        write_raw(tmp_path, f"procedure/{g}/0000000001.commit", b"")
    deny_listing(monkeypatch, tmp_path / "procedure" / c)
    async with manager_for(StoreTarget("local", str(tmp_path))) as manager:
        assert [str(problem.procedure_id) for problem in manager.recovery_problems] == [c]
        watcher = manager.procedure_watcher(ProcedureId.parse(p))
        assert watcher is not None
        with pytest.raises(ProcedureFailed, match="children failed"):
            await asyncio.wait_for(watcher.wait(), 5)
    assert (tmp_path / "procedure" / g / "0000000000.step").exists()
    assert (tmp_path / "procedure" / c / "0000000000.step").exists()


async def test_a_leader_does_not_run_again_a_child_whose_folder_cannot_be_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A root stored after the leader's recovery is adopted; its child's folder cannot be
    listed. The child was unknown when the root claimed it: the root wrote its step 0 again
    (the same bytes, taken for its own lost write) and ran it from there, twice."""
    from procstore.store import ProcedureMessage
    from procstore.store.keys import KeyType

    world = World.new()
    root, child = ProcedureId.random(), ProcedureId.random()
    manager = manager_for(StoreTarget("local", str(tmp_path)), lease=Lease(ttl=2.0, holder="cp", adopt_interval=0.1))
    async with manager:
        world.apply("child/c/0")
        for step, data in enumerate(
            ({"name": "c", "world": world.name}, {"name": "c", "stage": 1, "world": world.name})
        ):
            message = ProcedureMessage("test::Child", json.dumps(data, sort_keys=True), root, step)
            await manager.store.store.put_if_absent(manager.store.key(child, step, KeyType.STEP), message.encode())
        deny_listing(monkeypatch, tmp_path / "procedure" / str(child))
        data = json.dumps({"world": world.name, "stage": "join", "children": {"c": str(child)}})
        await manager.store.create_procedure(root, "test::Parent", data, None)
        state = await wait_for_state(manager, root)
        assert state.is_failed(), state
    assert world.counts["child/c/0"] == 1


async def test_a_folder_of_ours_that_cannot_be_read_does_not_stop_recovery(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A folder below `requests/` or `history/` that cannot be read made `start()` fail, or
    recovery's deletions fail at every start: it is left out, with one warning for the
    process's life. (`requests/resume/` itself unreadable fails `start()`, naming it: without
    the resume nudges, recovery could delete a failed root an operator asked to resume.)"""
    world = World.new()
    done = "cccccccc-3333-4000-8000-000000000001"
    write_raw(tmp_path, f"procedure/{done}/0000000000.step", greptime_step("test::Steps", "{}", 0))
    write_raw(tmp_path, f"procedure/{done}/0000000001.commit", b"")
    for folder in ("requests/someone", "history/someone"):
        (tmp_path / folder).mkdir(parents=True)
    deny_listing(monkeypatch, tmp_path / "requests" / "someone", tmp_path / "history" / "someone")
    async with manager_for(StoreTarget("local", str(tmp_path)), history=True, request_poll_interval=0.02) as manager:
        assert not (tmp_path / "procedure" / done).exists()  # recovery's deletion went on
        assert await (await manager.submit(steps(world, 2))).wait() == "steps done"
        await asyncio.sleep(0.2)  # ten looks of the watch
    warned = [r.getMessage() for r in caplog.records if "cannot list" in r.getMessage()]
    assert len(warned) == 2, warned  # once per folder, not once per look


@pytest.mark.parametrize("kept", [True, False])
async def test_a_recovered_end_is_recorded_through_a_store_error(tmp_path: Path, kept: bool) -> None:
    """A root rolled back and committed, then its manager died before the end record: the
    next start records it (and, unless kept for an operator, deletes it). One failed write
    of the record is retried, not left for yet another start."""
    from procstore.store.history import HistoryStore
    from procstore.testing import Fault

    pid = "5e1f0c2a-9b8d-4c7e-8f6a-5b4c3d2e1f0a"
    data = json.dumps({"world": World.new().name, "steps": 3, "at": 1})
    write_raw(tmp_path, f"procedure/{pid}/0000000000.step", greptime_step("test::Undoable", data, 0))
    write_raw(tmp_path, f"procedure/{pid}/0000000001.rollback", greptime_step("test::Undoable", data, 1, error="boom"))
    write_raw(tmp_path, f"procedure/{pid}/0000000002.commit", b"")
    store = FaultyStore(LocalDirStore(tmp_path))
    store.plan.faults.append(Fault("transient", kinds=frozenset({"put_if_absent"}), key="history/*", times=1))
    async with manager_for(store, keep_failed=kept):
        pass
    assert [run for (id_, run) in (await HistoryStore(store).recorded()).runs if id_ == pid] == [1]
    assert (tmp_path / "procedure" / pid).exists() == kept


async def test_a_rolled_back_root_kept_for_a_refused_resume_nudge_goes(tmp_path: Path) -> None:
    """Without `keep_failed`, start() keeps a rolled-back root only because a resume nudge
    names it; resuming it is refused (rewind it instead), and then it goes as it would have
    without the nudge, its end recorded."""
    from procstore.store.history import HistoryStore
    from procstore.store.procedure_store import ProcedureStore

    pid = "6f2a1d3b-0c9e-4d8f-9a7b-6c5d4e3f2a1b"
    data = json.dumps({"world": World.new().name, "steps": 3, "at": 1})
    write_raw(tmp_path, f"procedure/{pid}/0000000000.step", greptime_step("test::Undoable", data, 0))
    write_raw(tmp_path, f"procedure/{pid}/0000000001.rollback", greptime_step("test::Undoable", data, 1, error="boom"))
    write_raw(tmp_path, f"procedure/{pid}/0000000002.commit", b"")
    nudge = OperatorRequest.new("resume", "resume", step=2)
    await ProcedureStore(LocalDirStore(tmp_path)).resumes.put(ProcedureId.parse(pid), nudge)
    async with manager_for(StoreTarget("local", str(tmp_path)), request_poll_interval=0.05):
        await eventually(lambda: not (tmp_path / "procedure" / pid).exists(), timeout=5)
    assert [run for (id_, run) in (await HistoryStore(LocalDirStore(tmp_path)).recorded()).runs if id_ == pid] == [1]
    assert not (tmp_path / "requests" / "resume" / f"{pid}.json").exists()


async def test_a_finished_procedure_recovery_deletes_goes_through_a_store_error(tmp_path: Path) -> None:
    """Recovery's deletion of a finished procedure left behind retries a failed delete
    instead of leaving the keys to the next start."""
    from procstore.testing import Fault

    pid = "7a2b3c4d-5e6f-4a7b-8c9d-0e1f2a3b4c5d"
    data = json.dumps({"world": World.new().name, "steps": 3, "at": 1})
    write_raw(tmp_path, f"procedure/{pid}/0000000000.step", greptime_step("test::Undoable", data, 0))
    write_raw(tmp_path, f"procedure/{pid}/0000000001.rollback", greptime_step("test::Undoable", data, 1, error="boom"))
    write_raw(tmp_path, f"procedure/{pid}/0000000002.commit", b"")
    store = FaultyStore(LocalDirStore(tmp_path))
    store.plan.faults.append(Fault("transient", kinds=frozenset({"batch_delete"}), times=1))
    async with manager_for(store, keep_failed=False):
        pass
    assert not (tmp_path / "procedure" / pid).exists()


@pytest.mark.parametrize("leased", [False, True], ids=["no-lease", "lease"])
async def test_a_folder_near_the_largest_step_never_writes_above_it_nor_runs_a_step_twice(
    memory_target: StoreTarget, leased: bool
) -> None:
    """A hand-written folder whose latest step is 2^32 - 2: its next states would go above
    the largest step a key can carry (under a lease, the first one skips a step), where
    every reader ignores them. No such key is written: a step whose outcome could not be
    stored is not run, the procedure stops unrecorded with an error saying so, and over two
    starts no step runs twice."""
    from procstore import EndNotRecorded
    from procstore.store import ProcedureMessage

    world = World.new()
    pid = ProcedureId.random()
    data = json.dumps({"world": world.name, "steps": 4, "at": 1})
    async with manager_for(memory_target) as writer:
        for step in (0, 2**32 - 2):
            message = ProcedureMessage("test::Steps", data, None, step).encode()
            await writer.store.store.put(writer.store.key(pid, step, KeyType.STEP), message)
    lease = Lease(ttl=1.0, holder="cp-1") if leased else None
    for _ in range(2):
        async with manager_for(memory_target, lease=lease) as manager:
            if (watcher := manager.procedure_watcher(pid)) is not None:
                with pytest.raises(EndNotRecorded, match="above step 4294967295"):
                    await watcher.wait()
            left = await manager.store.store.walk("procedure/")
        assert all(int(key.rsplit("/", 1)[1].split(".")[0]) <= 2**32 - 1 for key in left), left
    assert all(count == 1 for count in world.counts.values()), world.counts
