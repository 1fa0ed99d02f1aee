"""The CLI and the web view over what anyone who can write the bucket can store: keys no
procedure can write (ignored with a warning, never taken for a procedure's end), values that
cannot be read (kept)."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest
from click.testing import CliRunner
from starlette.testclient import TestClient

from procstore._cli.app import cli
from procstore._web.app import create_app

PID = "11111111-1111-4111-8111-111111111111"
ABOVE_MAX_STEP = ("4294967296.commit", "4294967296.rollback", "4294967296.step", "10000000000.commit")


def _message(step: int) -> bytes:
    return json.dumps({"type_name": "app::T", "data": "{}", "parent_id": None, "step": step}).encode()


@pytest.fixture
def store(tmp_path: Path) -> Path:
    """An unfinished procedure at step 1, and keys above the largest step beside its own."""
    folder = tmp_path / "procedure" / PID
    folder.mkdir(parents=True)
    for step in (0, 1):
        (folder / f"{step:010d}.step").write_bytes(_message(step))
    for name in ABOVE_MAX_STEP:
        (folder / name).write_bytes(b"" if name.endswith(".commit") else _message(2**32))
    return tmp_path


def test_keys_above_the_largest_step_are_ignored_by_ls_show_gc(store: Path, caplog: pytest.LogCaptureFixture) -> None:
    runner = CliRunner()
    listed = json.loads(runner.invoke(cli, ["ls", str(store), "-o", "json"]).stdout)
    assert [(p["id"], p["status"], p["step"]) for p in listed["procedures"]] == [(PID, "unfinished", 1)]
    assert sum("not a procedure key, ignored" in w for w in listed["warnings"]) == len(ABOVE_MAX_STEP)

    with caplog.at_level(logging.WARNING, logger="procstore"):
        shown = json.loads(runner.invoke(cli, ["show", str(store), PID, "-o", "json"]).stdout)
    assert [k["step"] for k in shown["keys"]] == [0, 1]
    assert sum("not a procedure key, ignored" in r.getMessage() for r in caplog.records) == len(ABOVE_MAX_STEP)

    collected = runner.invoke(cli, ["gc", str(store)])
    assert collected.exit_code == 0, collected.output
    kept = sorted(p.name for p in (store / "procedure" / PID).iterdir())
    assert kept == sorted(["0000000000.step", "0000000001.step", *ABOVE_MAX_STEP])


def test_the_web_view_shows_keys_above_the_largest_step_as_ignored(store: Path) -> None:
    with TestClient(create_app(str(store))) as client:
        page = client.get(f"/p/{PID}")
        assert page.status_code == 200
        assert "unfinished" in page.text and "committed" not in page.text and "4294967296" not in page.text
        assert "4294967296.commit" in client.get("/").text  # listed with the keys that are not ours


def test_gc_keeps_a_committed_procedure_whose_value_cannot_be_read(tmp_path: Path) -> None:
    """Its parent link is unknown: it may be the child an unfinished parent will read when it
    resumes, so it is kept, as recovery keeps it."""
    parent, child = "22222222-2222-4222-8222-222222222222", "33333333-3333-4333-8333-333333333333"
    (tmp_path / "procedure" / parent).mkdir(parents=True)
    (tmp_path / "procedure" / parent / "0000000000.step").write_bytes(_message(0))
    folder = tmp_path / "procedure" / child
    folder.mkdir()
    torn = _message(0).replace(b"null", f'"{parent}"'.encode())[:-1]
    (folder / "0000000000.step").write_bytes(torn)
    (folder / "0000000001.commit").write_bytes(b"")
    collected = CliRunner().invoke(cli, ["gc", str(tmp_path)])
    assert collected.exit_code == 0, collected.output
    assert "deleted 0 finished procedures" in collected.output
    assert sorted(p.name for p in folder.iterdir()) == ["0000000000.step", "0000000001.commit"]
