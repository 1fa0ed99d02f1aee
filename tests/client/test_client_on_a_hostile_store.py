"""`Client` reads a store an attacker with write access prepared (`write_hostile_store`):
every listed procedure is answered, none is an internal error."""

from __future__ import annotations

import contextlib
from pathlib import Path

from procstore import Client, ProcedureError
from procstore.store import open_state_store
from procstore.testing import write_hostile_store


async def test_list_and_get_answer_every_procedure_of_a_hostile_store(tmp_path: Path) -> None:
    store = open_state_store(str(tmp_path))
    hostile = await write_hostile_store(store)
    async with Client(store) as client:
        listed = await client.list(limit=10_000)
        assert {s.id for s in listed} >= set(hostile.procedures)
        for status in listed:
            try:
                got = await client.get(status.id)
            except ProcedureError:
                continue  # refused with a reason is an answer
            assert got.id == status.id
            with contextlib.suppress(ProcedureError):  # a refusal with a reason is an answer
                await client.result(status.id)
        assert await client.history(limit=10_000) is not None
    await store.close()
