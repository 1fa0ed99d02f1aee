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
