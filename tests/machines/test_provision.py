"""The provisioning example and the demo built on it."""

from __future__ import annotations

import json
from pathlib import Path

from procstore import ProcedureManager, ProcedureWithId
from procstore_machines.provision import CreateResource, ProvisionService, check_world


async def test_provision_a_service(tmp_path: Path) -> None:
    world = tmp_path / "world"
    manager = ProcedureManager(tmp_path / "store")
    manager.register(ProvisionService)
    manager.register(CreateResource)
    async with manager:
        watcher = await manager.submit(ProcedureWithId.new(ProvisionService.create(world, "web", ["db", "lb"])))
        sums = await watcher.wait()
    assert isinstance(sums, dict) and set(sums) == {"db", "lb"}
    assert check_world(world, {"web": ["db", "lb"]}) == []
    assert json.loads((world / "catalog" / "web.json").read_text())["state"] == "ready"


def test_check_world_reports_what_is_broken(tmp_path: Path) -> None:
    (tmp_path / "catalog").mkdir()
    (tmp_path / "catalog" / "web.json").write_text('{"state": "creating"}')
    broken = check_world(tmp_path, {"web": ["db"], "api": ["vm"]})
    assert any("web: catalog state is 'creating'" in b for b in broken)
    assert any("api: no catalog entry" in b for b in broken)
