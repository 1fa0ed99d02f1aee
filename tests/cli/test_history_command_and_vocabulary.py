"""`procstore history`, the reason of `resume` and `rewind`, `show` nesting `data`, and
the CLI's bugs of issue 36's list: a short id prefix, and `watch` ended by Ctrl-C."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

from procstore import Client, ProcedureId
from procstore._cli.app import cli
from procstore._cli.common import ExitCode
from procstore.store.local import LocalDirStore
from procstore.store.procedure_store import ProcedureStore
from tests.procedures import World
from tests.runtime.helpers import steps
from tests.runtime.test_operations import Flaky, failed_and_kept, manager_on


def run(*args: str) -> Result:
    return CliRunner().invoke(cli, list(args))


async def test_history_lists_each_run_with_how_it_started_and_who_ended_it(tmp_path: Path) -> None:
    async with manager_on(str(tmp_path), keep_failed=True, request_poll_interval=0.05) as manager:
        pid, name = await failed_and_kept(manager)
        Flaky.broken.discard(name)
        resumed = await asyncio.to_thread(run, "resume", str(tmp_path), str(pid), "--reason", "dependency fixed")
        assert resumed.exit_code == 0, resumed.output
        async with Client(str(tmp_path), poll_interval=0.05) as client:
            assert await client.wait(pid, timeout=20) == name
    shown = await asyncio.to_thread(run, "history", str(tmp_path), "--id", str(pid)[:8], "-O", "json")
    assert shown.exit_code == 0, shown.output
    first, second = json.loads(shown.output)["history"]
    assert (first["outcome"], first["run"], first["started"]["kind"]) == ("failed", 1, "submit")
    assert (second["outcome"], second["run"], second["output"]) == ("done", 2, name)
    assert (second["started"]["kind"], second["started"]["reason"]) == ("resume", "dependency fixed")
    table = await asyncio.to_thread(run, "history", str(tmp_path), "--outcome", "done")
    assert table.exit_code == 0 and str(pid)[:8] in table.output and "failed" not in table.output, table.output
    ended = await asyncio.to_thread(run, "show", str(tmp_path), str(pid))
    assert ended.exit_code == 0 and "resume by" in ended.output and "dependency fixed" in ended.output, ended.output


async def test_rewind_keeps_its_reason_in_the_new_runs_record(tmp_path: Path) -> None:
    async with manager_on(str(tmp_path), keep_failed=True, request_poll_interval=0.05) as manager:
        pid, name = await failed_and_kept(manager)
        Flaky.broken.discard(name)
        args = ("rewind", str(tmp_path), str(pid), "--to-step", "1", "--reason", "bad input at step 1", "-y")
        rewound = await asyncio.to_thread(run, *args)
        assert rewound.exit_code == 0, rewound.output
        async with Client(str(tmp_path), poll_interval=0.05) as client:
            await client.wait(pid, timeout=20)
            newest = (await client.history(procedure_id=pid, limit=1))[0]
    assert newest.started is not None
    assert (newest.started.kind, newest.started.to_step, newest.started.reason) == ("rewind", 1, "bad input at step 1")


async def test_show_nests_data_as_json(tmp_path: Path) -> None:
    async with manager_on(str(tmp_path), keep_failed=True) as manager:
        pid, _ = await failed_and_kept(manager)
    shown = await asyncio.to_thread(run, "show", str(tmp_path), str(pid), "-O", "json")
    assert shown.exit_code == 0, shown.output
    data = json.loads(shown.output)["keys"][0]["message"]["data"]
    assert isinstance(data, dict) and data["at"] == 0, data


async def test_a_prefix_under_four_characters_that_matches_says_it_is_too_short(tmp_path: Path) -> None:
    world = World.new()
    async with manager_on(str(tmp_path), keep_failed=True) as manager:
        pid, _ = await failed_and_kept(manager)
        done = steps(world, 1)
        await (await manager.submit(done)).wait()
    for text in (str(pid)[:3], str(done.id)[:2]):
        shown = await asyncio.to_thread(run, "show", str(tmp_path), text)
        assert shown.exit_code == ExitCode.NOT_FOUND, shown.output
        assert "too short" in shown.output and "no procedure id starts with" not in shown.output, shown.output


def test_watch_ended_by_ctrl_c_exits_0_without_an_error(tmp_path: Path) -> None:
    (tmp_path / "procedure").mkdir()
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    watching = subprocess.Popen(
        [sys.executable, "-m", "procstore", "watch", str(tmp_path), "--interval", "0.2"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=env,
    )
    assert watching.stdout is not None
    assert b"0 procedures" in watching.stdout.readline()  # its first listing: it watches now
    watching.send_signal(signal.SIGINT)
    out, err = watching.communicate(timeout=30)
    assert watching.returncode == 0, (watching.returncode, out, err)
    assert b"declined" not in err and b"Error" not in err, err


@pytest.mark.parametrize("kind", ["cancel", "fail"])
async def test_cancel_and_fail_of_an_ended_procedure_say_it_has_ended(tmp_path: Path, kind: str) -> None:
    async with manager_on(str(tmp_path), keep_failed=True) as manager:
        pid, _ = await failed_and_kept(manager)
    refused = await asyncio.to_thread(run, kind, str(tmp_path), str(pid), "-y")
    assert refused.exit_code == ExitCode.REFUSED and "has ended (failed)" in refused.output, refused.output


async def test_show_says_a_pending_cancel_and_the_live_status(tmp_path: Path) -> None:
    store = ProcedureStore(LocalDirStore(tmp_path))
    pid = ProcedureId.random()
    await store.create_procedure(pid, "tests::Flaky", '{"name": "n", "at": 0, "fail_at": 9}', None)
    cancelled = await asyncio.to_thread(run, "cancel", str(tmp_path), str(pid), "--reason", "wrong region", "-y")
    assert cancelled.exit_code == 0, cancelled.output
    shown = await asyncio.to_thread(run, "show", str(tmp_path), str(pid), "-O", "json")
    status = json.loads(shown.output)["status"]
    assert (status["status"], status["run"], status["step"]) == ("unfinished", 1, 0)
    assert (status["pending"]["kind"], status["pending"]["reason"]) == ("cancel", "wrong region")
    assert status["started_at"] is not None
    table = await asyncio.to_thread(run, "show", str(tmp_path), str(pid))
    assert "pending: cancel by" in table.output and "wrong region" in table.output, table.output


async def test_ls_marks_a_pending_cancel(tmp_path: Path) -> None:
    store = ProcedureStore(LocalDirStore(tmp_path))
    pid = ProcedureId.random()
    await store.create_procedure(pid, "tests::Flaky", '{"name": "n", "at": 0, "fail_at": 9}', None)
    assert (await asyncio.to_thread(run, "cancel", str(tmp_path), str(pid), "-y")).exit_code == 0
    listed = await asyncio.to_thread(run, "ls", str(tmp_path), "--json")
    assert json.loads(listed.output)["pending"] == "cancel", listed.output
    assert "unfinished (cancel pending)" in (await asyncio.to_thread(run, "ls", str(tmp_path))).output
