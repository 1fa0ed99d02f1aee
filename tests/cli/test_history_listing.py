"""`procstore ls --history` and `watch` as data and at 80 columns: one document per -o json."""

from __future__ import annotations

import asyncio
import json
import re
from pathlib import Path

import msgspec
import pytest
from click.testing import CliRunner, Result

from procstore._cli.app import cli
from procstore.ids import ProcedureId
from procstore.store.history import HistoryRecord, HistoryStore, Outcome
from procstore.store.local import LocalDirStore


def run(*args: str, columns: int = 80) -> Result:
    return CliRunner(env={"COLUMNS": str(columns)}).invoke(cli, list(args))


_ENDS: list[tuple[str, Outcome]] = [("CreateTable", "done"), ("DropTable", "failed"), ("Alter", "done")]


@pytest.fixture
def history(tmp_path: Path) -> tuple[str, list[HistoryRecord]]:
    """Three records, oldest first, in a store that holds nothing else."""
    records = [
        HistoryRecord(
            id=str(ProcedureId.random()),
            type_name=f"metasrv-procedure::{name}",
            parent_id=None,
            outcome=outcome,
            error=None if outcome == "done" else f"region {n} broke: " + "x" * 60,
            ended_at=f"2026-01-0{n + 1}T00:00:00.000+00:00",
            steps=n,
        )
        for n, (name, outcome) in enumerate(_ENDS)
    ]
    asyncio.run(HistoryStore(LocalDirStore(tmp_path)).put_many(records))
    return str(tmp_path), records


@pytest.mark.parametrize("fmt", ["json", "yaml"])
def test_ls_history_as_json_or_yaml_is_one_document(history: tuple[str, list[HistoryRecord]], fmt: str) -> None:
    url, records = history
    result = run("ls", url, "--history", "-o", fmt)
    assert result.exit_code == 0, result.output
    document = json.loads(result.stdout) if fmt == "json" else msgspec.yaml.decode(result.stdout)
    assert [r["id"] for r in document["history"]] == [r.id for r in records]
    lines = run("ls", url, "--history", "-o", "jsonl").stdout.splitlines()
    assert [json.loads(line)["id"] for line in lines] == [r.id for r in records]


@pytest.mark.parametrize("fmt", ["json", "yaml"])
def test_watch_as_json_or_yaml_is_one_document(tmp_path: Path, fmt: str) -> None:
    store = LocalDirStore(tmp_path)
    pid = ProcedureId.random()
    message = {"type_name": "x::Y", "data": "{}", "parent_id": None, "step": 0}
    asyncio.run(store.put(f"procedure/{pid}/0000000000.step", json.dumps(message).encode()))
    result = run("watch", str(tmp_path), "--count", "2", "--interval", "0.2", "-o", fmt)
    assert result.exit_code == 0, result.output
    document = json.loads(result.stdout) if fmt == "json" else msgspec.yaml.decode(result.stdout)
    assert [(c["change"], c["id"]) for c in document["changes"]] == [("new", str(pid))]


def test_ls_wide_shows_every_column_whole_at_80_columns(tmp_path: Path) -> None:
    store = LocalDirStore(tmp_path)
    parent, child = ProcedureId.random(), ProcedureId.random()
    for pid, up in ((parent, None), (child, str(parent))):
        message = {"type_name": "metasrv-procedure::CreateTable", "data": "{}", "parent_id": up, "step": 0}
        asyncio.run(store.put(f"procedure/{pid}/0000000000.step", json.dumps(message).encode()))
    result = run("ls", str(tmp_path), "--wide", "--time-format", "iso")
    assert result.exit_code == 0, result.output
    header, *rows = result.stdout.splitlines()
    assert header.split() == ["id", "type", "status", "step", "parent", "ch", "last", "step"]
    assert any(line.split()[:5] == [str(child), "metasrv-procedure::CreateTable", "unfinished", "0", str(parent)]
               for line in rows), result.stdout  # fmt: skip


def test_ls_history_fits_80_columns_with_short_ids(history: tuple[str, list[HistoryRecord]]) -> None:
    url, records = history
    result = run("ls", url, "--history")
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    assert all(len(line) <= 80 for line in lines), result.stdout
    assert [line.split()[0] for line in lines[2:5]] == [r.id[:8] for r in records]  # one line each, oldest first


def test_ls_history_honours_the_listing_options(history: tuple[str, list[HistoryRecord]]) -> None:
    url, records = history
    args = ["--limit", "1", "--no-headers", "--sort", "id", "--reverse", "--time-format", "iso"]
    result = run(
        "ls", url, "--history", *args, "--type", "metasrv-procedure::CreateTable", "--older-than", "1d", columns=200
    )
    assert result.exit_code == 0, result.output
    assert [line.split()[:2] for line in result.stdout.splitlines()] == [[records[0].id[:8], records[0].type_name]]
    assert "2026-01-01T00:00:00Z" in result.stdout
    newest_id = max(r.id for r in records)
    listed = json.loads(run("ls", url, "--history", "--sort", "id", "--reverse", "--limit", "1", "-o", "json").stdout)
    assert [r["id"] for r in listed["history"]] == [newest_id]
    assert run("ls", url, "--history", "--newer-than", "1d", "-o", "json").stdout.count('"id"') == 0
    refused = run("ls", url, "--history", "--status", "unfinished")
    assert refused.exit_code == 2 and "--status" in refused.output


@pytest.mark.parametrize("time_format", ["relative", "iso", "raw"])
def test_ls_history_cuts_the_error_with_an_ellipsis_at_80_columns(
    history: tuple[str, list[HistoryRecord]], time_format: str
) -> None:
    url, records = history
    result = run("ls", url, "--history", "--time-format", time_format)
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    assert all(len(line) <= 80 for line in lines), result.stdout
    failed = next(line for line in lines if line.startswith(records[1].id[:8]))
    assert failed.rstrip().endswith("…") and "  regio" in failed, result.stdout


def test_watch_into_a_pipe_keeps_its_frame_header_on_one_line(tmp_path: Path) -> None:
    store = LocalDirStore(tmp_path)
    message = {"type_name": "x::Y", "data": "{}", "parent_id": None, "step": 0}
    asyncio.run(store.put(f"procedure/{ProcedureId.random()}/0000000000.step", json.dumps(message).encode()))
    result = run("watch", str(tmp_path), "--count", "1")
    assert result.exit_code == 0, result.output
    header = result.stdout.splitlines()[0]
    assert re.search(r" at \d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ: 1 procedure$", header), result.stdout
