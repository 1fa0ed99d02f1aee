"""What recovery builds lives as long as its procedures: the cyclic collector's young passes
do not scan it again and again (`procstore._bulk.collector_paused`), and objects a process
froze itself stay frozen."""

from __future__ import annotations

import asyncio
import gc
from collections.abc import Iterator
from pathlib import Path
from typing import ClassVar

import pytest

from procstore import Context, Procedure, ProcedureId, Status
from procstore.store.local import LocalDirStore
from tests.greptime import greptime_step
from tests.support import manager_for

_ID = "4f2a1c3e-8a47-4b1e-9d55-1c2b3d4e5f60"


class Held(Procedure):
    """Waits in its step until the test lets it go; remembers every instance loaded."""

    type_name = "test::Held"
    loaded: ClassVar[list[Held]] = []
    release: ClassVar[asyncio.Event | None] = None

    def __init__(self, data: object) -> None:
        self.data = data
        Held.loaded.append(self)

    async def execute(self, ctx: Context) -> Status:
        if Held.release is not None:
            await Held.release.wait()
        return Status.done()

    def dump(self) -> str:
        return "{}"


@pytest.fixture
def stored_procedure(tmp_path: Path) -> Iterator[LocalDirStore]:
    (tmp_path / "procedure" / _ID).mkdir(parents=True)
    for step in (0, 1):
        (tmp_path / "procedure" / _ID / f"{step:010d}.step").write_bytes(greptime_step(Held.type_name, "{}", step))
    Held.loaded = []
    Held.release = asyncio.Event()
    yield LocalDirStore(tmp_path)
    Held.release.set()


async def test_a_recovered_procedure_joins_the_oldest_generation(stored_procedure: LocalDirStore) -> None:
    gc.collect()
    async with manager_for(stored_procedure, Held) as manager:
        assert manager.procedure_watcher(ProcedureId.parse(_ID)) is not None
        (loaded,) = Held.loaded
        assert any(o is loaded for o in gc.get_objects(generation=2))
        assert Held.release is not None
        Held.release.set()


async def test_objects_the_process_froze_stay_frozen(stored_procedure: LocalDirStore) -> None:
    mine = [object()]  # a container, which the collector tracks
    gc.freeze()
    try:
        async with manager_for(stored_procedure, Held) as manager:
            assert manager.procedure_watcher(ProcedureId.parse(_ID)) is not None
            assert (loaded := Held.loaded)
            assert any(o is loaded[0] for o in gc.get_objects())  # what recovery built was not frozen
            assert not any(o is mine for o in gc.get_objects())  # and what the process froze still is
            assert Held.release is not None
            Held.release.set()
    finally:
        gc.unfreeze()
