"""The web view and `procstore watch` say the words of `ls`, `show` and `Client`
(`procstore._client.words`): a kept root whose end record says `rolled back` is `rolled back`
in the list, its page, the counts and the filter, never `failed` or `committed`."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import get_args

from click.testing import CliRunner
from starlette.testclient import TestClient

from procstore import Client
from procstore._cli.app import cli
from procstore._client.words import StatusWord
from procstore._web.app import create_app
from tests.runtime.test_operations import Undone, failed_and_kept, manager_on


def rolled_back_and_kept(url: str) -> str:
    async def run() -> str:
        async with manager_on(url, keep_failed=True) as manager:
            pid, _ = await failed_and_kept(manager, Undone)
        async with Client(url) as client:
            assert (await client.get(pid)).status == "rolled back"
        return str(pid)

    return asyncio.run(run())


def test_the_web_view_says_rolled_back_where_the_end_record_does(tmp_path: Path) -> None:
    url = str(tmp_path / "cp")
    pid = rolled_back_and_kept(url)
    with TestClient(create_app(url)) as web:
        overview = web.get("/api/procedures").json()
        (row,) = overview["procedures"]
        assert row["status"] == "rolled back"
        assert set(overview["counts"]) == set(get_args(StatusWord)) and overview["counts"]["rolled back"] == 1
        assert [r["id"] for r in web.get("/api/procedures?status=rolled+back").json()["procedures"]] == [pid]
        assert web.get("/api/procedures?status=failed").json()["procedures"] == []
        page = web.get(f"/api/procedures/{pid}").json()
        assert page["procedure"]["status"] == "rolled back"
        assert all(s["ended"] is None or s["ended"]["status"] != "committed" for s in page["steps"])
        assert "committed" not in web.get("/").text


def test_watch_says_rolled_back_where_the_end_record_does(tmp_path: Path) -> None:
    url = str(tmp_path / "cp")
    pid = rolled_back_and_kept(url)
    result = CliRunner().invoke(cli, ["watch", url, "--count", "1", "-o", "jsonl"])
    assert result.exit_code == 0, result.output
    rows = [json.loads(line) for line in result.output.splitlines() if line.strip()]
    assert [(r["id"], r["status"]) for r in rows if "id" in r] == [(pid, "rolled back")]
