"""The CLI as an operator uses it: at 80 columns, through pipes, in scripts (json, jsonl, yaml)."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
import uuid
from pathlib import Path

import msgspec
import pytest
from click.testing import CliRunner, Result

from procstore._cli.app import cli
from procstore._cli.common import ExitCode
from procstore.store import open_state_store
from procstore.store.local import LocalDirStore
from tests.cli.store_builder import MixedStore, build_mixed_store
from tests.support import put_now as put


def run(*args: str, columns: int = 80, input: str | None = None) -> Result:
    return CliRunner(env={"COLUMNS": str(columns)}).invoke(cli, list(args), input=input)


@pytest.fixture
def mixed(tmp_path: Path) -> tuple[str, MixedStore]:
    url = str(tmp_path / "cp")
    built = asyncio.run(build_mixed_store(open_state_store(url), ""))
    return url, built


def message(type_name: str, step: int, parent: str | None = None) -> bytes:
    return json.dumps({"type_name": type_name, "data": "{}", "parent_id": parent, "step": step}).encode()


def test_ls_fits_80_columns_with_ids_any_command_takes_back(tmp_path: Path) -> None:
    url = str(tmp_path)
    ids = [str(uuid.uuid4()) for _ in range(5)]
    for pid in ids:
        put(url, f"procedure/{pid}/0000000000.step", message("metasrv-procedure::RegionMigration", 0))
    table = run("ls", url)
    assert table.exit_code == 0, table.output
    lines = table.stdout.splitlines()
    assert all(len(line) <= 80 for line in lines), lines
    assert all(h in lines[0] for h in ("id", "type", "status")), lines[0]
    short = lines[2].split()[0]
    assert 8 <= len(short) < 36 and any(pid.startswith(short) for pid in ids)
    assert "unfinished" in lines[2] and "5 procedures: 5 unfinished" in table.stdout
    assert run("show", url, short).exit_code == 0
    wide = run("ls", url, "--wide")
    assert all(pid in wide.stdout for pid in ids)


def test_an_unreachable_store_and_a_wrong_prefix_say_so(tmp_path: Path) -> None:
    unreachable = run("ls", "http://127.0.0.1:1/x")
    assert unreachable.exit_code == ExitCode.STORE_UNAVAILABLE and "0 procedures" not in unreachable.output
    put(str(tmp_path), "elsewhere/procedure/x.json", b"{}")
    wrong = run("ls", str(tmp_path))
    assert wrong.exit_code == ExitCode.NOT_FOUND and "wrong prefix" in wrong.stderr
    empty = tmp_path / "empty"
    empty.mkdir()
    assert run("ls", str(empty)).stdout.endswith("0 procedures\n")


def test_a_closed_pipe_is_a_quiet_success(mixed: tuple[str, MixedStore]) -> None:
    url, _ = mixed
    for flags in ([], ["--json"], ["-o", "json"]):
        command = [sys.executable, "-m", "procstore", "ls", url, *flags]
        done = subprocess.run(
            f"{' '.join(command)} | head -c 1 > /dev/null; echo ${{PIPESTATUS[0]}}",
            shell=True, executable="/bin/bash", capture_output=True, text=True, check=True,
        )  # fmt: skip
        assert done.stdout.strip() == "0" and "Error" not in done.stderr, (flags, done.stderr)


def test_markers_mean_what_the_help_says(tmp_path: Path) -> None:
    url = str(tmp_path)
    committed, orphan, parent = (str(uuid.uuid4()) for _ in range(3))
    put(url, f"procedure/{committed}/0000000000.step", message("x::Done", 0))
    put(url, f"procedure/{committed}/0000000001.step", b'{"type_name": "x::Do')  # last state torn
    put(url, f"procedure/{committed}/0000000002.commit", b"")
    put(url, f"procedure/{orphan}/0000000000.step", message("x::Child", 0, parent))
    help_text = run("ls", "--help", columns=200).stdout
    assert "`*` finished, but its last state cannot be read" in help_text and "(orphan)" in help_text
    rows = {r["id"]: r for r in json.loads(run("ls", url, "-o", "json").stdout)["procedures"]}
    assert rows[orphan]["orphan"] is True and rows[committed]["problem"]
    table = run("ls", url, "--wide", columns=200).stdout
    assert "done*" in table and "unfinished (orphan)" in table
    tree = run("tree", url, columns=200).stdout
    assert f"its parent {parent} is not in the store" in tree


def test_formats_are_one_option_for_every_command(mixed: tuple[str, MixedStore]) -> None:
    url, store = mixed
    document = json.loads(run("ls", url, "-o", "json").stdout)  # one document, warnings kept in it
    assert {r["id"] for r in document["procedures"]} == set(store.expected)
    assert document["warnings"] == ["not a procedure key, ignored: procedure/not-a-procedure/README"]
    assert all(r["modified"].endswith("Z") and "T" in r["modified"] for r in document["procedures"])
    lines = run("ls", url, "--output", "jsonl").stdout.splitlines()
    assert len(lines) == len(store.expected) and json.loads(lines[0])["id"]
    assert json.loads(run("ls", url, "--json").stdout.splitlines()[0])["id"]  # --json stays JSON lines
    yaml_doc = msgspec.yaml.decode(run("ls", url, "-o", "yaml").stdout.encode())
    assert len(yaml_doc["procedures"]) == len(store.expected)
    for command in (["tree", url], ["gc", url, "--dry-run"], ["show", url, store.migration]):
        out = run(*command, "-o", "json")
        assert out.exit_code == 0, (command, out.output)
        json.loads(out.stdout)
    both = run("ls", url, "-o", "json", "-s", "auto_mkdir=false")  # a format and a storage option
    assert both.exit_code == 0 and json.loads(both.stdout)
    former = run("ls", url, "-o", "json", "-o", "auto_mkdir=false")  # the storage options' former flag
    assert former.exit_code == 0 and json.loads(former.stdout) and "use `-s KEY=VALUE`" in former.stderr
    clash = run("ls", url, "-o", "json", "--output", "yaml")
    assert clash.exit_code == ExitCode.USAGE and "several output formats" in clash.output


def test_sorting_limits_headers_and_times(mixed: tuple[str, MixedStore]) -> None:
    url, store = mixed
    ids = [r["id"] for r in json.loads(run("ls", url, "-o", "json", "--sort", "id").stdout)["procedures"]]
    assert ids == sorted(store.expected)
    reverse = json.loads(run("ls", url, "-o", "json", "--sort", "id", "--reverse", "--limit", "2").stdout)
    assert [r["id"] for r in reverse["procedures"]] == sorted(store.expected)[::-1][:2]
    bare = run("ls", url, "--no-headers", "--limit", "3").stdout.splitlines()
    assert len(bare) == 3 and not any("procedures" in line or line.startswith("id") for line in bare)
    year = time.strftime("%Y", time.gmtime())
    assert f"{year}-" in run("ls", url, "--time-format", "iso", columns=200).stdout
    assert "ago" in run("ls", url, columns=200).stdout


def test_tree_of_a_child_shows_its_ancestors(mixed: tuple[str, MixedStore]) -> None:
    url, store = mixed
    shown = run("tree", url, store.running_child, columns=200).stdout
    assert shown.index(store.parent) < shown.index(store.running_child) and "(ancestor)" in shown
    data = json.loads(run("tree", url, store.running_child, "-o", "json").stdout)
    assert [a["id"] for a in data["ancestors"]] == [store.parent]


def test_watch_into_a_file_appends_frames_or_json_lines(mixed: tuple[str, MixedStore]) -> None:
    url, store = mixed
    frames = run("watch", url, "--interval", "0.2", "--count", "2", columns=200).stdout
    assert frames.count(" at ") == 2 and "0 changes since the last listing" in frames
    changes = [json.loads(line) for line in run("watch", url, "--count", "1", "-o", "jsonl").stdout.splitlines()]
    assert {c["id"] for c in changes} == set(store.expected) and {c["change"] for c in changes} == {"new"}


def test_gc_removes_stale_temp_files_and_reports_keys_it_did_not_write(tmp_path: Path) -> None:
    url = str(tmp_path)
    pid = str(uuid.uuid4())
    put(url, f"procedure/{pid}/0000000000.step", message("x::Y", 0))
    temp = tmp_path / "procedure" / pid / ".tmp-0123456789abcdef"
    temp.write_bytes(b"half")
    old = time.time() - 7200
    os.utime(temp, (old, old))
    put(url, "procedure/not-ours/README", b"hello")
    result = run("gc", url, "-o", "json")
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert report["temp_files_removed"] == 1 and not temp.exists()
    assert report["left_alone"] == ["procedure/not-ours/README"] and (tmp_path / "procedure/not-ours/README").exists()
    assert LocalDirStore(tmp_path).root.joinpath("procedure", pid, "0000000000.step").exists()


def test_one_wording_for_a_declined_prompt_and_option_names_in_errors(mixed: tuple[str, MixedStore]) -> None:
    url, store = mixed
    declined = run("delete", url, store.migration, "--force", input="n\n")
    assert declined.exit_code == ExitCode.REFUSED and "declined: nothing was changed" in declined.output
    cancelled = run("cancel", url, store.migration, input="n\n")
    assert "declined: nothing was changed" in cancelled.output
    bad_age = run("ls", url, "--older-than", "5x")
    assert bad_age.exit_code == ExitCode.USAGE and "--older-than" in bad_age.output
    bad_gc_age = run("gc", url, "--older-than", "5x")
    assert bad_gc_age.exit_code == ExitCode.USAGE and "--older-than" in bad_gc_age.output
    bad_status = run("ls", url, "--status", "bogus")
    assert bad_status.exit_code == ExitCode.USAGE and "--status" in bad_status.output
    assert run("ls", url, "--status", "rolling-back").exit_code == 0  # either spelling is read
    help_text = run("ls", "--help", columns=200).stdout
    assert "rolling back" in help_text and "rolling-back" not in help_text
