"""Settings that guard evidence live in the store: every manager and the CLI obey them,
whatever each manager is started with."""

from __future__ import annotations

import asyncio
import json
import logging
from pathlib import Path

import pytest
from click.testing import CliRunner

from procstore import Client, History, ProcedureFailed, ResultNotKept, StoreSettings
from procstore._cli.app import cli
from procstore.store.local import LocalDirStore
from procstore.store.settings import KEEP_EVERYTHING, SettingsStore
from tests.procedures import World
from tests.runtime.helpers import steps
from tests.support import manager_for


async def test_a_manager_without_keep_failed_keeps_a_failed_root_the_store_says_to_keep(tmp_path: Path) -> None:
    await SettingsStore(LocalDirStore(tmp_path)).write(StoreSettings(keep_failed=True))
    async with manager_for(LocalDirStore(tmp_path), keep_failed=False) as manager:
        failing = steps(World.new(), 3, fail_at=1)
        with pytest.raises(ProcedureFailed):
            await (await manager.submit(failing)).wait()
    assert await LocalDirStore(tmp_path).walk(f"procedure/{failing.id}/")  # kept for a resume or a post-mortem
    async with Client(tmp_path) as client:
        assert (await client.get(failing.id)).status == "failed"


async def test_the_stores_result_limit_sizes_the_output_history_keeps(tmp_path: Path) -> None:
    await SettingsStore(LocalDirStore(tmp_path)).write(StoreSettings(result_limit=8))
    async with manager_for(LocalDirStore(tmp_path)) as manager:
        procedure = steps(World.new(), 1)
        assert await (await manager.submit(procedure)).wait() == "steps done"  # 12 bytes as JSON
    async with Client(tmp_path) as client:
        with pytest.raises(ResultNotKept, match="above the 8 bytes"):
            await client.result(procedure.id)


def test_the_store_keeps_history_at_least_as_long_and_as_large_as_it_says() -> None:
    stored = StoreSettings(history_retention=30 * 86400.0, history_max_records=50_000)
    assert stored.history(History(retention=60.0, max_records=10)) == History(30 * 86400.0, 50_000)
    assert stored.history(History(retention=90 * 86400.0, max_records=10)) == History(90 * 86400.0, 50_000)
    assert StoreSettings().history(History(60.0, 10)) == History(60.0, 10)


async def test_settings_a_bucket_writer_broke_are_read_as_keeping_everything(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    store = LocalDirStore(tmp_path)
    for junk in (b"\xff not json", b'{"keep_failed": "yes"}', b'{"history_retention": -1}', b"[]"):
        await store.put("settings.json", junk)
        with caplog.at_level(logging.ERROR, logger="procstore"):
            assert await SettingsStore(store).read() == KEEP_EVERYTHING
        assert "settings.json" in caplog.text and "procstore settings" in caplog.text
        caplog.clear()


def test_an_operator_writes_and_reads_the_settings_with_the_cli(tmp_path: Path) -> None:
    (tmp_path / "procedure").mkdir()
    runner = CliRunner()
    wrote = runner.invoke(cli, ["settings", str(tmp_path), "--keep-failed", "--history-retention", "30d"])
    assert wrote.exit_code == 0, wrote.output
    shown = json.loads(runner.invoke(cli, ["settings", str(tmp_path), "-o", "json"]).stdout)["settings"]
    assert shown["keep_failed"] is True and shown["history_retention"] == 30 * 86400.0 and shown["written_by"]
    unset = runner.invoke(cli, ["settings", str(tmp_path), "--unset", "history-retention", "-o", "json"])
    assert json.loads(unset.stdout)["settings"]["history_retention"] is None
    assert json.loads(unset.stdout)["settings"]["keep_failed"] is True  # the rest stays
    bad = runner.invoke(cli, ["settings", str(tmp_path), "--result-limit", "0"])
    assert bad.exit_code != 0 and "result-limit" in bad.output


async def test_a_folder_at_the_settings_key_keeps_everything_and_stops_nothing(tmp_path: Path) -> None:
    (tmp_path / "settings.json").mkdir()
    async with manager_for(LocalDirStore(tmp_path)) as manager:
        assert await (await manager.submit(steps(World.new(), 1))).wait() == "steps done"
    async with Client(tmp_path) as client:
        assert await client.settings() == KEEP_EVERYTHING


def test_a_retention_or_count_too_large_to_compute_with_is_refused(tmp_path: Path) -> None:
    (tmp_path / "procedure").mkdir()
    runner = CliRunner()
    for flags in (["--history-retention", "1000000w"], ["--history-max-records", str(10**30)]):
        refused = runner.invoke(cli, ["settings", str(tmp_path), *flags])
        assert refused.exit_code != 0 and "must be" in refused.output, refused.output
    assert not (tmp_path / "settings.json").exists()


async def test_a_standby_that_takes_over_obeys_settings_written_after_it_started(tmp_path: Path) -> None:
    from procstore import Lease
    from procstore.testing import kill_manager

    first = manager_for(LocalDirStore(tmp_path), lease=Lease(ttl=1.0, holder="a"), keep_failed=False)
    second = manager_for(LocalDirStore(tmp_path), lease=Lease(ttl=1.0, holder="b"), keep_failed=False)
    await first.start()
    await second.start()  # a standby
    await SettingsStore(LocalDirStore(tmp_path)).write(StoreSettings(keep_failed=True))
    await kill_manager(first)
    await first.stop()
    try:
        await asyncio.wait_for(second.wait_until_leading(), 20)
        failing = steps(World.new(), 3, fail_at=1)
        with pytest.raises(ProcedureFailed):
            await (await second.submit(failing)).wait()
        assert await LocalDirStore(tmp_path).walk(f"procedure/{failing.id}/")
    finally:
        await second.stop()
