"""A procedure folder that is a symbolic link to a folder, on a local directory (issue 32,
item 13): reported as a load problem, by recovery and by the commands, never silently
skipped, and never walked through, so that nothing outside the store is deleted."""

from __future__ import annotations

import asyncio
from pathlib import Path

from click.testing import CliRunner

from procstore import ProcedureId, ProcedureWithId
from procstore._cli.app import cli
from tests.procedures import Parked
from tests.support import manager_for


async def two_parked(store: Path) -> tuple[ProcedureId, ProcedureId]:
    ids = (ProcedureId.random(), ProcedureId.random())
    async with manager_for(store) as m:
        for pid in ids:
            await m.submit(ProcedureWithId(pid, Parked({})))
        for pid in ids:
            while len(await m.store.procedure_keys(pid)) < 2:
                await asyncio.sleep(0.005)
    return ids


def link_out(store: Path, elsewhere: Path, pid: ProcedureId) -> Path:
    """Move the procedure's folder out of the store and link it back in; the files outside."""
    folder = store / "procedure" / str(pid)
    moved = elsewhere / str(pid)
    folder.rename(moved)
    folder.symlink_to(moved, target_is_directory=True)
    return moved


async def test_recovery_reports_a_linked_procedure_folder_keeps_it_and_resumes_the_others(tmp_path: Path) -> None:
    store, elsewhere = tmp_path / "store", tmp_path / "elsewhere"
    elsewhere.mkdir()
    linked, plain = await two_parked(store)
    outside = link_out(store, elsewhere, linked)
    files = sorted(p.name for p in outside.iterdir())
    async with manager_for(store) as m:
        assert [problem.procedure_id for problem in m.recovery_problems] == [linked]
        assert "symbolic link" in m.recovery_problems[0].reason
        assert m.procedure_watcher(plain) is not None  # the other one runs again
        assert m.procedure_watcher(linked) is None
    assert sorted(p.name for p in outside.iterdir()) == files


def test_the_commands_name_a_linked_procedure_folder_and_delete_nothing_through_it(tmp_path: Path) -> None:
    store, elsewhere = tmp_path / "store", tmp_path / "elsewhere"
    elsewhere.mkdir()
    linked, _ = asyncio.run(two_parked(store))
    outside = link_out(store, elsewhere, linked)
    files = sorted(p.name for p in outside.iterdir())
    runner = CliRunner()
    listed = runner.invoke(cli, ["ls", str(store)])
    assert f"procedure/{linked}/" in listed.output and "symbolic link" in listed.output, listed.output
    runner.invoke(cli, ["gc", str(store)])
    deleted = runner.invoke(cli, ["delete", str(store), str(linked), "--yes"])
    assert deleted.exit_code != 0 and str(linked) in deleted.output, deleted.output
    assert sorted(p.name for p in outside.iterdir()) == files
    assert (store / "procedure" / str(linked)).is_symlink()
    # Only that id (in any form, or 4 characters of it or more) is refused for its folder.
    assert "cannot be listed" in runner.invoke(cli, ["show", str(store), str(linked).upper()]).output
    assert "cannot be listed" not in runner.invoke(cli, ["show", str(store), str(linked)[:2]]).output


def test_delete_refuses_a_child_whose_parents_folder_is_a_link(tmp_path: Path) -> None:
    """A finished child whose parent's folder is a link (not listed: whether the parent has
    ended is unknown) is kept by `gc`, and `delete` refuses it as for an unfinished parent."""
    store, elsewhere = tmp_path / "store", tmp_path / "elsewhere"
    parent, child = "aaaaaaaa-0000-4000-8000-000000000001", "aaaaaaaa-0000-4000-8000-000000000002"
    message = '{{"type_name": "app::T", "data": "{{}}", "parent_id": {}, "step": 0}}'
    (elsewhere / parent).mkdir(parents=True)
    (elsewhere / parent / "0000000000.step").write_text(message.format("null"))
    (store / "procedure" / child).mkdir(parents=True)
    (store / "procedure" / child / "0000000000.step").write_text(message.format(f'"{parent}"'))
    (store / "procedure" / child / "0000000001.commit").write_bytes(b"")
    (store / "procedure" / parent).symlink_to(elsewhere / parent, target_is_directory=True)
    runner = CliRunner()
    assert "would delete 0" in runner.invoke(cli, ["gc", str(store), "--dry-run"]).output
    refused = runner.invoke(cli, ["delete", str(store), child, "--yes"])
    assert refused.exit_code == 6 and "whose folder cannot be listed" in refused.stderr, refused.output
    assert (store / "procedure" / child / "0000000001.commit").exists()
