"""Stores read both ways: what procstore reads of what GreptimeDB writes, and what
GreptimeDB's loader (ported in `tests/greptimedb_loader.py`) reads of what procstore writes.
Each of procstore's extensions gets what docs/stores.md ("What GreptimeDB sees") says."""

from __future__ import annotations

import asyncio
import json
import shutil
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from procstore import ProcedureFailed, ProcedureId, ProcedureManager, ProcedureWithId
from procstore._cli.app import cli
from procstore.store import ProcedureMessage
from procstore.store.local import LocalDirStore
from procstore.store.procedure_store import ProcedureStore
from procstore.store.requests import OperatorRequest
from tests import greptimedb_loader as greptimedb
from tests.procedures import BLOCKERS, WORLDS, Steps, World
from tests.support import manager_for

FROZEN = Path(__file__).parent.parent / "data" / "store-by-greptimedb"
"""Written as GreptimeDB writes (`greptimedb_loader.GreptimeMessage.encode`), messages with
its `context`: an unfinished root (r1), a rolling-back root (r2), a finished root (r3), a
live parent (p, a type no test registers) with an unfinished child (c1) and a finished one
(c2), and a root whose latest value is torn (t)."""
R1, R2, R3, P, C1, C2, T = (f"e0000000-0000-4000-8000-00000000000{i}" for i in range(1, 8))
CONTEXT = {"who": "alice@ops", "why": "ALTER TABLE t ADD COLUMN c"}


def context_of(message: ProcedureMessage) -> object:
    """The `context` a procstore message kept, as GreptimeDB wrote it."""
    return json.loads(b"{" + message.extra + b"}").get("context")


def manager(root: Path, **options: Any) -> ProcedureManager:
    return manager_for(LocalDirStore(root), **options)


async def eventually(condition: object, seconds: float = 10.0) -> None:
    for _ in range(int(seconds / 0.01)):
        if condition():  # type: ignore[operator]
            return
        await asyncio.sleep(0.01)
    raise AssertionError("condition never held")


def greptimedb_reads(root: Path, key: str) -> greptimedb.GreptimeMessage:
    message = greptimedb.decode((root / key).read_bytes())
    assert message is not None, key
    return message


async def test_procstore_reads_a_greptimedb_store_as_greptimedb_does(tmp_path: Path) -> None:
    shutil.copytree(FROZEN, tmp_path, dirs_exist_ok=True)
    theirs = greptimedb.read_directory(tmp_path)
    ours = await ProcedureStore(LocalDirStore(tmp_path)).load_messages()
    for mine, other in ((ours.messages, theirs.messages), (ours.rollback_messages, theirs.rollback_messages)):
        assert {str(pid) for pid in mine} == set(other)
        for pid, message in mine.items():
            expected = other[str(pid)]
            parent = None if message.parent_id is None else str(message.parent_id)
            assert (message.type_name, message.data, parent, message.step, message.error) == (
                expected.type_name,
                expected.data,
                expected.parent_id,
                expected.step,
                expected.error,
            )
            assert context_of(message) == expected.context
    assert {str(pid) for pid in ours.finished_ids} == set(theirs.finished_ids) == {R3, C2}
    assert {str(p.procedure_id) for p in ours.problems} == {T}  # GreptimeDB logs and skips it
    assert theirs.messages[R1].context == CONTEXT

    # A start: GreptimeDB deletes the finished child of the live parent; procstore keeps it
    # for that parent (whose type no manager here knows: it is kept, and reported).
    assert C2 in greptimedb.start(theirs).deleted
    WORLDS["frozen-gt"] = World("frozen-gt")
    async with manager(tmp_path) as started:
        await eventually(lambda: not (tmp_path / "procedure" / R1).exists())
        assert P in {str(p.procedure_id) for p in started.recovery_problems}
        assert (tmp_path / "procedure" / C2 / "0000000001.commit").exists()
        assert not (tmp_path / "procedure" / R3).exists()


async def test_a_resumed_greptimedb_procedure_keeps_its_context_on_every_step(tmp_path: Path) -> None:
    """Step rewrites: each `.step` procstore writes for it carries GreptimeDB's `context`."""
    world = World.new()
    pid = ProcedureId.random()
    BLOCKERS["gt-context"] = hold = asyncio.Event()
    data = {"world": world.name, "name": "r", "steps": 3, "block": "gt-context", "block_at": 2}
    submitted = greptimedb.GreptimeMessage(Steps.type_name, json.dumps(data), None, 0, None, CONTEXT)
    greptimedb.write_directory(tmp_path, {f"procedure/{pid}/0000000000.step": submitted.encode()})
    async with manager(tmp_path) as started:
        await eventually(lambda: (tmp_path / f"procedure/{pid}/0000000002.step").exists())
        for step in (1, 2):
            assert greptimedb_reads(tmp_path, f"procedure/{pid}/{step:010d}.step").context == CONTEXT
        hold.set()
        watcher = started.procedure_watcher(pid)
        assert watcher is not None
        await watcher.wait()


async def test_rollback_commit_and_restart_copies_keep_the_context(tmp_path: Path) -> None:
    """A GreptimeDB procedure that fails under procstore: its `.rollback`, a resume's copy
    and rewind copies (the manager's and the command line's) keep `context`; the `.commit`
    is empty, as GreptimeDB writes it. GreptimeDB then sees a finished procedure: it would
    delete the root `keep_failed` keeps. The restarted run's `run` field it ignores."""
    world = World.new()
    pid = ProcedureId.random()
    data = {"world": world.name, "name": "u", "steps": 3, "fail_at": 1}
    submitted = greptimedb.GreptimeMessage("test::Undoable", json.dumps(data), None, 0, None, CONTEXT)
    folder = f"procedure/{pid}"
    greptimedb.write_directory(tmp_path, {f"{folder}/0000000000.step": submitted.encode()})
    async with manager(tmp_path, keep_failed=True) as started:
        await eventually(lambda: started.procedure_watcher(pid) is not None)
        with pytest.raises(ProcedureFailed):
            await started.procedure_watcher(pid).wait()  # type: ignore[union-attr]
        assert greptimedb_reads(tmp_path, f"{folder}/0000000001.step").context == CONTEXT
        assert greptimedb_reads(tmp_path, f"{folder}/0000000002.rollback").context == CONTEXT
        assert (tmp_path / f"{folder}/0000000003.commit").read_bytes() == b""
        assert pid in map(ProcedureId.parse, greptimedb.start(greptimedb.read_directory(tmp_path)).deleted)
        with pytest.raises(ProcedureFailed):
            await (await started.rewind(pid, 1)).wait()
        copy = greptimedb_reads(tmp_path, f"{folder}/0000000004.step")
        assert copy.context == CONTEXT
        assert json.loads((tmp_path / f"{folder}/0000000004.step").read_bytes())["run"] == 2
        assert list((tmp_path / "history").iterdir())  # end records: GreptimeDB reads `procedure/` alone
        assert greptimedb_reads(tmp_path, f"{folder}/0000000005.rollback").context == CONTEXT
    command = ["rewind", str(tmp_path), str(pid), "--to-step", "0", "--yes"]
    result = await asyncio.to_thread(CliRunner().invoke, cli, command)
    assert result.exit_code == 0, result.output
    assert greptimedb_reads(tmp_path, f"{folder}/0000000007.step").context == CONTEXT
    # The copy is the latest key: GreptimeDB resumes it too (the nudge it never reads).
    assert str(pid) in greptimedb.start(greptimedb.read_directory(tmp_path)).resumed


async def test_greptimedb_deletes_a_kept_root_with_a_pending_resume_and_runs_one_with_a_pending_cancel(
    tmp_path: Path,
) -> None:
    """procstore's operator requests live beside `procedure/`, which is all GreptimeDB reads."""
    store = ProcedureStore(LocalDirStore(tmp_path))
    failed, cancelled = ProcedureId.random(), ProcedureId.random()
    await store.store_procedure(failed, 0, "T", "{}", None)
    await store.rollback_procedure(failed, ProcedureMessage("T", "{}", None, 1, "boom"))
    await store.commit_procedure(failed, 2)
    assert await store.resumes.put(failed, OperatorRequest.new("resume", "operator", 2))
    await store.store_procedure(cancelled, 0, "T", "{}", None)
    assert await store.requests.put(cancelled, OperatorRequest.new("cancel", "no longer wanted"))
    seen = greptimedb.start(greptimedb.read_directory(tmp_path))
    assert str(failed) in seen.deleted
    assert str(cancelled) in seen.resumed


async def test_a_child_of_a_greptimedb_root_is_written_in_greptimedb_s_format(tmp_path: Path) -> None:
    """A procedure procstore submits (no `context` of its own) is stored exactly as
    GreptimeDB would store it: both read it alike."""
    async with manager(tmp_path, keep_failed=True) as started:
        world = World.new()
        submitted = ProcedureWithId.new(Steps({"world": world.name, "name": "s", "steps": 2, "block": "gt-plain"}))
        BLOCKERS["gt-plain"] = hold = asyncio.Event()
        watcher = await started.submit(submitted)
        key = f"procedure/{submitted.id}/0000000000.step"
        raw = (tmp_path / key).read_bytes()
        message = greptimedb_reads(tmp_path, key)
        assert greptimedb.GreptimeMessage(message.type_name, message.data, None, 0).encode() == raw
        hold.set()
        await watcher.wait()
