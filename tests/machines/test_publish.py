"""Publishing on real object storage (S3 on a moto server; memory:// and local for crashes)."""

from __future__ import annotations

from pathlib import Path

import orjson
import pytest

from procstore import ProcedureManager, ProcedureWithId
from procstore.store import StateStore, open_state_store
from procstore.testing import CrashExplorer, FaultyStore
from procstore_machines.publish import Publish, new_publish, read_current, register
from procstore_machines.publish.machine import current_key
from tests.machines.scenarios import PublishV2, run_url
from tests.support import StoreTarget, manager_for


async def build(source: StateStore, name: str, version: str, files: dict[str, str]) -> None:
    for path, text in files.items():
        await source.put(f"{name}/{version}/{path}", text.encode())


def manager_on(
    procedures: StateStore | str, store: StateStore, source: StateStore, options: dict[str, str] | None = None
) -> ProcedureManager:
    return manager_for(
        procedures, register=lambda m: register(m, store, source), storage_options=options, max_retry_times=10
    )


async def test_publish_flip_and_collect_on_s3(s3_target: StoreTarget) -> None:
    site = open_state_store(s3_target.url + "site/", s3_target.storage_options)
    source = open_state_store(s3_target.url + "builds/", s3_target.storage_options)
    try:
        await build(source, "docs", "v1", {"index.html": "one", "css/a.css": "a"})
        await build(source, "docs", "v2", {"index.html": "two"})
        async with manager_on(s3_target.url + "procedures/", site, source, s3_target.storage_options) as manager:
            first = await manager.submit(ProcedureWithId.new(await new_publish(site, source, "docs", "v1")))
            assert await first.wait() == {"name": "docs", "version": "v1", "previous": None}
            second = await manager.submit(ProcedureWithId.new(await new_publish(site, source, "docs", "v2")))
            assert await second.wait() == {"name": "docs", "version": "v2", "previous": "v1"}
        assert (await read_current(site, "docs"))[0] == "v2"
        assert await site.walk("docs/") == ["docs/current", "docs/versions/v2/index.html"]
    finally:
        await site.close()
        await source.close()


async def test_second_publish_of_the_same_name_waits_on_the_lock(memory_target: StoreTarget) -> None:
    site = open_state_store(memory_target.url + "site/")
    source = open_state_store(memory_target.url + "builds/")
    for v in ("v1", "v2"):
        await build(source, "app", v, {"bin": v})
    procedures = FaultyStore(open_state_store(memory_target.url + "procedures/"))  # records every write, in order
    async with manager_on(procedures, site, source) as manager:
        a = await manager.submit(ProcedureWithId.new(await new_publish(site, source, "app", "v1")))
        b = await manager.submit(ProcedureWithId.new(await new_publish(site, source, "app", "v2")))
        assert (await a.wait(), await b.wait()) == (
            {"name": "app", "version": "v1", "previous": None},
            {"name": "app", "version": "v2", "previous": "v1"},
        )
    # b's first step after its submitted state waits for a's end: found by place in the record.
    keys = [op.key for op in procedures.ops if op.kind == "put_if_absent"]
    a_ended = next(
        i for i, k in enumerate(keys) if k.startswith(f"procedure/{a.procedure_id}/") and k.endswith(".commit")
    )
    b_stepped = keys.index(f"procedure/{b.procedure_id}/0000000001.step")
    assert a_ended < b_stepped, keys


async def test_a_competing_writer_makes_the_flip_retry(s3_target: StoreTarget) -> None:
    site = open_state_store(s3_target.url + "site/", s3_target.storage_options)
    source = open_state_store(s3_target.url + "builds/", s3_target.storage_options)
    try:
        await build(source, "docs", "v9", {"index.html": "nine"})
        await site.put(current_key("docs"), orjson.dumps({"version": "v1"}))
        original = site.put_if_version
        moved = False

        async def interfering(key: str, value: bytes, version: str | None) -> bool:
            nonlocal moved
            if not moved:  # another tool moves `current` just before our flip
                moved = True
                await site.put(current_key("docs"), orjson.dumps({"version": "v5"}))
            return await original(key, value, version)

        site.put_if_version = interfering  # type: ignore[method-assign]
        async with manager_on(s3_target.url + "procedures/", site, source, s3_target.storage_options) as manager:
            watcher = await manager.submit(ProcedureWithId.new(await new_publish(site, source, "docs", "v9")))
            assert await watcher.wait() == {"name": "docs", "version": "v9", "previous": "v5"}
        assert (await read_current(site, "docs"))[0] == "v9"
    finally:
        await site.close()
        await source.close()


def test_stored_form_keeps_checksums_not_bytes() -> None:
    machine = Publish.decode(
        '{"persistent_ctx":{"name":"docs","version":"v1","objects":{"a":"00"}},"state":{"publish_state":"Stage"}}'
    )
    assert machine[0].previous is None and machine[0].objects == {"a": "00"}


@pytest.mark.parametrize("kind", ["memory", "local"])
async def test_crash_at_every_store_operation(tmp_path: Path, kind: str) -> None:
    """Killed before and after every store operation (the machine's own and the world's)."""
    report = await CrashExplorer(PublishV2(), run_url(tmp_path, kind)).explore(double_execution=True)
    report.assert_ok()
    assert report.operations > 5
