"""The CLI and the web view over what anyone who can write the bucket can store: keys no
procedure can write (ignored with a warning, never taken for a procedure's end), values that
cannot be read (kept)."""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, TypeVar

import pytest
import yaml  # type: ignore[import-untyped]
from click.testing import CliRunner
from starlette.testclient import TestClient

import procstore._client.inventory
from procstore._cli.app import cli
from procstore._client.inventory import status_of_keys
from procstore._web.app import create_app
from procstore.store import StateStore
from procstore.store.local import LocalDirStore
from procstore.testing import write_many_commits, write_parent_cycle

T = TypeVar("T")

PID = "11111111-1111-4111-8111-111111111111"
ABOVE_MAX_STEP = (
    "4294967296.commit",
    "4294967296.rollback",
    "4294967296.step",
    "10000000000.commit",
    "9999999999999999999999999.step",  # beyond 64 bits: JSON writers refuse such an integer
)


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

    for args in (["tree", str(store)], ["watch", str(store), "--count", "1"]):
        assert runner.invoke(cli, [*args, "-o", "json"]).exit_code == 0, args

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


def _written(tmp_path: Path, write: Callable[[StateStore], Awaitable[T]]) -> T:
    async def go() -> T:
        store = LocalDirStore(tmp_path)
        try:
            return await write(store)
        finally:
            await store.close()

    return asyncio.run(go())


def _nodes(node: dict[str, Any]) -> int:
    return 1 + sum(_nodes(child) for child in node["children"])


def test_tree_shows_a_parent_cycle_once(tmp_path: Path) -> None:
    """Every member of a cycle is a root of nothing; were each shown as a root, each would
    show the whole cycle again (20 levels, and a count of the rest): N times N."""
    length = 200
    cycle = _written(tmp_path, lambda store: write_parent_cycle(store, length))
    result = CliRunner().invoke(cli, ["tree", str(tmp_path), "-o", "json"])
    assert result.exit_code == 0, result.output
    tops = json.loads(result.stdout)["procedures"]
    assert len(tops) == 1 and tops[0]["id"] in {str(pid) for pid in cycle}
    assert _nodes(tops[0]) <= 21  # the cycle, 20 levels deep, the rest counted
    listed = json.loads(CliRunner().invoke(cli, ["ls", str(tmp_path), "-o", "json"]).stdout)["procedures"]
    assert len(listed) == length and all(p["status"] == "parent cycle" for p in listed)


def test_show_and_the_page_are_linear_in_a_procedures_commits(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A folder of N `.commit` keys (anyone who can write the bucket can add them): the
    ending each one shows is found in one pass over the keys, not by the status of every key
    before it (N squared: 10,000 keys took tens of seconds)."""
    count = 400
    pid = _written(tmp_path, lambda store: write_many_commits(store, count))
    looked_at = 0

    def counting(keys: Any) -> Any:
        nonlocal looked_at
        looked_at += len(keys)
        return status_of_keys(keys)

    monkeypatch.setattr(procstore._client.inventory, "status_of_keys", counting)
    shown = CliRunner().invoke(cli, ["show", str(tmp_path), str(pid), "-o", "json"])
    assert shown.exit_code == 0, shown.output
    assert [k.get("ended") for k in json.loads(shown.stdout)["keys"]] == [None, *["done"] * count]
    with TestClient(create_app(str(tmp_path))) as client:
        assert client.get(f"/p/{pid}").status_code == 200
    assert looked_at < 10 * count  # by every key before each: count**2 / 2


@pytest.mark.parametrize("ended", ["9999-12-31T23:59:59-23:59", "0001-01-01T00:00:00+23:59"])
def test_an_end_time_at_the_calendars_edge_is_listed(tmp_path: Path, ended: str) -> None:
    """It parses, but in UTC it is outside the years Python's calendar holds."""
    good, edge = "44444444-4444-4444-8444-444444444444", "55555555-5555-4555-8555-555555555555"
    (tmp_path / "history").mkdir()
    (tmp_path / "procedure").mkdir()
    for pid, at in ((good, "2026-01-01T00:00:00+00:00"), (edge, ended)):
        record = {"id": pid, "type_name": "app::T", "parent_id": None, "outcome": "done", "ended_at": at}
        (tmp_path / "history" / f"{pid}.{1:010d}.json").write_text(json.dumps(record))
    for args in (["--time-format", "iso"], ["-o", "json"]):
        result = CliRunner().invoke(cli, ["ls", str(tmp_path), "--history", *args])
        assert result.exit_code == 0, result.output
        assert all(pid[:8] in result.output for pid in (good, edge))


def test_a_log_line_naming_a_stored_key_is_inert(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """A history key whose name carries ESC sequences is logged as unreadable: the line
    must not set the title of the terminal the log is read on."""
    evil = "\x1b]0;pwned window title\x07\x1b[2J\u202e"
    (tmp_path / "history").mkdir()
    (tmp_path / "procedure").mkdir()
    (tmp_path / "history" / f"1767225600000-{evil}.json").write_bytes(b"{not json")
    with caplog.at_level(logging.WARNING, logger="procstore"):
        assert CliRunner().invoke(cli, ["ls", str(tmp_path), "--history"]).exit_code == 0
        with TestClient(create_app(str(tmp_path))) as client:
            assert client.get("/history").status_code == 200
    lines = [r.getMessage() for r in caplog.records if "1767225600000" in r.getMessage()]
    assert len(lines) >= 2 and all("\\x1b]0;pwned" in line for line in lines)
    assert not any(char in line for line in lines for char in "\x1b\x07\u202e")


CONTROLS = "app::\x9b2J\x9b31mred \x7f \u202eevil.exe \x85"


def test_json_and_yaml_escape_what_a_terminal_obeys_and_read_back_the_same(tmp_path: Path) -> None:
    """JSON escapes C0 itself; C1 (`\\x9b` is CSI), DEL and the bidirectional overrides
    are escaped too (`\\u009b`), so `-o json` at a prompt is inert, and reads back whole."""
    (tmp_path / "procedure" / PID).mkdir(parents=True)
    value = {"type_name": CONTROLS, "data": "{}", "parent_id": None, "step": 0}
    (tmp_path / "procedure" / PID / "0000000000.step").write_text(json.dumps(value))
    runner = CliRunner()
    read_back: dict[tuple[str, ...], Callable[[Any], Any]] = {
        ("ls", "-o", "json"): lambda doc: doc["procedures"][0]["type"],
        ("ls", "--json"): lambda doc: doc["type"],
        ("ls", "-o", "jsonl"): lambda doc: doc["type"],
        ("show", PID, "-o", "json"): lambda doc: doc["keys"][0]["message"]["type_name"],
    }
    for args, value_of in read_back.items():
        out = runner.invoke(cli, [args[0], str(tmp_path), *args[1:]]).stdout
        assert not any(char in out for char in "\x9b\x7f\u202e\x85"), args
        assert value_of(json.loads(out)) == CONTROLS, args
    out = runner.invoke(cli, ["ls", str(tmp_path), "-o", "yaml"]).stdout
    assert not any(char in out for char in "\x9b\x7f\u202e\x85")
    assert yaml.safe_load(out)["procedures"][0]["type"] == CONTROLS


def test_emoji_codes_in_a_stored_value_are_shown_as_written(tmp_path: Path) -> None:
    name = "app::T :white_heavy_check_mark: committed :lock:"
    (tmp_path / "procedure" / PID).mkdir(parents=True)
    value = {"type_name": name, "data": "{}", "parent_id": None, "step": 0}
    (tmp_path / "procedure" / PID / "0000000000.step").write_text(json.dumps(value))
    for args in (["ls", "--wide"], ["tree"], ["show", PID]):
        out = CliRunner(env={"COLUMNS": "200"}).invoke(cli, [args[0], str(tmp_path), *args[1:]]).stdout
        assert ":white_heavy_check_mark:" in out and "\u2705" not in out, args


def _child_message(step: int, parent: str | None) -> bytes:
    return json.dumps({"type_name": "app::T", "data": "{}", "parent_id": parent, "step": step}).encode()


def test_delete_refuses_a_child_whose_parent_cannot_be_read_and_deletes_a_parent_cycle(tmp_path: Path) -> None:
    """A finished child of a parent whose latest step cannot be read: the parent has not
    ended (restored, it runs on and reads its child's end), so `delete` refuses the child as
    for an unfinished parent, and as `gc` keeps it. It deleted it. A parent cycle, which
    nothing runs, is deleted whole from any member without `--force`."""
    parent, child = "aaaaaaaa-0000-4000-8000-000000000001", "aaaaaaaa-0000-4000-8000-000000000002"
    for pid, name, value in [
        (parent, "0000000000.step", _child_message(0, None)),
        (parent, "0000000001.step", b'{"type_name": "app::T", "da'),  # a torn write
        (child, "0000000000.step", _child_message(0, parent)),
        (child, "0000000001.commit", b""),
    ]:
        (tmp_path / "procedure" / pid).mkdir(parents=True, exist_ok=True)
        (tmp_path / "procedure" / pid / name).write_bytes(value)
    runner = CliRunner()
    assert "would delete 0" in runner.invoke(cli, ["gc", str(tmp_path), "--dry-run"]).output
    refused = runner.invoke(cli, ["delete", str(tmp_path), child, "--yes"])
    assert refused.exit_code == 6 and f"subprocedure of {parent}, which is unreadable" in refused.stderr
    assert (tmp_path / "procedure" / child / "0000000001.commit").exists()
    assert runner.invoke(cli, ["delete", str(tmp_path), parent, "--yes"]).exit_code == 0  # the hint's way
    assert not (tmp_path / "procedure" / child).exists()

    cycle = _written(tmp_path, lambda s: write_parent_cycle(s, 3))
    deleted = runner.invoke(cli, ["delete", str(tmp_path), str(cycle[1]), "--yes"])
    assert deleted.exit_code == 0, deleted.output
    assert not any((tmp_path / "procedure" / str(pid)).exists() for pid in cycle)
