"""`procstore cancel`, `resume` and `rewind` refuse, changing nothing, what cannot be done."""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path

import orjson
import pytest
from click.testing import CliRunner, Result

from procstore import Context, ProcedureFailed, ProcedureId, ProcedureManager, Status
from procstore._cli.app import cli
from procstore._cli.common import ExitCode
from procstore.store.local import LocalDirStore
from procstore.store.message import ProcedureMessage
from procstore.store.procedure_store import ProcedureStore
from procstore.store.requests import OperatorRequest
from procstore.testing import kill_manager
from tests.runtime.test_operations import Flaky, Undone, flaky, manager_on


def run(*args: str) -> Result:
    return CliRunner().invoke(cli, list(args))


async def a_child_with_a_cancel_request(tmp_path: Path) -> tuple[ProcedureStore, ProcedureId]:
    store = ProcedureStore(LocalDirStore(tmp_path))
    root, child = ProcedureId.random(), ProcedureId.random()
    await store.create_procedure(root, "tests::Flaky", '{"name": "r", "at": 0, "fail_at": 9}', None)
    await store.create_procedure(child, "tests::Flaky", '{"name": "c", "at": 0, "fail_at": 9}', root)
    assert await store.requests.put(child, OperatorRequest.new("cancel", "stop the child"))
    return store, child


async def test_a_refused_forced_rewind_keeps_the_cancel_request(tmp_path: Path) -> None:
    store, child = await a_child_with_a_cancel_request(tmp_path)
    result = await asyncio.to_thread(run, "rewind", str(tmp_path), str(child), "--to-step", "0", "--force", "--yes")
    assert result.exit_code == ExitCode.REFUSED and "subprocedure" in result.output, result.output
    assert await store.requests.get(child) is not None, "a refused rewind changed nothing"
    assert len(await store.procedure_keys(child)) == 1


async def test_a_reason_or_signal_name_that_is_not_utf8_is_a_usage_error_that_changes_nothing(tmp_path: Path) -> None:
    """A shell passes bytes that are not UTF-8 (`--reason $'\\xff'`) as lone surrogates: each
    command stopped with an internal error (exit 1), and a forced rewind deleted the cancel
    request before it did."""
    store, child = await a_child_with_a_cancel_request(tmp_path)
    url, bad = str(tmp_path), "because \udcff"
    for args in [
        ("cancel", url, str(child), "--reason", bad, "--yes"),
        ("fail", url, str(child), "--reason", bad, "--yes"),
        ("resume", url, str(child), "--reason", bad, "--force"),
        ("rewind", url, str(child), "--to-step", "0", "--reason", bad, "--force", "--yes"),
        ("signal", url, str(child), "\udcff"),
    ]:
        result = await asyncio.to_thread(run, *args)
        assert result.exit_code == ExitCode.USAGE and "valid Unicode" in result.output, (args, result.output)
    assert (await store.requests.get(child)) is not None, "the cancel request stands"
    assert len(await store.procedure_keys(child)) == 1
    assert not await store.signals.keys(child)


async def test_a_refused_rewind_in_the_manager_keeps_the_cancel_request(tmp_path: Path) -> None:
    async with manager_on(str(tmp_path), keep_failed=True) as manager:
        procedure, _ = flaky(fail_at=2)
        watcher = await manager.submit(procedure)
        with pytest.raises(ProcedureFailed):
            await watcher.wait()
        pid = procedure.id
        assert await manager.store.requests.put(pid, OperatorRequest.new("cancel", "keep me"))
        await manager.store.store.put(f"procedure/{pid}/0000000001.step", b'{"type_name":"tests::Fl')
        with pytest.raises(Exception, match="cannot be read"):
            await manager.rewind(pid, 1)
        assert await manager.store.requests.get(pid) is not None


async def test_resume_refuses_an_unfinished_procedure_and_writes_no_nudge(tmp_path: Path) -> None:
    store, child = await a_child_with_a_cancel_request(tmp_path)
    root = next(p for p in await store.store.walk("procedure/") if str(child) not in p).split("/")[1]
    result = await asyncio.to_thread(run, "resume", str(tmp_path), root)
    assert result.exit_code == ExitCode.REFUSED and "is unfinished" in result.output, result.output
    assert await store.resumes.list_all() == {}


async def test_a_stale_resume_nudge_does_not_undo_a_cancel(tmp_path: Path) -> None:
    gate = asyncio.Event()

    class Held(Flaky):
        type_name = "tests::HeldForNudge"

        async def execute(self, ctx: Context) -> Status:
            await gate.wait()
            return await super().execute(ctx)

    def register(manager: ProcedureManager) -> ProcedureManager:
        manager.register(Held)
        return manager

    first = register(manager_on(str(tmp_path), keep_failed=True))
    await first.start()
    procedure, _ = flaky(Held, fail_at=9)
    await first.submit(procedure)
    await kill_manager(first)
    await first.stop()
    gate.set()
    # With no manager running: a cancel, then a resume nudge (`resume --force`, say).
    store = ProcedureStore(LocalDirStore(tmp_path))
    await store.requests.put(procedure.id, OperatorRequest.new("cancel", "wrong region"))
    await store.resumes.put(procedure.id, OperatorRequest.new("resume", "resume"))
    async with register(manager_on(str(tmp_path), keep_failed=True, request_poll_interval=0.2)) as manager:
        watcher = manager.procedure_watcher(procedure.id)
        assert watcher is not None
        with pytest.raises(ProcedureFailed, match="wrong region"):
            await watcher.wait()
        await asyncio.sleep(0.5)
        assert await store.resumes.list_all() == {}
        state = manager.procedure_state(procedure.id)
        assert state is not None and state.is_failed(), state


async def test_resume_refuses_a_subprocedure_and_a_rolled_back_root_like_the_manager(tmp_path: Path) -> None:
    async with manager_on(str(tmp_path), keep_failed=True, history=True) as manager:
        procedure, _ = flaky(Undone)
        with pytest.raises(ProcedureFailed):
            await (await manager.submit(procedure)).wait()
    store = ProcedureStore(LocalDirStore(tmp_path))
    child = ProcedureId.random()
    await store.create_procedure(child, "tests::Flaky", '{"name": "c", "at": 0, "fail_at": 9}', procedure.id)
    await store.rollback_procedure(child, ProcedureMessage("tests::Flaky", "{}", procedure.id, 1, "broke"))
    await store.commit_procedure(child, 2)  # above its rollback, as a manager writes it
    rolled_back = await asyncio.to_thread(run, "resume", str(tmp_path), str(procedure.id))
    assert rolled_back.exit_code == ExitCode.REFUSED and "rewind it instead" in rolled_back.output
    subprocedure = await asyncio.to_thread(run, "resume", str(tmp_path), str(child))
    assert subprocedure.exit_code == ExitCode.REFUSED and "subprocedure" in subprocedure.output, subprocedure.output
    assert await store.resumes.list_all() == {}


async def test_a_torn_request_is_replaced_by_cancel_from_the_command_line_and_the_api(tmp_path: Path) -> None:
    store = ProcedureStore(LocalDirStore(tmp_path))
    pid = ProcedureId.random()
    await store.create_procedure(pid, "tests::NoLoader", "{}", None)  # never runs: stays unfinished
    await store.store.put(store.requests.key(pid), b'{"kind":"cancel","rea')
    result = await asyncio.to_thread(run, "cancel", str(tmp_path), str(pid), "--yes", "--reason", "really stop")
    assert result.exit_code == 0, result.output
    stored = await store.requests.get(pid)
    assert stored is not None and stored.reason == "really stop"
    await store.store.put(store.requests.key(pid), b'{"kind":"fail","rea')
    async with manager_on(str(tmp_path), keep_failed=True) as manager:
        await manager.cancel(pid, "durable cancel")  # returns only once the request is stored
    stored = await store.requests.get(pid)
    assert stored is not None and stored.reason == "durable cancel"


async def test_a_kept_failed_root_reads_failed_in_show_as_in_ls_and_tree(tmp_path: Path) -> None:
    """keep_failed stores a failed root as a `.rollback` with a `.commit` above it: `show` (its
    last panel and `-o json`) says `failed`, as `ls` and `tree` do, never `committed`."""
    async with manager_on(str(tmp_path), keep_failed=True) as manager:
        procedure, _ = flaky(fail_at=2)
        with pytest.raises(ProcedureFailed):
            await (await manager.submit(procedure)).wait()
    pid = str(procedure.id)
    listed = await asyncio.to_thread(run, "ls", str(tmp_path), "--json")
    assert orjson.loads(listed.output)["status"] == "failed", listed.output
    tree = await asyncio.to_thread(run, "tree", str(tmp_path), pid)
    assert "failed" in tree.output and "committed" not in tree.output, tree.output
    shown = await asyncio.to_thread(run, "show", str(tmp_path), pid)
    assert shown.exit_code == 0, shown.output
    last_panel = shown.output.split("commit,")[-1]
    assert "failed: the procedure failed and ended" in last_panel and "committed" not in shown.output, shown.output
    document = orjson.loads((await asyncio.to_thread(run, "show", str(tmp_path), pid, "-o", "json")).output)
    assert [k["ended"] for k in document["keys"] if k["kind"] == "commit"] == ["failed"]
    assert all("ended" not in k for k in document["keys"] if k["kind"] != "commit")


async def test_gc_keeps_failed_roots_and_reports_or_removes_what_walks_skip(tmp_path: Path) -> None:
    """A failed root kept by keep_failed is for an operator: gc keeps it and says how to
    remove it. Old temp files in history/ and requests/ go as under procedure/, as do old
    empty procedure folders; newer temp files and lock files of keys that are gone are reported."""
    async with manager_on(str(tmp_path), keep_failed=True) as manager:
        procedure, _ = flaky(fail_at=2)
        with pytest.raises(ProcedureFailed):
            await (await manager.submit(procedure)).wait()
    pid = str(procedure.id)
    old = time.time() - 7200
    folder = tmp_path / "procedure" / pid
    empty = tmp_path / "procedure" / str(ProcedureId.random())
    empty.mkdir()
    (tmp_path / "requests").mkdir()
    paths = {
        "old": [tmp_path / "history" / ".tmp-h1", tmp_path / "requests" / ".tmp-r1", folder / ".tmp-old"],
        "new": [folder / ".tmp-new"],
        "lock": [folder / ".lock-0000000009.step"],
    }
    (tmp_path / "history").mkdir(exist_ok=True)
    for path in [p for group in paths.values() for p in group]:
        path.write_bytes(b"")
    for path in [*paths["old"], *paths["lock"], empty]:
        os.utime(path, (old, old))
    dry = await asyncio.to_thread(run, "gc", str(tmp_path), "--dry-run")
    assert dry.exit_code == 0 and "kept 1 failed" in dry.output and "procstore delete" in dry.output, dry.output
    assert all(p.exists() for group in paths.values() for p in group) and empty.exists()
    result = await asyncio.to_thread(run, "gc", str(tmp_path), "-o", "json")
    assert result.exit_code == 0, result.output
    report = orjson.loads(result.stdout)
    assert report["deleted"] == [] and report["kept_failed"] == [pid]
    assert (folder / "0000000000.step").exists()
    assert report["temp_files_removed"] == 3 and not any(p.exists() for p in paths["old"])
    assert report["empty_folders_removed"] == [f"procedure/{empty.name}/"] and not empty.exists()
    assert report["recent_temp_files"] == [f"procedure/{pid}/.tmp-new"] and paths["new"][0].exists()
    assert report["stray_lock_files"] == [f"procedure/{pid}/.lock-0000000009.step"] and paths["lock"][0].exists()
    assert any(pid in w and "procstore delete" in w for w in report["warnings"])
