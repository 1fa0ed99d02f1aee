"""A manager's settings: readable any time, changed only while it is not started."""

from __future__ import annotations

from pathlib import Path

import pytest

from procstore import ProcedureManager, SettingFrozen


async def test_a_setting_changed_after_start_is_refused_not_silently_ignored(tmp_path: Path) -> None:
    manager = ProcedureManager(str(tmp_path), keep_failed=False, metadata_ttl=5.0)
    manager.keep_failed = True  # before start: the term begins with it
    async with manager:
        with pytest.raises(SettingFrozen, match="keep_failed"):
            manager.keep_failed = False
        with pytest.raises(SettingFrozen, match="metadata_ttl"):
            manager.metadata_ttl = 0.0
        assert manager.keep_failed is True and manager.metadata_ttl == 5.0
    manager.metadata_ttl = 1.0  # stopped: the next start runs with it
    assert manager.metadata_ttl == 1.0


async def test_the_running_limit_can_be_raised_on_a_running_manager(tmp_path: Path) -> None:
    """`max_running_procedures` is read at each submit (as before the settings froze): an
    operator who meets `TooManyRunningProcedures` raises the limit and submits again."""
    from procstore import ProcedureWithId, TooManyRunningProcedures
    from tests.procedures import World
    from tests.runtime.helpers import steps
    from tests.support import manager_for

    world = World.new()
    async with manager_for(str(tmp_path), max_running_procedures=0) as manager:
        with pytest.raises(TooManyRunningProcedures):
            await manager.submit(steps(world, 1))
        manager.max_running_procedures = 5
        procedure: ProcedureWithId = steps(world, 1)
        await (await manager.submit(procedure)).wait()
