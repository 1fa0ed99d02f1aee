"""A procedure read while its deletion is under way: the last key to go, its `.commit`,
says no run. A failed root kept by `keep_failed`, resumed, done and being deleted, read
then as its first run's failure: `Client.wait` returned the end of the run before (a flaky
CLI test showed it). The newest end record says which run ended."""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any, TypeVar

from click.testing import CliRunner

from procstore import Client
from procstore._cli.app import cli
from procstore.store import StateStore, WrappingStore, open_state_store
from tests.runtime.test_operations import Flaky, failed_and_kept, manager_on
from tests.support import StoreTarget, store_targets

T = TypeVar("T")

target = store_targets("memory", "local", "s3")


class HeldBeforeTheLastCommit(WrappingStore):
    """Holds the deletion of a lone `.commit` (a deletion's last key) until `release` is set."""

    def __init__(self, inner: StateStore) -> None:
        super().__init__(inner)
        self.holding = asyncio.Event()
        self.release = asyncio.Event()

    async def around(
        self, kind: str, key: str, call: Callable[[], Coroutine[Any, Any, T]], value: bytes | None = None
    ) -> T:
        if kind == "batch_delete" and "," not in key and key.endswith(".commit") and "/procedure/" in f"/{key}":
            self.holding.set()
            await self.release.wait()
        return await call()


async def test_a_resumed_run_read_at_its_last_commit_is_that_runs_end(target: StoreTarget) -> None:
    store = HeldBeforeTheLastCommit(open_state_store(target.url, target.storage_options))
    async with manager_on(store, keep_failed=True) as manager:
        pid, name = await failed_and_kept(manager)
        Flaky.broken.discard(name)
        resumed = await manager.resume(pid)
        await asyncio.wait_for(store.holding.wait(), 20)
        async with Client(target.url, target.storage_options, poll_interval=0.05) as client:
            status = await client.get(pid)
            assert (status.status, status.run) == ("done", 2)
            assert await client.wait(pid, timeout=20) == name
            listed = await asyncio.to_thread(CliRunner().invoke, cli, ["ls", target.url, *_options(target), "--json"])
            assert listed.exit_code == 0, listed.output
            assert '"done"' in listed.output and '"failed"' not in listed.output, listed.output
        store.release.set()
        assert await resumed.wait() == name


def _options(target: StoreTarget) -> list[str]:
    return [arg for key, value in target.storage_options.items() for arg in ("-s", f"{key}={value}")]


async def test_folders_at_their_last_commit_read_the_latest_record_of_an_earlier_release(tmp_path: Path) -> None:
    """Ids an earlier release recorded twice (`history/{ms}-{id}.json`, ended twice), each
    folder at its last `.commit`, or gone: every one reads as its later end, whether one
    folder is read (`find`) or many from one listing of the history (they read as the
    earlier end, and so did an id of no folder)."""
    ids = [str(uuid.UUID(int=(1 << 100) + i, version=4)) for i in range(3)]
    (tmp_path / "history").mkdir()
    for pid in ids:
        if pid != ids[-1]:
            (tmp_path / "procedure" / pid).mkdir(parents=True)
            (tmp_path / "procedure" / pid / "0000000000.commit").write_bytes(b"")
        for ended_ms, outcome in ((1_700_000_000_000, "failed"), (1_700_000_009_000, "done")):
            record = {"id": pid, "type_name": "t", "parent_id": None, "outcome": outcome,
                      "ended_at": "2023-11-14T22:13:20.000Z"}  # fmt: skip
            (tmp_path / "history" / f"{ended_ms}-{pid}.json").write_text(json.dumps(record))
    async with Client(str(tmp_path)) as client:
        assert [s.status for s in await client.list()] == ["done", "done", "done"]
        assert (await client.get(ids[0])).status == "done"


def _at_its_last_commit(root: Path, pid: str, *ends: str | None) -> None:
    """`pid`'s folder holding only its `.commit`, and the end record of each run in `ends`
    (run 1 first): an outcome, or None for a record torn in its write."""
    (root / "procedure" / pid).mkdir(parents=True)
    (root / "procedure" / pid / "0000000000.commit").write_bytes(b"")
    _recorded(root, pid, *ends)


def _recorded(root: Path, pid: str, *ends: str | None) -> None:
    """The end record of each of `pid`'s runs in `ends` (run 1 first): an outcome, or None
    for a record torn in its write."""
    (root / "history").mkdir(exist_ok=True)
    for run, outcome in enumerate(ends, start=1):
        record = {"id": pid, "type_name": "t", "parent_id": None, "outcome": outcome, "run": run,
                  "ended_at": "2023-11-14T22:13:20.000Z"}  # fmt: skip
        text = "{torn" if outcome is None else json.dumps(record)
        (root / "history" / f"{pid}.{run:010d}.json").write_text(text)


async def test_folders_at_their_last_commit_read_the_newest_record_that_can_be_read(tmp_path: Path) -> None:
    """Each id's newest end record torn (`{torn`): a folder at its last `.commit` reads as
    the run below it, whether one folder is read (`find_newest_run`) or many from one
    listing of the history (they read as no record: `done` by their keys)."""
    for i in range(2):
        _at_its_last_commit(tmp_path, str(uuid.UUID(int=(1 << 100) + i, version=4)), "failed", "cancelled", None)
    async with Client(str(tmp_path)) as client:
        assert [s.status for s in await client.list()] == ["cancelled", "cancelled"]


async def test_a_folder_at_its_last_commit_reads_past_a_record_that_cannot_be_read(tmp_path: Path) -> None:
    """Run 2's end record torn, run 3's whole: one folder at its last `.commit` reads as run
    3's end, as many read at once do (it stopped at run 2 and read as run 1's)."""
    pid = str(uuid.UUID(int=1 << 100, version=4))
    _at_its_last_commit(tmp_path, pid, "failed", None, "cancelled")
    async with Client(str(tmp_path)) as client:
        assert (await client.get(pid)).status == "cancelled"
        assert [s.status for s in await client.list()] == ["cancelled"]


async def test_an_id_of_no_folder_lists_as_its_newest_record_that_can_be_read(tmp_path: Path) -> None:
    """Its keys gone, run 2's end record torn: the id lists as run 1's end, as `get` reads
    it (list read the newest record alone and left the id out)."""
    pid = str(uuid.UUID(int=1 << 100, version=4))
    _recorded(tmp_path, pid, "failed", None)
    async with Client(str(tmp_path)) as client:
        assert ((await client.get(pid)).status, (await client.get(pid)).run) == ("failed", 1)
        assert [(s.status, s.run) for s in await client.list()] == [("failed", 1)]
