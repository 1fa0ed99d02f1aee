"""The store commands, as a new user runs them on a store prepared outside procstore: GreptimeDB
and procstore procedures under a prefix, some corrupt. Every check is against the store's keys."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner, Result
from starlette.testclient import TestClient

from procstore import ProcedureId
from procstore._cli.app import cli
from procstore._cli.common import ExitCode
from procstore._web.app import create_app
from procstore.store import open_state_store
from procstore.store.message import ProcedureMessage
from procstore.testing.pytest_plugin import create_bucket, free_port, s3_storage_options
from tests.cli.store_builder import MixedStore, build_mixed_store
from tests.procedures import BLOCKERS
from tests.support import manager_for


class Place:
    """Where the mixed store lives: the URL a user types, and its storage options."""

    def __init__(self, url: str, options: dict[str, Any]) -> None:
        self.url = url
        self.options = options
        self.args = [
            a for k, v in options.items() for a in ("-s", f"{k}={json.dumps(v) if not isinstance(v, str) else v}")
        ]

    def stored_keys(self) -> set[str]:
        async def walk() -> list[str]:
            store = open_state_store(self.url, self.options)
            try:
                return await store.walk("")
            finally:
                await store.close()

        return set(asyncio.run(walk()))

    def run(self, *args: str, input: str | None = None) -> Result:
        command, *rest = args
        return CliRunner().invoke(cli, [command, self.url, *self.args, *rest], input=input)


@pytest.fixture(params=["local", "s3"])
def mixed(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[Place, MixedStore]]:
    if request.param == "local":
        place = Place(str(tmp_path / "cp"), {})
    else:
        endpoint = request.getfixturevalue("procstore_moto_endpoint")
        place = Place(f"s3://{create_bucket(endpoint)}/cp", s3_storage_options(endpoint))

    async def build() -> MixedStore:
        store = open_state_store(place.url, place.options)
        try:
            return await build_mixed_store(store, "")
        finally:
            await store.close()

    yield place, asyncio.run(build())
    BLOCKERS.pop("cli-hold", None)


def ls_json(place: Place, *args: str) -> dict[str, dict[str, Any]]:
    result = place.run("ls", "--json", *args)
    assert result.exit_code == 0, result.output
    rows = [json.loads(line) for line in result.stdout.splitlines()]
    return {row["id"]: row for row in rows}


def test_ls_shows_every_procedure_with_its_status(mixed: tuple[Place, MixedStore]) -> None:
    place, store = mixed
    rows = ls_json(place)
    assert {pid: row["status"] for pid, row in rows.items()} == store.expected
    assert rows[store.migration]["type"] == "metasrv-procedure::RegionMigration"
    assert rows[store.migration]["step"] == 1
    assert rows[store.parent]["children"] == 2
    assert rows[store.running_child]["parent"] == store.parent
    assert rows[store.truncated]["type"] == "x::Torn"  # from the last readable step
    assert "not JSON" in rows[store.truncated]["problem"]
    assert rows[store.ps_unfinished]["type"] == "test::Undoable" and rows[store.ps_unfinished]["step"] == 2
    assert all(row["modified"] is not None for row in rows.values())


def test_ls_filters_and_table(mixed: tuple[Place, MixedStore]) -> None:
    place, store = mixed
    assert set(ls_json(place, "--status", "committed")) == {
        store.committed_child, store.gt_committed, store.ps_committed
    }  # fmt: skip
    assert set(ls_json(place, "--status", "rolling-back", "--status", "unreadable")) == {
        store.rolling_back, store.truncated, store.empty
    }  # fmt: skip
    assert set(ls_json(place, "--type", "CreateRegion")) == {store.committed_child, store.running_child}
    assert ls_json(place, "--older-than", "1h") == {}
    assert len(ls_json(place, "--newer-than", "1h")) == len(store.expected)
    table = place.run("ls")
    assert table.exit_code == 0
    assert store.migration in table.stdout and "10 procedures" in table.stdout
    assert "not a procedure key, ignored" in table.stderr and "not a procedure key" not in table.stdout


def test_show_decodes_steps_and_marks_changes(mixed: tuple[Place, MixedStore]) -> None:
    place, store = mixed
    result = place.run("show", store.migration[:8])
    assert result.exit_code == 0, result.output
    assert "state.region_migration_state" in result.stdout and "OpenCandidateRegion" in result.stdout
    changed = [line for line in result.stdout.splitlines() if "*" in line]
    assert any("to_peer.id" in line for line in changed) and not any("from_peer" in line for line in changed)
    rolling = place.run("show", store.rolling_back)
    assert "region 7 is gone" in rolling.stdout
    torn = place.run("show", store.truncated)
    assert torn.exit_code == ExitCode.UNREADABLE
    assert "unreadable" in torn.stdout and f"procedure {store.truncated}" in torn.stderr
    lines = [json.loads(line) for line in place.run("show", store.migration, "--json").stdout.splitlines()]
    assert [line["step"] for line in lines] == [0, 1]


def test_tree_nests_children_under_parents(mixed: tuple[Place, MixedStore]) -> None:
    place, store = mixed
    whole = place.run("tree").stdout
    assert whole.index(store.parent) < whole.index(store.committed_child)
    one = place.run("tree", store.parent).stdout
    assert store.running_child in one and store.migration not in one


def test_gc_deletes_committed_roots_only(mixed: tuple[Place, MixedStore]) -> None:
    place, store = mixed
    before = place.stored_keys()
    dry = place.run("gc", "--dry-run")
    assert dry.exit_code == 0 and store.gt_committed[:8] in dry.stdout  # a unique prefix: ids fit 80 columns
    assert place.stored_keys() == before
    assert place.run("gc", "--older-than", "1d").exit_code == 0
    assert place.stored_keys() == before  # nothing is a day old
    result = place.run("gc")
    assert result.exit_code == 0, result.output
    gone = {k for k in before if store.gt_committed in k or store.ps_committed in k}
    assert len(gone) == 4
    after = place.stored_keys()
    # The committed child of a running parent is kept; each run deleted has its end record.
    assert {k for k in after if not k.startswith("history/")} == before - gone
    assert {k.split("/")[1].split(".")[0] for k in after - before} == {store.gt_committed, store.ps_committed}
    assert "deleted 2 finished procedures" in result.stdout


def test_fail_writes_a_request_and_a_manager_rolls_back(mixed: tuple[Place, MixedStore]) -> None:
    place, store = mixed
    before = place.stored_keys()
    declined = place.run("fail", store.ps_unfinished, input="n\n")
    assert declined.exit_code == ExitCode.REFUSED and place.stored_keys() == before
    result = place.run("fail", store.ps_unfinished, "--reason", "stuck since 3am", "--yes")
    assert result.exit_code == 0, result.output
    assert place.stored_keys() - before == {f"requests/{store.ps_unfinished}.json"}
    assert place.run("fail", store.ps_unfinished, "-y").exit_code == ExitCode.REFUSED  # one request per procedure
    assert place.run("fail", store.gt_committed, "-y").exit_code == ExitCode.REFUSED
    assert place.run("fail", store.truncated, "-y").exit_code == ExitCode.REFUSED

    pid = ProcedureId.parse(store.ps_unfinished)

    async def restart() -> None:
        manager = manager_for(place.url, storage_options=place.options)
        async with manager:
            while (state := manager.procedure_state(pid)) is None or not state.is_ended():
                await asyncio.sleep(0.01)
            assert state.is_failed() and "stuck since 3am" in (state.error or "")

    asyncio.run(asyncio.wait_for(restart(), 20))
    assert "undo/rolled-back" in store.world.effects and "undo/0" not in store.world.effects


def test_delete_removes_a_procedure_and_its_children(mixed: tuple[Place, MixedStore]) -> None:
    place, store = mixed
    before = place.stored_keys()
    refused = place.run("delete", store.parent, "--yes")  # unfinished: a manager may run it
    assert refused.exit_code == ExitCode.REFUSED and "--force" in refused.stderr, refused.output
    # A finished child of that unfinished parent: the parent reads its end when it goes on.
    child = place.run("delete", store.committed_child, "--yes")
    assert child.exit_code == ExitCode.REFUSED and "subprocedure of" in child.stderr, child.output
    assert place.stored_keys() == before
    wrong_flag = place.run("delete", store.committed_child, "-o", "json")
    assert wrong_flag.exit_code == ExitCode.USAGE and "prints no data" in wrong_flag.output
    result = place.run("delete", store.parent, "--yes", "--force")
    assert result.exit_code == 0, result.output
    tree = (store.parent, store.committed_child, store.running_child)
    left = {k for k in place.stored_keys() if not k.startswith("history/")}
    assert left == {k for k in before if not any(pid in k for pid in tree)}
    assert place.run("delete", store.truncated, "-y").exit_code == 0
    assert not any(store.truncated in k for k in place.stored_keys())
    assert place.run("delete", store.truncated, "-y").exit_code == ExitCode.NOT_FOUND


def test_watch_lists_and_stops(mixed: tuple[Place, MixedStore]) -> None:
    place, store = mixed
    result = place.run("watch", "--interval", "0.2", "--count", "2")
    assert result.exit_code == 0, result.output
    assert store.migration in result.stdout and "10 procedures" in result.stdout


def test_parent_path_finds_a_store_under_a_prefix(tmp_path: Path) -> None:
    async def build() -> MixedStore:
        return await build_mixed_store(open_state_store(tmp_path), "region-a/")

    built = asyncio.run(build())
    rows = CliRunner().invoke(cli, ["ls", str(tmp_path), "--parent-path", "region-a", "--json"]).stdout.splitlines()
    assert {json.loads(r)["id"] for r in rows} == set(built.expected)
    BLOCKERS.pop("cli-hold", None)


def test_bad_input_gives_one_line_errors_and_documented_codes(tmp_path: Path, procstore_moto_endpoint: str) -> None:
    runner = CliRunner()
    missing = tmp_path / "nope"
    result = runner.invoke(cli, ["ls", str(missing)])
    assert result.exit_code == ExitCode.STORE_UNAVAILABLE and "no such directory" in result.stderr
    assert not missing.exists()  # nothing created by a read-only command
    assert runner.invoke(cli, ["ls", "nosuchproto://x"]).exit_code == ExitCode.STORE_UNAVAILABLE
    options = [a for k, v in s3_storage_options(procstore_moto_endpoint).items() for a in ("-s", f"{k}={v}")]
    no_bucket = runner.invoke(cli, ["ls", "s3://no-such-bucket-here/cp", *options])
    assert no_bucket.exit_code == ExitCode.STORE_UNAVAILABLE and "does not exist" in no_bucket.stderr
    tmp_path.joinpath("procedure").mkdir()
    assert runner.invoke(cli, ["show", str(tmp_path), "0000"]).exit_code == ExitCode.NOT_FOUND
    assert runner.invoke(cli, ["ls", str(tmp_path), "--older-than", "5x"]).exit_code == ExitCode.USAGE
    assert runner.invoke(cli, ["ls", str(tmp_path), "-o", "novalue"]).exit_code == ExitCode.USAGE


def test_a_store_whose_filesystem_cannot_connect_is_unavailable() -> None:
    """fsspec's FTPFileSystem connects as it is built: refused, it is exit code 3, one line."""
    result = CliRunner().invoke(cli, ["ls", f"ftp://127.0.0.1:{free_port()}/x"])
    assert result.exit_code == ExitCode.STORE_UNAVAILABLE, result.output
    assert "ConnectionRefusedError" in result.stderr and "internal error" not in result.stderr
    assert result.stderr.strip().count("\n") == 0


def test_the_installed_command_prints_one_line_and_exits_with_the_code(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "procstore", "ls", str(tmp_path / "missing")],
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == ExitCode.STORE_UNAVAILABLE
    assert done.stderr.strip().count("\n") == 0 and "Traceback" not in done.stderr


def test_missing_credentials_are_named(procstore_moto_endpoint: str, tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    env |= {"AWS_SHARED_CREDENTIALS_FILE": str(tmp_path / "none"), "AWS_CONFIG_FILE": str(tmp_path / "none"),
            "AWS_EC2_METADATA_DISABLED": "true"}  # fmt: skip
    command = [
        sys.executable,
        "-m",
        "procstore",
        "ls",
        "s3://some-bucket/cp",
        "-s",
        f"endpoint_url={procstore_moto_endpoint}",
    ]
    done = subprocess.run(command, capture_output=True, text=True, env=env, check=False, timeout=60)
    assert done.returncode == ExitCode.STORE_UNAVAILABLE
    assert "no credentials were found" in done.stderr and done.stderr.strip().count("\n") == 0


def test_an_s3_endpoint_and_credentials_from_the_environment_need_no_storage_option(
    procstore_moto_endpoint: str, tmp_path: Path
) -> None:
    """The route docs/cli.md gives: botocore reads AWS_ENDPOINT_URL, as the AWS CLI does."""
    bucket = create_bucket(procstore_moto_endpoint)
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    none = str(tmp_path / "none")
    env |= {"AWS_ENDPOINT_URL": procstore_moto_endpoint, "AWS_ACCESS_KEY_ID": "testing",
            "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1",
            "AWS_SHARED_CREDENTIALS_FILE": none, "AWS_CONFIG_FILE": none}  # fmt: skip
    command = [sys.executable, "-m", "procstore", "ls", f"s3://{bucket}/cp/", "-o", "json"]
    done = subprocess.run(command, capture_output=True, text=True, env=env, check=False, timeout=60)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["procedures"] == []


def test_show_reads_data_nested_as_deep_as_json_goes(tmp_path: Path) -> None:
    """`data` nested 1,000 deep (orjson reads up to 1,024) is shown as fields, by `show` and
    by the web page, not an internal error: Python's recursion stops near 1,000."""
    pid = ProcedureId.random()
    folder = tmp_path / "procedure" / str(pid)
    folder.mkdir(parents=True)
    deep = "[" * 1000 + "]" * 1000
    (folder / "0000000000.step").write_bytes(ProcedureMessage("x::T", deep, None, 0).encode())
    result = CliRunner().invoke(cli, ["show", str(tmp_path), str(pid)])
    assert result.exit_code == 0, result.output
    assert "[0]" * 20 in result.stdout.replace("\n", "")
    with TestClient(create_app(str(tmp_path))) as client:
        assert client.get(f"/p/{pid}").status_code == 200
        assert client.get(f"/api/procedures/{pid}").status_code == 200


def test_a_procedure_folder_that_cannot_be_listed_is_named_and_its_tree_kept(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`ls`, `gc` and the web page name a folder they cannot read and show the rest; `gc`
    keeps a committed child whose parent may be in it, and no child is called an orphan."""
    parent, child = ProcedureId.random(), ProcedureId.random()
    for pid, key, message in (
        (parent, "0000000000.step", ProcedureMessage("x::T", "{}", None, 0)),
        (child, "0000000000.step", ProcedureMessage("x::T", "{}", parent, 0)),
    ):
        (tmp_path / "procedure" / str(pid)).mkdir(parents=True, exist_ok=True)
        (tmp_path / "procedure" / str(pid) / key).write_bytes(message.encode())
    (tmp_path / "procedure" / str(child) / "0000000001.commit").write_bytes(b"")
    os.utime(tmp_path / "procedure" / str(child) / "0000000001.commit", (0, 0))
    real, denied = os.scandir, str(tmp_path / "procedure" / str(parent))

    def scandir(path: str) -> Any:
        if path == denied:
            raise PermissionError(13, "Permission denied", path)
        return real(path)

    monkeypatch.setattr(os, "scandir", scandir)
    listed = CliRunner().invoke(cli, ["ls", str(tmp_path), "--json"])
    assert listed.exit_code == 0, listed.output
    rows = [json.loads(line) for line in listed.stdout.splitlines()]
    assert [row["id"] for row in rows] == [str(child)] and not rows[0]["orphan"]
    assert f"cannot list procedure/{parent}/" in listed.stderr and "Permission denied" in listed.stderr
    collected = CliRunner().invoke(cli, ["gc", str(tmp_path)])
    assert collected.exit_code == 0, collected.output
    assert "deleted 0 finished procedures" in collected.stdout
    assert f"cannot list procedure/{parent}/" in collected.output
    assert (tmp_path / "procedure" / str(child) / "0000000001.commit").exists()
    with TestClient(create_app(str(tmp_path))) as client:
        page = client.get("/")
        assert page.status_code == 200 and f"procedure/{parent}/" in page.text
    shown = CliRunner().invoke(cli, ["show", str(tmp_path), str(parent)])
    assert shown.exit_code == ExitCode.STORE_UNAVAILABLE and f"{parent} cannot be listed" in shown.output, shown.output
    assert CliRunner().invoke(cli, ["show", str(tmp_path), str(child)[:8]]).exit_code == 0
    for command in (["cancel", "-y"], ["fail", "-y"], ["resume"], ["delete", "-y"]):
        refused = CliRunner().invoke(cli, [command[0], str(tmp_path), str(parent), *command[1:]])
        assert refused.exit_code == ExitCode.STORE_UNAVAILABLE, (command, refused.output)
        assert f"{parent} cannot be listed" in refused.output, (command, refused.output)
    assert not (tmp_path / "requests").exists()
