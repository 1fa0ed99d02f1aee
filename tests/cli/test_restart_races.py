"""Restarts that race each other, and a `procstore rewind` killed at each of its writes.

Each test keeps one manager running on a local directory, as an operator would meet it.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time
import types
import uuid
from pathlib import Path
from typing import Any, Literal

import pytest
from click.testing import CliRunner, Result

import procstore._cli.operations as cli_operations_module
import procstore._client.operations as store_operations
import procstore._runtime.restart as runtime_restart
import procstore.store.requests as requests_module
from procstore import Context, ProcedureError, ProcedureFailed, ProcedureId, ProcedureManager, ProcedureWithId, Status
from procstore._cli.app import cli
from procstore._cli.common import ExitCode, open_existing_store
from procstore.store.procedure_store import ProcedureStore
from procstore.store.requests import OperatorRequest
from procstore.testing import Fault, FaultyStore, SimulatedCrash
from tests.runtime.helpers import eventually
from tests.runtime.test_operations import Flaky, failed_and_kept, manager_on
from tests.runtime.test_resume_nudges import WRITES


def procstore(*args: str) -> Result:
    return CliRunner().invoke(cli, list(args))


async def in_thread(*args: str) -> Result:
    return await asyncio.to_thread(procstore, *args)


def running(path: Path) -> ProcedureManager:
    return manager_on(str(path), keep_failed=True, request_poll_interval=0.05)


async def nothing_left(path: Path, pid: ProcedureId) -> None:
    """Its keys, its request and its nudge all go (called while the manager runs)."""
    await eventually(lambda: not (path / "procedure" / str(pid)).exists())
    await eventually(lambda: not [p for p in (path / "requests").rglob("*.json") if str(pid) in p.name])


def interleaved(
    module: types.ModuleType, monkeypatch: pytest.MonkeyPatch, *other: str
) -> list[subprocess.CompletedProcess[str]]:
    """Run the command `other` once, in full (another operator's process), just before
    `module`'s next restart copy."""
    real = module.apply_restart
    results: list[subprocess.CompletedProcess[str]] = []
    command = [sys.executable, "-c", "from procstore._cli.app import main; main()", *other]

    async def first_the_other(*args: Any, **kwargs: Any) -> Any:
        if not results:
            ran = await asyncio.to_thread(subprocess.run, command, capture_output=True, text=True, timeout=60)
            results.append(ran)
        return await real(*args, **kwargs)

    monkeypatch.setattr(module, "apply_restart", first_the_other)
    return results


async def test_the_second_of_two_rewinds_is_told_another_operator_restarted_it_first(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with running(tmp_path) as manager:
        pid, name = await failed_and_kept(manager)
    Flaky.broken.discard(name)
    other = interleaved(store_operations, monkeypatch, "rewind", str(tmp_path), str(pid), "--to-step", "0", "-y")
    result = await in_thread("rewind", str(tmp_path), str(pid), "--to-step", "1", "-y")
    assert other[0].returncode == 0, other[0].stdout + other[0].stderr
    assert result.exit_code == ExitCode.REFUSED, result.output
    assert "restarted by another operator first" in result.output and "retry" in result.output
    assert "another manager" not in result.output
    async with running(tmp_path):
        await eventually(lambda: Flaky.effects[name] == [0, 1, 0, 1, 2, 3])  # the first rewind, once
        await nothing_left(tmp_path, pid)


async def test_a_rewind_landing_while_the_leader_acts_on_a_resume_nudge_runs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    async with running(tmp_path) as manager:
        pid, name = await failed_and_kept(manager)
        Flaky.broken.discard(name)
        other = interleaved(runtime_restart, monkeypatch, "rewind", str(tmp_path), str(pid), "--to-step", "0", "-y")
        resumed = await in_thread("resume", str(tmp_path), str(pid))
        assert resumed.exit_code == 0, resumed.output
        await eventually(lambda: Flaky.effects[name] == [0, 1, 0, 1, 2, 3])  # the rewind's state, run once
        assert other[0].returncode == 0, other[0].stdout + other[0].stderr
        # The resume's nudge was still there: the rewind says so, and that the leader runs its copy.
        assert "a nudge was already waiting" in other[0].stdout and "(step 5)" in other[0].stdout
        await nothing_left(tmp_path, pid)
    assert "another manager" not in caplog.text and "cannot resume" not in caplog.text


async def test_an_api_rewind_losing_to_a_cli_rewind_raises_why_and_the_cli_rewind_runs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with running(tmp_path) as manager:
        pid, name = await failed_and_kept(manager)
        Flaky.broken.discard(name)
        other = interleaved(runtime_restart, monkeypatch, "rewind", str(tmp_path), str(pid), "--to-step", "0", "-y")
        with pytest.raises(ProcedureError, match="restarted by another operator first") as raised:
            await manager.rewind(pid, 1)
        assert "another manager" not in str(raised.value)
        assert other[0].returncode == 0, other[0].stdout + other[0].stderr
        await eventually(lambda: Flaky.effects[name] == [0, 1, 0, 1, 2, 3])
        await nothing_left(tmp_path, pid)


@pytest.mark.parametrize(
    ("command", "effects"),
    [(("rewind", "--to-step", "1", "-y"), [0, 1, 1, 2, 3]), (("resume",), [0, 1, 2, 3])],
    ids=["rewind", "resume"],
)
async def test_a_restart_from_a_machine_whose_clock_is_behind_runs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, command: tuple[str, ...], effects: list[int]
) -> None:
    behind = types.SimpleNamespace(time=lambda: time.time() - 60.0)
    async with running(tmp_path) as manager:
        pid, name = await failed_and_kept(manager)
        Flaky.broken.discard(name)
        monkeypatch.setattr(requests_module, "time", behind)  # the nudge's requested_at: a minute early
        result = await in_thread(command[0], str(tmp_path), str(pid), *command[1:])
        assert result.exit_code == 0, result.output
        await eventually(lambda: Flaky.effects[name] == effects)
        await nothing_left(tmp_path, pid)


async def test_a_nudge_naming_an_older_latest_key_is_ignored_not_run(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    async with running(tmp_path) as manager:
        pid, name = await failed_and_kept(manager)  # ended at 4.commit
        Flaky.broken.discard(name)
        await manager.store.resumes.put(pid, OperatorRequest.new("resume", "resume", step=2))
        await eventually(lambda: "it was for step 2" in caplog.text)
        await eventually(lambda: not list((tmp_path / "requests").rglob("*.json")))
        assert Flaky.effects[name] == [0, 1] and manager.procedure_state(pid) is not None


def test_a_nudge_written_by_an_older_release_is_still_read() -> None:
    old = b'{"kind":"resume","reason":"resume","requested_at":1700000000.0,"requested_by":"op@host"}'
    pid = ProcedureId.random()
    assert requests_module.decode_request(old, f"requests/resume/{pid}.json", pid) == OperatorRequest(
        kind="resume", reason="resume", requested_at=1700000000.0, requested_by="op@host"
    )


@pytest.mark.parametrize("nth", [0, 1, 2])
@pytest.mark.parametrize("when", ["before", "after"])
async def test_a_rewind_killed_at_any_write_is_finished_without_force_while_a_manager_runs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, nth: int, when: Literal["before", "after"]
) -> None:
    """Its writes: the request's deletion, the copy, the nudge. Rerunning the rewind, then
    (if it says so) `procstore resume`, runs the procedure from step 1 exactly once."""
    real_open = open_existing_store
    crashing = {"armed": True}

    async def faulty_open(*args: Any) -> ProcedureStore:
        opened = await real_open(*args)
        if not crashing.pop("armed", False):
            return opened
        return ProcedureStore(FaultyStore(opened.store, faults=[Fault("crash", kinds=WRITES, nth=nth, when=when)]))

    monkeypatch.setattr(cli_operations_module, "open_existing_store", faulty_open)
    async with running(tmp_path) as manager:
        pid, name = await failed_and_kept(manager)
        Flaky.broken.discard(name)
        rewind = ("rewind", str(tmp_path), str(pid), "--to-step", "1", "-y")
        with pytest.raises(SimulatedCrash):
            await in_thread(*rewind)
        await asyncio.sleep(0.3)  # a few looks of the leader
        if Flaky.effects[name] == [0, 1]:
            again = await in_thread(*rewind)
            if again.exit_code == ExitCode.REFUSED:
                assert f"procstore resume {pid}" in again.output, again.output
                again = await in_thread("resume", str(tmp_path), str(pid))
            assert again.exit_code == 0, again.output
        await eventually(lambda: Flaky.effects[name] == [0, 1, 1, 2, 3])
        await nothing_left(tmp_path, pid)


async def test_a_cancel_written_after_a_rewind_is_honoured_by_the_leader_acting_on_its_nudge(
    tmp_path: Path,
) -> None:
    """Between two looks of the leader an operator rewinds, then cancels: the copy is the
    latest key, so the cancel is accepted, and the leader resuming that copy must not delete it."""
    async with manager_on(str(tmp_path), keep_failed=True, request_poll_interval=0.5) as manager:
        pid, name = await failed_and_kept(manager)
        Flaky.broken.discard(name)
        await asyncio.sleep(0.6)  # just after a look
        rewound = await in_thread("rewind", str(tmp_path), str(pid), "--to-step", "0", "-y")
        cancelled = await in_thread("cancel", str(tmp_path), str(pid), "-y", "--reason", "STOP IT")
        assert rewound.exit_code == 0 and cancelled.exit_code == 0, rewound.output + cancelled.output
        await eventually(lambda: "STOP IT" in (((s := manager.procedure_state(pid)) and s.error) or ""))
        assert Flaky.effects[name] == [0, 1]  # nothing ran after the rewind


async def test_a_procedure_being_restarted_is_never_adopted_as_a_stranger(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Under a lease a leader adopts roots it does not know; a kept root whose metadata it
    forgot, while an operator's restart works on it (a slow store read), is not one."""
    from procstore import Lease

    real = runtime_restart.check_restart  # type: ignore[attr-defined]

    async def slow_check(*args: Any) -> Any:
        await asyncio.sleep(1.0)  # several adopt looks happen meanwhile
        return await real(*args)

    lease = Lease(ttl=0.5, adopt_interval=0.1)
    async with manager_on(str(tmp_path), keep_failed=True, lease=lease, metadata_ttl=0.0) as manager:
        await manager.wait_until_leading()
        pid, name = await failed_and_kept(manager)
        Flaky.broken.discard(name)
        manager.remove_outdated_metadata()  # as a kept root older than the metadata TTL is
        monkeypatch.setattr(runtime_restart, "check_restart", slow_check)
        assert await asyncio.wait_for((await manager.rewind(pid, 0)).wait(), 10) == name
        assert Flaky.effects[name] == [0, 1, 0, 1, 2, 3]  # once, by one runner


class Slow(Flaky):
    """Flaky's four steps, each taking a while, with a rollback: a cancel finds it running."""

    type_name = "tests::Slow"
    rollback_supported = True

    async def execute(self, ctx: Context) -> Status:
        await asyncio.sleep(0.3)
        return await super().execute(ctx)

    async def rollback(self, ctx: Context) -> None:
        self.effects.setdefault(self.data["name"], []).append(-1)


async def test_a_cli_rewind_after_a_cli_cancel_runs_to_the_end_on_a_running_leader(tmp_path: Path) -> None:
    """The leader honoured the cancel and keeps it in memory; the rewind deleted it from the
    store: the rewound run must not fail again with the old reason."""
    async with manager_on(str(tmp_path), keep_failed=True, request_poll_interval=0.1) as manager:
        manager.register(Slow)
        name = uuid.uuid4().hex
        watcher = await manager.submit(ProcedureWithId.new(Slow({"name": name, "at": 0, "fail_at": -1})))
        await eventually(lambda: Flaky.effects.get(name) == [0])
        cancelled = await in_thread("cancel", str(tmp_path), str(watcher.procedure_id), "-y", "--reason", "first")
        assert cancelled.exit_code == 0, cancelled.output
        with pytest.raises(ProcedureFailed, match="first"):
            await asyncio.wait_for(watcher.wait(), 10)
        rewound = await in_thread("rewind", str(tmp_path), str(watcher.procedure_id), "--to-step", "1", "-y")
        assert rewound.exit_code == 0, rewound.output
        await eventually(lambda: Flaky.effects[name][-1] == 3)
        await nothing_left(tmp_path, watcher.procedure_id)
    assert Flaky.effects[name].count(-1) == 1  # rolled back once, for the cancel only
