"""The CLI over a store written by an attacker (`procstore.testing.hostile`): every stored
value printed as inert text (no terminal escape, no rich markup), never an internal error,
bounded, and whole in `-o json`."""

from __future__ import annotations

import asyncio
import json
import os
import uuid
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

from procstore._cli.app import cli
from procstore._cli.common import ExitCode
from procstore._text import terminal_text
from procstore.store import open_state_store
from procstore.testing.hostile import HOSTILE_TEXTS, LARGE_ARRAY_LENGTH, HostileStore, write_hostile_store
from tests.support import put_now as put

# What a terminal obeys: ESC (and so CSI, OSC: titles, clearing, hyperlinks), C1's CSI, BEL,
# backspace, carriage return. None of it may come from the store.
OBEYED = ("\x1b", "\x9b", "\x07", "\x08", "\r", "\x00", "\u202e")


@pytest.fixture
def hostile(tmp_path: Path) -> tuple[str, HostileStore]:
    url = str(tmp_path / "store")
    Path(url).mkdir()

    async def write() -> HostileStore:
        store = open_state_store(url)
        try:
            return await write_hostile_store(store)
        finally:
            await store.close()

    return url, asyncio.run(write())


def run(*args: str, input: str | None = None) -> Result:
    return CliRunner(env={"COLUMNS": "200"}).invoke(cli, list(args), input=input)


def inert(result: Result) -> str:
    """The output, checked: no internal error, nothing a terminal would obey."""
    text = result.output + (result.stderr if result.stderr_bytes else "")
    assert result.exit_code != ExitCode.INTERNAL and "internal error" not in text, text[-2000:]
    for char in OBEYED:
        assert char not in text, (repr(char), text[-2000:])
    return text


def test_every_listing_shows_the_values_as_text(hostile: tuple[str, HostileStore]) -> None:
    url, _ = hostile
    for args in (["ls", url, "--wide"], ["tree", url], ["watch", url, "--count", "1"], ["ls", url, "--history"]):
        result = run(*args)
        assert result.exit_code == 0, result.output
        text = inert(result)
        assert "[/oops]" in text and "[link=https://evil.example]" in text, args  # shown, not obeyed
        assert "\\x1b]0;pwned" in text, args  # the escape, spelled out


def test_show_prints_every_value_as_text(hostile: tuple[str, HostileStore]) -> None:
    url, written = hostile
    for pid in written.procedures:
        result = run("show", url, str(pid))
        assert result.exit_code in (0, ExitCode.UNREADABLE), result.output
        inert(result)
    every = "".join(inert(run("show", url, str(pid))) for pid in written.procedures[: len(HOSTILE_TEXTS)])
    assert "[/oops]" in every and "[bold red]not bold[/]" in every and "\\x9b31m" in every
    for hid in written.history_ids:
        inert(run("show", url, hid))


def test_the_prompts_show_the_values_as_text(hostile: tuple[str, HostileStore]) -> None:
    url, written = hostile
    for pid in written.procedures[: len(HOSTILE_TEXTS)]:
        for command in ("delete", "cancel"):
            result = run(command, url, str(pid), input="n\n")
            assert result.exit_code == ExitCode.REFUSED, result.output
            inert(result)


@pytest.mark.parametrize("fmt", ["json", "yaml", "jsonl"])
def test_structured_output_takes_a_key_name_that_is_not_utf8(hostile: tuple[str, HostileStore], fmt: str) -> None:
    url, _ = hostile
    result = run("ls", url, "-o", fmt)
    assert result.exit_code == 0, result.output
    assert "procedure/bad\\xff.txt" in result.output.replace("\\\\", "\\")


def test_a_large_value_is_shown_bounded_and_whole_in_json(hostile: tuple[str, HostileStore]) -> None:
    url, written = hostile
    shown = run("show", url, str(written.large))
    assert shown.exit_code == 0 and len(shown.output) < 100_000, len(shown.output)
    assert (
        f"{LARGE_ARRAY_LENGTH - 20:,} more elements" in shown.output
        or f"{LARGE_ARRAY_LENGTH - 20} more" in shown.output
    )
    whole = run("show", url, str(written.large), "-o", "json")
    data = json.loads(whole.output)["keys"][0]["message"]["data"]
    assert len(data["items"]) == LARGE_ARRAY_LENGTH


@pytest.mark.parametrize("value", ["[/oops]", "\x1b]0;pwned\x07\x1b[2J", "[link=https://evil.example]x[/link]"])
def test_one_stored_type_name_with_markup_or_escapes(tmp_path: Path, value: str) -> None:
    """Findings 4 and 5 alone: one procedure, its type name hostile."""
    message = {"type_name": value, "data": json.dumps({value: value}), "parent_id": None, "step": 0}
    put(str(tmp_path), f"procedure/{uuid.uuid4()}/0000000000.step", json.dumps(message).encode())
    for args in (["ls", str(tmp_path), "--wide"], ["tree", str(tmp_path)]):
        result = run(*args)
        assert result.exit_code == 0, result.output
        assert terminal_text(value) in inert(result)


def test_one_key_name_that_is_not_utf8(tmp_path: Path) -> None:
    """Finding 6 alone: a local file `procedure/bad\\xff.txt`."""
    (tmp_path / "procedure").mkdir()
    (tmp_path / "procedure").joinpath(os.fsdecode(b"bad\xff.txt")).write_bytes(b"x")
    for fmt in ("json", "yaml"):
        result = run("ls", str(tmp_path), "-o", fmt)
        assert result.exit_code == 0 and "bad\\xff.txt" in result.output.replace("\\\\", "\\"), result.output


def test_a_key_of_another_shape_is_listed_as_such_never_acted_on(tmp_path: Path) -> None:
    """`procedure/x/{id}/0000000001.step` named a procedure whose reads and deletes went to
    `procedure/{id}/...`: `delete` said it deleted it and the key stayed."""
    pid = str(uuid.uuid4())
    message = {"type_name": "t", "data": "{}", "parent_id": None, "step": 1}
    for key in (f"procedure/x/{pid}/0000000001.step", f"procedure/{pid}/1.step"):
        put(str(tmp_path), key, json.dumps(message).encode())
    listed = json.loads(run("ls", str(tmp_path), "-o", "json").output)
    assert listed["procedures"] == [] and len(listed["warnings"]) == 2
    assert run("delete", str(tmp_path), pid, "-y").exit_code == ExitCode.NOT_FOUND


def test_a_lease_holder_and_a_request_reason_are_shown_as_text(tmp_path: Path) -> None:
    """The lease (`procstore lease`) and an operator request (a `cancel`'s refusal names the
    one already written) are stored values too."""
    holder = "\x1b]0;pwned\x07[/oops]"
    lease = {"holder": holder, "epoch": 1, "renewal": 1, "ttl": 10.0, "released": False}
    put(str(tmp_path), "lease/procedures.json", json.dumps(lease).encode())
    pid = str(uuid.uuid4())
    put(
        str(tmp_path),
        f"procedure/{pid}/0000000000.step",
        json.dumps({"type_name": "t", "data": "{}", "parent_id": None, "step": 0}).encode(),
    )
    request = {"kind": "cancel", "reason": "\x1b[2J[/oops]", "requested_at": 1.0}
    put(str(tmp_path), f"requests/{pid}.json", json.dumps(request).encode())
    shown = run("lease", str(tmp_path))
    assert shown.exit_code == 0 and "[/oops]" in inert(shown)
    refused = run("cancel", str(tmp_path), pid, "-y")
    assert refused.exit_code == ExitCode.REFUSED and "[/oops]" in inert(refused)


def test_a_parent_chain_deeper_than_recursion_goes_is_listed(tmp_path: Path) -> None:
    """A chain of 1,100 (finding 3): `tree` failed (RecursionError), and `ls` walked every
    chain from every procedure; now each parent link is walked once, `tree` nests 20 levels
    and counts the rest, and `delete` of the root finds all 1,099 descendants."""
    ids = [str(uuid.uuid4()) for _ in range(1100)]
    for n, pid in enumerate(ids):
        message = {"type_name": "chain", "data": "{}", "parent_id": ids[n - 1] if n else None, "step": 0}
        folder = tmp_path / "procedure" / pid
        folder.mkdir(parents=True)
        (folder / "0000000000.step").write_text(json.dumps(message))
    assert run("ls", str(tmp_path)).exit_code == 0
    whole = run("tree", str(tmp_path))
    assert whole.exit_code == 0 and "1079 more descendants" in whole.output, whole.output[-300:]
    assert run("tree", str(tmp_path), ids[-1]).exit_code == 0
    assert run("tree", str(tmp_path), "-o", "json").exit_code == 0
    declined = run("delete", str(tmp_path), ids[0], "--force", input="n\n")
    assert declined.exit_code == ExitCode.REFUSED and "1099 subprocedures" in inert(declined)


def test_show_makes_no_copy_of_a_long_key_per_field_below_it(tmp_path: Path) -> None:
    """One key of 20,000 characters holding 8,000 fields (about 120 KB stored): each field's
    name was built whole before the first 200 were kept, 160 MB for a view of 200 rows
    (8,000 names of 20,000 characters), quadratic in the value's size."""
    import tracemalloc

    pid = "11111111-1111-4111-8111-111111111111"
    data = json.dumps({"k" * 20_000: {str(i): i for i in range(8_000)}})
    value = json.dumps({"type_name": "t", "data": data, "parent_id": None, "step": 0}).encode()
    folder = tmp_path / "procedure" / pid
    folder.mkdir(parents=True)
    (folder / "0000000000.step").write_bytes(value)
    tracemalloc.start()
    try:
        result = CliRunner().invoke(cli, ["show", str(tmp_path), pid])
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert result.exit_code == 0, result.output
    assert "more fields or groups of fields" in result.output
    # About 12 MB now, most of it the table; the names alone were 160 MB.
    assert peak < 200 * len(value), f"{peak:,} bytes at the peak for a value of {len(value):,}"
