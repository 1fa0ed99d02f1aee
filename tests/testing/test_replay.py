"""Upgrade safety: a store written by an older version of a procedure, replayed with new code."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from procstore import Context, Procedure, ProcedureManager, ProcedureWithId, Status
from procstore._cli.app import cli
from procstore.testing import export_snapshot, kill_manager, replay

GATE = asyncio.Event()


class ResizeV1(Procedure):
    """The old release: `{"size": n, "at": k}`; killed while waiting at step 1."""

    type_name = "cloud::Resize"

    def __init__(self, data: dict[str, Any]) -> None:
        self.data = data

    async def execute(self, ctx: Context) -> Status:
        if self.data["at"] == 1:
            await GATE.wait()  # never set: the old manager dies here
        self.data["at"] += 1
        return Status.done() if self.data["at"] == 3 else Status.executing()

    def dump(self) -> str:
        return json.dumps(self.data)


class ResizeV2(Procedure):
    """The new release reads the old data (a new field with a default)."""

    type_name = "cloud::Resize"

    def __init__(self, data: dict[str, Any]) -> None:
        self.data = {"unit": "GiB", **data}

    async def execute(self, ctx: Context) -> Status:
        self.data["at"] += 1
        return Status.done(f"{self.data['size']} {self.data['unit']}") if self.data["at"] == 3 else Status.executing()

    def dump(self) -> str:
        return json.dumps(self.data)

    @classmethod
    def load(cls, data: str) -> ResizeV2:
        return cls(json.loads(data))


class ResizeV2Broken(ResizeV2):
    """A new release that wrongly assumes a field old data does not have."""

    @classmethod
    def load(cls, data: str) -> ResizeV2Broken:
        return cls(json.loads(data))

    async def execute(self, ctx: Context) -> Status:
        self.data["region"].upper()  # KeyError on everything the old release wrote
        return await super().execute(ctx)


async def old_release_store(url: str) -> str:
    """A store the old release left with one procedure in flight."""
    manager = ProcedureManager(url)
    manager.register_loader(ResizeV1.type_name, lambda d: ResizeV1(json.loads(d)))
    await manager.start()
    procedure = ProcedureWithId.new(ResizeV1({"size": 100, "at": 0}))
    await manager.submit(procedure)
    await asyncio.sleep(0.1)
    await kill_manager(manager)
    await manager.stop()
    return str(procedure.id)


async def test_a_snapshot_of_an_older_release_replays_with_the_new_code(tmp_path: Path) -> None:
    url = str(tmp_path / "prod")
    pid = await old_release_store(url)
    snapshot = str(tmp_path / "prod.tar.gz")
    exported = await asyncio.to_thread(CliRunner().invoke, cli, ["export", url, snapshot])
    assert exported.exit_code == 0 and "wrote 2 keys" in exported.output, exported.output  # steps 0 and 1

    report = await replay(snapshot, lambda m: m.register(ResizeV2))
    report.assert_ok()
    assert report.done == [pid] and report.procedures == 1

    broken = await replay(snapshot, lambda m: m.register(ResizeV2Broken), manager_options={"max_retry_times": 0})
    assert not broken.ok and pid in broken.failed and "KeyError: 'region'" in broken.failed[pid]
    assert "Traceback" in broken.failed[pid] and "1 failed" in str(broken)

    unknown = await replay(url, lambda m: None)  # straight from the store, no loader at all
    assert [str(p.procedure_id) for p in unknown.not_loaded] == [pid]
    assert "could not be loaded" in str(unknown)
    # The real store was only read: the procedure is still there, unfinished.
    assert list((tmp_path / "prod" / "procedure" / pid).iterdir())


class StuckV1(ResizeV1):
    async def execute(self, ctx: Context) -> Status:
        if self.data["at"] == 1:
            await asyncio.Event().wait()  # an event of this test's loop (GATE is the first test's)
        return await super().execute(ctx)


async def _stuck_under(url: str, parent_path: str) -> ProcedureWithId:
    """A procedure stuck at its first step under `parent_path`, its manager killed (its keys
    stay as a crash leaves them)."""
    manager = ProcedureManager(url, parent_path=parent_path)
    manager.register_loader(ResizeV1.type_name, lambda d: StuckV1(json.loads(d)))
    await manager.start()
    procedure = ProcedureWithId.new(StuckV1({"size": 100, "at": 0}))
    await manager.submit(procedure)
    await asyncio.sleep(0.1)
    await kill_manager(manager)
    await manager.stop()
    return procedure


async def test_a_store_written_under_a_parent_path_replays_with_it_and_nothing_found_is_not_ok(
    tmp_path: Path,
) -> None:
    url = str(tmp_path / "prod")
    procedure = await _stuck_under(url, "cluster-a/")

    missed = await replay(url, lambda m: m.register(ResizeV2))  # looks under procedure/: nothing there
    assert missed.procedures == 0 and not missed.ok and "nothing was replayed" in str(missed)
    with pytest.raises(AssertionError, match="parent_path"):
        missed.assert_ok()
    found = await replay(url, lambda m: m.register(ResizeV2), parent_path="cluster-a/")
    found.assert_ok()
    assert found.done == [str(procedure.id)]


async def test_a_parent_path_without_a_slash_is_the_managers_folder_for_export_and_replay(tmp_path: Path) -> None:
    """`parent_path="cluster-a"` is the folder `cluster-a/` for the manager: `export_snapshot`
    (`procstore snapshot --parent-path cluster-a`) and `replay` read there too, not under
    `cluster-aprocedure/`, where they found nothing."""
    url = str(tmp_path / "prod")
    procedure = await _stuck_under(url, "cluster-a")

    snapshot = tmp_path / "snapshot.tar.gz"
    assert await export_snapshot(url, snapshot, parent_path="cluster-a") > 0
    for source, parent_path in ((str(snapshot), ""), (url, "cluster-a")):
        found = await replay(source, lambda m: m.register(ResizeV2), parent_path=parent_path)
        found.assert_ok()
        assert found.done == [str(procedure.id)]


class Child(Procedure):
    """The old release's child: child 1 is in flight when the old manager dies."""

    type_name = "cloud::Child"

    def __init__(self, data: dict[str, Any]) -> None:
        self.data = data

    async def execute(self, ctx: Context) -> Status:
        if self.data["n"] == 1:
            await asyncio.Event().wait()
        return Status.done()

    def dump(self) -> str:
        return json.dumps(self.data)


class Parent(Procedure):
    type_name = "cloud::Parent"

    def __init__(self, data: dict[str, Any]) -> None:
        self.data = data

    async def execute(self, ctx: Context) -> Status:
        if not self.data.get("spawned"):
            self.data["spawned"] = True
            return Status.suspended([ProcedureWithId.new(Child({"n": n})) for n in range(2)])
        return Status.done()

    def dump(self) -> str:
        return json.dumps(self.data)

    @classmethod
    def load(cls, data: str) -> Parent:
        return cls(json.loads(data))


class ChildV2(Child):
    async def execute(self, ctx: Context) -> Status:
        return Status.done()


class ChildV2Failing(Child):
    async def execute(self, ctx: Context) -> Status:
        raise ValueError("the new child cannot take over")


def strict_child(data: str) -> ChildV2:
    return ChildV2({"index": json.loads(data)["index"]})  # KeyError: old children have no index


async def test_a_child_that_cannot_load_or_fails_under_the_new_code_is_reported(tmp_path: Path) -> None:
    url = str(tmp_path / "prod")
    manager = ProcedureManager(url)
    manager.register(Parent)
    manager.register_loader(Child.type_name, lambda d: Child(json.loads(d)))
    await manager.start()
    await manager.submit(ProcedureWithId.new(Parent({})))
    await asyncio.sleep(0.2)
    await kill_manager(manager)
    await manager.stop()

    def attach(child_loader: Any) -> Any:
        return lambda m: (m.register(Parent), m.register_loader(Child.type_name, child_loader))

    (await replay(url, attach(lambda d: ChildV2(json.loads(d))), seconds_each=5)).assert_ok()

    not_loaded = await replay(url, attach(strict_child), seconds_each=5)
    assert not not_loaded.ok, str(not_loaded)
    [problem] = not_loaded.not_loaded
    assert problem.type_name == Child.type_name and problem.key.startswith(f"procedure/{problem.procedure_id}/")
    assert "KeyError: 'index'" in problem.reason

    failed = await replay(url, attach(lambda d: ChildV2Failing(json.loads(d))), seconds_each=5)
    assert not failed.ok and len(failed.failed) == 1, str(failed)
    [error] = failed.failed.values()
    assert "cloud::Child, a child of" in error and "ValueError: the new child cannot take over" in error
    assert "Traceback" in error


class Migrate(Procedure):
    """Fails at its second step in production; the old release's rollback never ends."""

    type_name = "cloud::Migrate"
    rollback_supported = True
    rollback_works: bool = False

    def __init__(self, data: dict[str, Any]) -> None:
        self.data = data

    async def execute(self, ctx: Context) -> Status:
        if self.data["at"] == 0:
            self.data["at"] = 1
            return Status.executing()
        raise RuntimeError("quota exceeded")

    async def rollback(self, ctx: Context) -> None:
        if self.rollback_works:
            return
        if self.data.get("v2"):
            raise KeyError("the new code's rollback is broken")
        await GATE.wait()  # never set: the old manager dies here

    def dump(self) -> str:
        return json.dumps(self.data)


class MigrateV2(Migrate):
    rollback_works = True


class MigrateV2Broken(Migrate):
    def __init__(self, data: dict[str, Any]) -> None:
        super().__init__({**data, "v2": True})


async def test_a_procedure_already_rolling_back_in_the_snapshot_is_not_a_failure(tmp_path: Path) -> None:
    url = str(tmp_path / "prod")
    manager = ProcedureManager(url)
    manager.register_loader(Migrate.type_name, lambda d: Migrate(json.loads(d)))
    await manager.start()
    procedure = ProcedureWithId.new(Migrate({"at": 0}))
    await manager.submit(procedure)
    await asyncio.sleep(0.2)
    await kill_manager(manager)
    await manager.stop()
    pid = str(procedure.id)

    report = await replay(url, lambda m: m.register_loader(Migrate.type_name, lambda d: MigrateV2(json.loads(d))))
    assert report.ok and not report.failed, str(report)
    assert list(report.rolled_back_as_before) == [pid] and "quota exceeded" in report.rolled_back_as_before[pid]
    assert "already failing in the snapshot; rollback completed" in str(report)

    broken = await replay(
        url, lambda m: m.register_loader(Migrate.type_name, lambda d: MigrateV2Broken(json.loads(d))), seconds_each=5
    )
    assert not broken.ok and pid in broken.failed and "rollback failed" in broken.failed[pid], str(broken)


def test_whether_a_failure_predates_the_snapshot_is_told_by_keys_and_history_not_text() -> None:
    """A procedure is failing in the snapshot only if its latest key is a `.rollback` (a
    rewound one keeps an old `.rollback` below newer steps)."""
    from procstore.testing.replay import _rolling_back

    keys = [
        "procedure/a/0000000000.step",
        "procedure/a/0000000001.rollback",
        "procedure/b/0000000000.step",
        "procedure/b/0000000001.rollback",
        "procedure/b/0000000002.commit",
        "procedure/b/0000000003.step",
        "procedure/stray",
    ]
    assert _rolling_back(keys) == {"a"}
