"""`procstore resume` and `rewind` while a leader runs, on a local directory, S3 and GCS."""

from __future__ import annotations

import asyncio
import json
import uuid
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

from procstore import Lease, ProcedureFailed, ProcedureManager
from procstore._cli.app import cli
from procstore._cli.common import ExitCode
from tests.runtime.test_operations import Flaky, flaky, manager_on
from tests.support import StoreTarget, store_targets

target = store_targets("local", "s3", "gcs")


def leader(target: StoreTarget) -> ProcedureManager:
    return manager_on(
        target.url,
        storage_options=target.storage_options,
        lease=Lease(ttl=10.0, holder="cp-1"),
        keep_failed=True,
        request_poll_interval=0.05,
    )


async def procstore(target: StoreTarget, *args: str) -> Result:
    options = [a for k, v in target.storage_options.items() for a in ("-s", f"{k}={v}")]
    command = [args[0], target.url, *options, *args[1:]]
    return await asyncio.to_thread(CliRunner().invoke, cli, command)


async def test_an_operator_resumes_and_rewinds_under_a_lease(target: StoreTarget) -> None:
    async with leader(target) as manager:
        await manager.wait_until_leading()
        procedure, name = flaky()
        watcher = await manager.submit(procedure)
        with pytest.raises(ProcedureFailed):
            await watcher.wait()
        Flaky.broken.discard(name)

        result = await procstore(target, "rewind", str(procedure.id)[:8], "--to-step", "1", "--yes")
        assert result.exit_code == 0, result.output
        assert "requests/resume/" in result.output
        await eventually(lambda: Flaky.effects[name] == [0, 1, 1, 2, 3])

        result = await procstore(target, "resume", str(procedure.id))
        # Done: its keys are being deleted, or are gone. An older `.rollback` below its
        # steps (from the run before the rewind) must not make it read as failed again.
        assert result.exit_code == ExitCode.REFUSED, result.output
        assert "not in the store" in result.output or "finished successfully" in result.output


async def test_rewind_refuses_an_unfinished_procedure(target: StoreTarget) -> None:
    gate = asyncio.Event()

    class Stuck(Flaky):
        type_name = "tests::Stuck"

        async def execute(self, ctx):  # type: ignore[no-untyped-def]
            await gate.wait()
            return await super().execute(ctx)

    async with leader(target) as manager:
        manager.register(Stuck)
        await manager.wait_until_leading()
        name = uuid.uuid4().hex
        procedure, _ = flaky(Stuck, fail_at=9)
        watcher = await manager.submit(procedure)
        result = await procstore(target, "rewind", str(procedure.id), "--to-step", "0", "--yes")
        assert result.exit_code == ExitCode.REFUSED and "Cancel it first" in result.output, result.output
        gate.set()
        await watcher.wait()
        del name


async def eventually(check, timeout: float = 10.0) -> None:  # type: ignore[no-untyped-def]
    deadline = asyncio.get_running_loop().time() + timeout
    while True:
        try:
            if check():
                return
        except KeyError:
            pass
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError("condition not met in time")
        await asyncio.sleep(0.02)


async def test_an_operator_reads_the_history_of_ended_procedures(target: StoreTarget) -> None:
    async with manager_on(target.url, storage_options=target.storage_options, history=True) as manager:
        done, done_name = flaky(fail_at=9)
        Flaky.broken.discard(done_name)
        await (await manager.submit(done)).wait()
        failed, _ = flaky()
        with pytest.raises(ProcedureFailed):
            await (await manager.submit(failed)).wait()
    listed = await procstore(target, "ls", "--history")
    assert listed.exit_code == 0, listed.output
    assert "2 ended procedures in the history" in listed.output
    rows = [json.loads(line) for line in (await procstore(target, "ls", "--history", "--json")).output.splitlines()]
    assert {(r["id"], r["outcome"]) for r in rows} == {(str(done.id), "done"), (str(failed.id), "failed")}
    shown = await procstore(target, "show", str(failed.id)[:8])
    assert shown.exit_code == 0 and "its history record" in shown.output and "broke at step 2" in shown.output
    missing = await procstore(target, "show", "abcdef12")
    assert missing.exit_code == ExitCode.NOT_FOUND and "neither in the store nor in its history" in missing.output


def test_a_failed_root_at_the_last_run_number_is_refused_a_restart_and_keeps_its_request(tmp_path: Path) -> None:
    """Its messages carry run 4294967295 (u32's largest, which readers take): a rewind wrote
    a copy at run 4294967296, which no reader can decode (the procedure turned unreadable).
    Refused now, exit code 6, nothing written, its cancel request kept; the API refuses too."""
    from procstore import Client, OperationRefused

    pid = "aaaaaaaa-0000-4000-8000-000000000001"
    folder = tmp_path / "procedure" / pid
    folder.mkdir(parents=True)
    message = {"type_name": "t", "data": "{}", "parent_id": None, "step": 0, "run": 2**32 - 1}
    (folder / "0000000000.step").write_text(json.dumps(message))
    (folder / "0000000001.rollback").write_text(json.dumps({**message, "step": 1, "error": "boom"}))
    (folder / "0000000002.commit").write_bytes(b"")
    (tmp_path / "requests").mkdir()
    (tmp_path / "requests" / f"{pid}.json").write_text('{"kind": "cancel", "reason": "r", "requested_at": 1.0}')
    for args in (["rewind", "--to-step", "0", "--yes"], ["resume"]):
        result = CliRunner().invoke(cli, [args[0], str(tmp_path), pid, *args[1:]])
        assert result.exit_code == ExitCode.REFUSED and "at run 4294967295" in result.output, result.output

    async def through_the_api() -> None:
        async with Client(str(tmp_path)) as client:
            with pytest.raises(OperationRefused, match="at run 4294967295"):
                await client.rewind(pid, 0)

    asyncio.run(through_the_api())
    assert sorted(p.name for p in folder.iterdir()) == ["0000000000.step", "0000000001.rollback", "0000000002.commit"]
    assert (tmp_path / "requests" / f"{pid}.json").exists() and not (tmp_path / "requests" / "resume").exists()


def test_a_rewind_whose_last_runs_message_cannot_be_read_is_refused_and_keeps_the_request(tmp_path: Path) -> None:
    """The `.rollback` the last run ended with is torn: the rewind deleted the procedure's
    cancel request, then stopped with an internal error reading it (exit code 1)."""
    pid = "aaaaaaaa-0000-4000-8000-000000000001"
    folder = tmp_path / "procedure" / pid
    folder.mkdir(parents=True)
    (folder / "0000000000.step").write_text(json.dumps({"type_name": "t", "data": "{}", "parent_id": None, "step": 0}))
    (folder / "0000000001.rollback").write_text('{"type_name": "t", "da')
    (folder / "0000000002.commit").write_bytes(b"")
    (tmp_path / "requests").mkdir()
    (tmp_path / "requests" / f"{pid}.json").write_text('{"kind": "cancel", "reason": "r", "requested_at": 1.0}')
    result = CliRunner().invoke(cli, ["rewind", str(tmp_path), pid, "--to-step", "0", "--yes"])
    assert result.exit_code == ExitCode.REFUSED and "0000000001.rollback cannot be read" in result.output
    assert (tmp_path / "requests" / f"{pid}.json").exists()
    assert sorted(p.name for p in folder.iterdir()) == ["0000000000.step", "0000000001.rollback", "0000000002.commit"]
