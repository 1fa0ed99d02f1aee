"""A local store whose files were made by someone else: a FIFO, a device or a link looping
to itself where a value should be, a folder where the lease should be. Each is that key's
problem; every other key reads as always."""

from __future__ import annotations

import asyncio
import json
import os
from pathlib import Path

import pytest
from click.testing import CliRunner
from starlette.testclient import TestClient

from procstore._cli.app import cli
from procstore._runtime.lease import LEASE_KEY
from procstore._web.app import create_app
from procstore.store.local import LocalDirStore

GOOD, BAD = "88888888-8888-4888-8888-888888888888", "99999999-9999-4999-8999-999999999999"


def _store_with(tmp_path: Path) -> Path:
    """A readable procedure, and the folder of another one, empty."""
    for pid in (GOOD, BAD):
        (tmp_path / "procedure" / pid).mkdir(parents=True)
    value = {"type_name": "app::Innocent", "data": "{}", "parent_id": None, "step": 0}
    (tmp_path / "procedure" / GOOD / "0000000000.step").write_text(json.dumps(value))
    return tmp_path


@pytest.mark.parametrize("shape", ["fifo", "link to a fifo", "device"])
def test_a_value_that_is_not_a_regular_file_is_unreadable_not_waited_for(tmp_path: Path, shape: str) -> None:
    root = _store_with(tmp_path)
    value = root / "procedure" / BAD / "0000000000.step"
    if shape == "device":
        value.symlink_to("/dev/zero")  # would be read until memory runs out
    elif shape == "fifo":
        os.mkfifo(value)  # would be waited on until a writer came
    else:
        os.mkfifo(root / "a-fifo")
        value.symlink_to(root / "a-fifo")

    async def read() -> list[bytes | Exception | None]:
        store = LocalDirStore(root)
        try:
            keys = [f"procedure/{pid}/0000000000.step" for pid in (GOOD, BAD)]
            return await asyncio.wait_for(store.get_many(keys), 20)
        finally:
            await store.close()

    good, bad = asyncio.run(read())
    assert isinstance(good, bytes) and isinstance(bad, OSError) and "not a regular file" in str(bad)
    listed = json.loads(CliRunner().invoke(cli, ["ls", str(root), "-o", "json"]).stdout)["procedures"]
    assert {p["id"]: p["status"] for p in listed} == {GOOD: "unfinished", BAD: "unreadable"}


def test_a_value_linked_to_itself_is_that_procedures_problem(tmp_path: Path) -> None:
    root = _store_with(tmp_path)
    os.symlink("0000000000.step", root / "procedure" / BAD / "0000000000.step")
    for args in (["ls"], ["tree"], ["gc", "--dry-run"]):
        result = CliRunner().invoke(cli, [args[0], str(root), *args[1:]])
        assert result.exit_code == 0, (args, result.output)
    listed = json.loads(CliRunner().invoke(cli, ["ls", str(root), "-o", "json"]).stdout)["procedures"]
    assert {p["id"]: p["status"] for p in listed} == {GOOD: "unfinished", BAD: "unreadable"}
    with TestClient(create_app(str(root))) as client:
        assert client.get("/").status_code == 200 and client.get(f"/p/{GOOD}").status_code == 200


def test_a_folder_at_the_lease_key_is_the_leases_problem_not_the_pages(tmp_path: Path) -> None:
    root = _store_with(tmp_path)
    (root / LEASE_KEY / "x").mkdir(parents=True)
    with TestClient(create_app(str(root))) as client:
        for path in ("/", "/api/procedures"):
            answer = client.get(path)
            assert answer.status_code == 200 and GOOD in answer.text, path
        assert "cannot be read" in client.get("/api/procedures").json()["lease"]["problem"]
