"""`Client` reads a store an attacker with write access prepared (`write_hostile_store`):
every listed procedure is answered, none is an internal error."""

from __future__ import annotations

import contextlib
import sys
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


async def test_get_is_linear_in_a_procedures_keys(tmp_path: Path) -> None:
    """A hostile writer's thousands of `.commit` keys in one folder: `get` reads the run's
    start in one pass over them (it was commits x keys). Counted in Python calls on the
    event loop's thread, the same on a busy machine as on a quiet one: ten times the keys
    is about ten times the calls (it was about a hundred)."""
    from procstore.store.message import ProcedureMessage

    async def calls(keys: int) -> int:
        folder = tmp_path / str(keys) / "procedure" / "0193e7a2-0000-7000-8000-000000000001"
        folder.mkdir(parents=True)
        for i in range(keys - 1):
            kind = "step" if i % 2 == 0 else "commit"
            value = ProcedureMessage("t::T", "{}", None, i).encode() if kind == "step" else b""
            (folder / f"{i:010d}.{kind}").write_bytes(value)
        made = 0

        def count(_frame: object, event: str, _arg: object) -> None:
            nonlocal made
            made += event == "call"

        async with Client(str(tmp_path / str(keys))) as client:
            sys.setprofile(count)
            try:
                status = await client.get("0193e7a2-0000-7000-8000-000000000001")
            finally:
                sys.setprofile(None)
        assert status.status == "unfinished"
        return made

    small, big = await calls(1_000), await calls(10_000)
    assert big / small < 20, f"{small} Python calls for 1,000 keys, {big} for 10,000"
