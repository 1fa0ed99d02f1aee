"""`procstore show` (and the web view's history) of an id whose keys are gone prints its history record in the chosen
format, in the document shape of a live id's (`procedure`, `status`, `keys`, and `record`),
with JSON's escapes and the one time form; `-o json` never rounds a stored integer."""

from __future__ import annotations

import asyncio
import json
import re
from pathlib import Path

import pytest
from click.testing import CliRunner
from starlette.testclient import TestClient

from procstore import ProcedureFailed, ProcedureWithId
from procstore._cli.app import cli
from procstore._web.app import create_app
from tests.procedures import Steps, World
from tests.runtime.test_operations import Flaky, manager_on
from tests.support import manager_for

HOSTILE_NAME = "x\x9b31m\u202eevil"


def failed_and_gone(url: str) -> str:
    """A procedure whose error holds C1 and bidi characters, failed and deleted."""

    async def run() -> str:
        Flaky.broken.add(HOSTILE_NAME)
        procedure = ProcedureWithId.new(Flaky({"name": HOSTILE_NAME, "at": 0, "fail_at": 2}))
        async with manager_on(url) as manager:
            with pytest.raises(ProcedureFailed):
                await (await manager.submit(procedure)).wait()
            assert not await manager.store.procedure_keys(procedure.id)
        return str(procedure.id)

    return asyncio.run(run())


def test_show_of_an_ended_id_escapes_and_shapes_its_json_and_yaml(tmp_path: Path) -> None:
    url = str(tmp_path)
    pid = failed_and_gone(url)
    shown = CliRunner().invoke(cli, ["show", url, pid, "-o", "json"])
    assert shown.exit_code == 0, shown.output
    assert not re.search("[\x9b\u202e]", shown.output) and "\\u009b" in shown.output
    document = json.loads(shown.output)
    assert set(document) == {"procedure", "status", "keys", "record"}
    assert document["procedure"] == pid and document["keys"] == []
    assert document["status"]["status"] == document["record"]["outcome"] == "failed"
    assert HOSTILE_NAME in document["record"]["error"]
    yaml = CliRunner().invoke(cli, ["show", url, pid, "-o", "yaml"])
    assert yaml.exit_code == 0 and yaml.output.startswith("procedure:"), yaml.output
    assert not re.search("[\x9b\u202e]", yaml.output)


def test_times_in_json_are_iso_8601_utc_to_the_second(tmp_path: Path) -> None:
    url = str(tmp_path)
    pid = failed_and_gone(url)
    one_form = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ")
    history = json.loads(CliRunner().invoke(cli, ["history", url, "-o", "json"]).output)["history"][0]
    shown = json.loads(CliRunner().invoke(cli, ["show", url, pid, "-o", "json"]).output)
    times = [history["started_at"], history["ended_at"], history["started"]["at"]]
    times += [shown["record"]["ended_at"], shown["status"]["ended_at"]]
    with TestClient(create_app(url)) as web:
        (row,) = web.get("/api/history").json()["records"]
        times += [row["started_at"], row["ended_at"], row["started"]["at"]]
    assert all(one_form.fullmatch(t) for t in times), times


def test_show_json_keeps_integers_beyond_64_bits_whole(tmp_path: Path) -> None:
    big = 2**100 + 1
    world = World.new()

    async def run() -> str:
        procedure = ProcedureWithId.new(Steps({"world": world.name, "steps": 3, "fail_at": 1, "big": big}))
        async with manager_for(str(tmp_path), keep_failed=True) as manager:
            with pytest.raises(ProcedureFailed):
                await (await manager.submit(procedure)).wait()
        return str(procedure.id)

    pid = asyncio.run(run())
    shown = CliRunner().invoke(cli, ["show", str(tmp_path), pid, "-o", "json"])
    assert shown.exit_code == 0, shown.output
    datas = [k["message"]["data"] for k in json.loads(shown.output)["keys"] if k.get("message")]
    assert datas and all(str(big) in (d if isinstance(d, str) else json.dumps(d)) for d in datas), datas
    assert "e+30" not in shown.output, "not rounded to a float"
