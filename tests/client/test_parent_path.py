"""A `Client` reads the managers' keys under the same folder as they write them, however its
`parent_path` is spelt."""

from __future__ import annotations

import asyncio

import pytest
from click.testing import CliRunner

from procstore import Client, ProcedureManager
from procstore._cli.app import cli
from procstore.ids import ProcedureId
from procstore.testing import MemoryStore
from tests.procedures import World
from tests.runtime.helpers import steps


@pytest.mark.parametrize("parent_path", ["region-a", "region-a/", "a/b"])
async def test_a_client_finds_what_a_manager_ended_under_a_parent_path_without_a_slash(parent_path: str) -> None:
    """`parent_path="region-a"` is the folder `region-a/` for the manager: the client's
    history and activity reads go there too, not to `region-ahistory/`, where a procedure
    that ended (its keys deleted, its end record written) would be unknown to it."""
    name = f"parent-path-{ProcedureId.random()}"
    world = World.new()
    async with ProcedureManager(MemoryStore(name), parent_path=parent_path) as manager:
        handle = await manager.submit(steps(world, 2))
        await asyncio.wait_for(handle.wait(), 10)
    async with Client(MemoryStore(name), parent_path=parent_path) as client:
        assert (await client.get(handle.procedure_id)).status == "done"
        assert [record.id for record in await client.history()] == [str(handle.procedure_id)]


@pytest.mark.parametrize("parent_path", ["../outside", "a/../../b", "/abs", "./a", "a/./b", "/", "a/..", "a/../"])
def test_a_parent_path_outside_the_store_is_refused_before_anything_is_read(parent_path: str) -> None:
    """A `parent_path` with a leading `/`, or a `.` or `..` part, may name a folder outside the
    store: on a local directory, it would read and write outside it. The manager and
    the client raise `ValueError` where they are made, the CLI refuses it as a usage error."""
    with pytest.raises(ValueError, match="no folder inside the store"):
        ProcedureManager(MemoryStore(f"outside-{ProcedureId.random()}"), parent_path=parent_path)
    with pytest.raises(ValueError, match="no folder inside the store"):
        Client(MemoryStore(f"outside-{ProcedureId.random()}"), parent_path=parent_path)
    listed = CliRunner().invoke(cli, ["ls", "memory://outside/", "--parent-path", parent_path])
    assert listed.exit_code == 2 and "no folder inside the store" in listed.output, listed.output
