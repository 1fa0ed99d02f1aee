"""Planted bugs the explorer's newer modes must find, with reports that name the cause:
a step that survives a replay whole but not from its middle (crash points), and a
rollback that breaks only from some steps (rollback from every step)."""

from __future__ import annotations

import asyncio
import json
import uuid
from typing import Any, ClassVar

import pytest

from procstore import Context, Procedure, ProcedureManager, ProcedureWithId, Status
from procstore.store import StateStore, open_state_store
from procstore.testing import CrashExplorer, CrashPoint, FaultyStore, Scenario, SimulatedCrash, crash_at

FILES: dict[str, str] = {}
"""A tiny file system outside the store: path -> content ("" for a folder)."""


class Publish(Procedure):
    """One step: make a temp folder, write into it, rename it into place.

    The planted bug: `mkdir` that fails if the folder exists. Replayed whole, the step is
    fine (the rename took the folder away); replayed from its middle, it is not.
    """

    type_name = "tests::Publish"
    careful: ClassVar[bool] = False

    def __init__(self, data: dict[str, Any]) -> None:
        self.data = data

    async def execute(self, ctx: Context) -> Status:
        tmp, final = f"tmp/{self.data['name']}", f"site/{self.data['name']}"
        if tmp in FILES and not self.careful:
            raise FileExistsError(tmp)
        FILES[tmp] = ""
        await ctx.crash_point("after-mkdir")
        FILES[f"{tmp}/index.html"] = "hello"
        await ctx.crash_point("after-write")
        FILES[final] = FILES.pop(f"{tmp}/index.html")
        FILES.pop(tmp, None)
        return Status.done()

    def dump(self) -> str:
        return json.dumps(self.data)

    @classmethod
    def load(cls, data: str) -> Publish:
        return cls(json.loads(data))


class Careful(Publish):
    careful = True


class Publishing(Scenario):
    def __init__(self, cls: type[Publish]) -> None:
        self.cls = cls
        self.name = cls.__name__

    async def prepare(self, store: StateStore) -> None:
        FILES.clear()

    def attach(self, manager: ProcedureManager, store: StateStore) -> None:
        manager.register_loader(Publish.type_name, self.cls.load)

    async def procedures(self, store: StateStore) -> list[ProcedureWithId]:
        return [ProcedureWithId.new(self.cls({"name": "docs"}))]

    async def snapshot(self, store: StateStore) -> object:
        return dict(FILES)


def fresh(n: int) -> str:
    return f"memory://modes-{uuid.uuid4().hex}/"


async def test_a_crash_inside_a_step_finds_a_step_that_only_replays_whole() -> None:
    report = await CrashExplorer(Publishing(Publish), fresh).explore()
    assert not report.ok
    said = str(report)
    assert "crash point 'after-mkdir' of procedure" in said
    assert "FileExistsError: tmp/docs" in said  # the cause, with its traceback
    assert "Traceback" in said and "replay: await explorer.explore(only=[CrashPoint(" in said
    (await CrashExplorer(Publishing(Careful), fresh).explore(double_execution=True)).assert_ok()


async def test_a_crash_point_kills_a_live_manager_in_any_test() -> None:
    url = fresh(0)
    FILES.clear()
    store = FaultyStore(open_state_store(url), faults=[crash_at("after-write")])
    manager = ProcedureManager(store)
    manager.register(Careful)
    await manager.start()
    procedure = ProcedureWithId.new(Careful({"name": "live"}))
    await manager.submit(procedure)
    await asyncio.wait_for(store.crashed.wait(), 5)
    assert FILES == {"tmp/live": "", "tmp/live/index.html": "hello"}  # killed mid-step
    await manager.stop()
    async with ProcedureManager(url) as restarted:
        restarted.register(Careful)
    async with ProcedureManager(url) as again:
        again.register(Careful)
    assert "site/live" not in FILES or FILES["site/live"] == "hello"
    with pytest.raises(SimulatedCrash):
        await store.crash_point("x")  # the crashed store stays dead


BUILT: dict[str, int] = {}


class Build(Procedure):
    """Three steps: create a, b and c. Its rollback deletes them.

    The planted bug: from step 1 (only `a` built) the rollback deletes `b` with `del`,
    which fails since `b` was never built. From every other step it works, crashes in it
    included.
    """

    type_name = "tests::Build"
    rollback_supported = True
    careful: ClassVar[bool] = False

    def __init__(self, at: int = 0) -> None:
        self.at = at

    async def execute(self, ctx: Context) -> Status:
        BUILT["abc"[self.at]] = 1
        self.at += 1
        return Status.done() if self.at == 3 else Status.executing()

    async def rollback(self, ctx: Context) -> None:
        BUILT.pop("a", None)
        BUILT.pop("c", None)
        if self.careful or self.at != 1:
            BUILT.pop("b", None)
        else:
            del BUILT["b"]

    def dump(self) -> str:
        return json.dumps(self.at)

    @classmethod
    def load(cls, data: str) -> Build:
        return cls(json.loads(data))


class CarefulBuild(Build):
    careful = True


class Building(Scenario):
    def __init__(self, cls: type[Build]) -> None:
        self.cls = cls
        self.name = cls.__name__

    async def prepare(self, store: StateStore) -> None:
        BUILT.clear()

    def attach(self, manager: ProcedureManager, store: StateStore) -> None:
        manager.register_loader(Build.type_name, self.cls.load)

    async def procedures(self, store: StateStore) -> list[ProcedureWithId]:
        return [ProcedureWithId.new(self.cls())]

    async def snapshot(self, store: StateStore) -> object:
        return dict(BUILT)


async def test_rollback_from_every_step_finds_a_rollback_that_breaks_from_one_step_only() -> None:
    explorer = CrashExplorer(Building(Build), fresh, manager_options={"max_retry_times": 1})
    report = await explorer.explore(rollback_from_every_step=True)
    broken = {f.point.fail_at for f in report.failures}
    assert broken == {1}, str(report)  # failing the second attempt, at step 1: `b` was never built
    said = str(report)
    assert "failure injected at attempt 1" in said and "replay:" in said and "fail_at=1" in said
    ok = await CrashExplorer(Building(CarefulBuild), fresh).explore(rollback_from_every_step=True)
    ok.assert_ok()
    assert ok.explored > 3 * 2  # every attempt, and crashes around each rollback's writes


async def test_a_failure_replays_alone() -> None:
    explorer = CrashExplorer(Building(Build), fresh, manager_options={"max_retry_times": 1})
    report = await explorer.explore(only=[CrashPoint(-1, "before", fail_at=1)])
    assert report.explored == 1 and len(report.failures) == 1


async def test_a_store_that_is_not_empty_is_refused() -> None:
    url = fresh(0)
    store = open_state_store(url)
    await store.put("leftover", b"x")
    with pytest.raises(ValueError, match="not empty"):
        await CrashExplorer(Publishing(Careful), lambda n: url).explore()
