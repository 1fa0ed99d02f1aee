"""Values from user code are checked where they enter (issue 32, item 12): an operator's
reason, what `dump()` returns, and ids made from odd strings."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import orjson
import pytest

from procstore import (
    Context,
    InvalidProcedureId,
    Procedure,
    ProcedureFailed,
    ProcedureId,
    ProcedureManager,
    ProcedureWithId,
    Status,
)
from tests.procedures import Parked
from tests.support import manager_for


class SurrogateDump(Procedure):
    """Its `dump()` returns text with a lone surrogate once it has run a step."""

    type_name = "values::SurrogateDump"

    def __init__(self, data: dict[str, Any]) -> None:
        self.data = data

    def dump(self) -> str:
        return "\ud800" if self.data.get("ran") else json.dumps(self.data)

    async def execute(self, ctx: Context) -> Status:
        self.data["ran"] = True
        return Status.executing()


class ListLockKey(Procedure):
    """Its `lock_key()` returns a list, not a `LockKey`."""

    type_name = "values::ListLockKey"

    def __init__(self, data: dict[str, Any]) -> None:
        self.data = data

    def dump(self) -> str:
        return json.dumps(self.data)

    def lock_key(self) -> Any:
        return ["table/42"]

    async def execute(self, ctx: Context) -> Status:
        return Status.done()


class DictDump(Procedure):
    """Its `dump()` returns a dict (not text) once it has run a step."""

    type_name = "values::DictDump"

    def __init__(self, data: dict[str, Any]) -> None:
        self.data = data

    def dump(self) -> Any:
        return dict(self.data) if self.data.get("ran") else json.dumps(self.data)

    async def execute(self, ctx: Context) -> Status:
        self.data["ran"] = True
        return Status.executing()


PROCEDURES = (DictDump, SurrogateDump, ListLockKey)


async def parked_until_stored(m: ProcedureManager) -> ProcedureId:
    pid = ProcedureId.random()
    await m.submit(ProcedureWithId(pid, Parked({})))
    while not (await m.store.procedure_keys(pid))[-1].step >= 1:
        await asyncio.sleep(0.005)
    return pid


async def test_a_cancel_with_no_reason_is_stored_as_text_and_honoured_after_a_restart(tmp_path: Path) -> None:
    async with manager_for(tmp_path, *PROCEDURES) as first:
        pid = await parked_until_stored(first)
        await first.cancel(pid, None)  # None: no reason given
    stored = orjson.loads((tmp_path / "requests" / f"{pid}.json").read_bytes())
    assert stored["reason"] == ""
    async with manager_for(tmp_path, *PROCEDURES) as second:
        watcher = second.procedure_watcher(pid)
        assert watcher is not None
        with pytest.raises(ProcedureFailed, match="cancelled by an operator"):
            await asyncio.wait_for(watcher.wait(), 10)


async def test_a_cancel_stored_with_a_null_reason_by_an_earlier_release_is_honoured(tmp_path: Path) -> None:
    async with manager_for(tmp_path, *PROCEDURES) as first:
        pid = await parked_until_stored(first)
    # What `cancel(id, None)` of the previous release wrote.
    stored = b'{"kind":"cancel","reason":null,"requested_at":1700000000.0,"requested_by":"ops@cp-1"}'
    (tmp_path / "requests").mkdir()
    (tmp_path / "requests" / f"{pid}.json").write_bytes(stored)
    async with manager_for(tmp_path, *PROCEDURES) as second:
        watcher = second.procedure_watcher(pid)
        assert watcher is not None
        with pytest.raises(ProcedureFailed, match="cancelled by an operator"):
            await asyncio.wait_for(watcher.wait(), 10)


async def test_a_cancel_whose_reason_is_not_text_is_refused_and_nothing_is_written(tmp_path: Path) -> None:
    async with manager_for(tmp_path, *PROCEDURES) as m:
        pid = await parked_until_stored(m)
        with pytest.raises(TypeError, match="reason"):
            await m.cancel(pid, {"why": "stuck"})  # type: ignore[arg-type]
        assert not (tmp_path / "requests" / f"{pid}.json").exists()


@pytest.mark.parametrize(
    ("procedure", "error"),
    [(DictDump, r"dump\(\) returned dict"), (SurrogateDump, r"dump\(\) returned text that is not valid Unicode")],
)
async def test_dump_returning_what_cannot_be_stored_fails_the_procedure_at_once_and_it_stays_loadable(
    tmp_path: Path, procedure: type[Procedure], error: str
) -> None:
    async with manager_for(tmp_path, *PROCEDURES, keep_failed=True) as m:
        watcher = await m.submit(ProcedureWithId.new(procedure({})))  # type: ignore[call-arg]
        with pytest.raises(ProcedureFailed, match=error):
            await asyncio.wait_for(watcher.wait(), 10)
        pid = watcher.procedure_id
    async with manager_for(tmp_path, *PROCEDURES, keep_failed=True) as again:
        assert again.recovery_problems == []  # every stored value is still readable
        assert [k.key_type.name for k in await again.store.procedure_keys(pid)] == ["STEP", "ROLLBACK", "COMMIT"]


async def test_a_submit_whose_dump_is_not_text_is_refused_and_nothing_is_written(tmp_path: Path) -> None:
    async with manager_for(tmp_path, *PROCEDURES) as m:
        pid = ProcedureId.random()
        with pytest.raises(TypeError, match=r"dump\(\) returned dict"):
            await m.submit(ProcedureWithId(pid, DictDump({"ran": True})))
        assert await m.store.procedure_keys(pid) == []


async def test_a_submit_whose_lock_key_is_not_a_lock_key_is_refused_and_nothing_is_written(tmp_path: Path) -> None:
    async with manager_for(tmp_path, *PROCEDURES) as m:
        pid = ProcedureId.random()
        with pytest.raises(TypeError, match=r"lock_key\(\) returned list"):
            await m.submit(ProcedureWithId(pid, ListLockKey({})))
        assert await m.store.procedure_keys(pid) == []


@pytest.mark.parametrize("text", ["../../outside", "A1B2", "", "12345678-1234-5678-1234-56781234567Z"])
def test_a_procedure_id_made_from_an_odd_string_is_refused(text: str) -> None:
    with pytest.raises(InvalidProcedureId):
        ProcedureId(text)  # type: ignore[arg-type]
