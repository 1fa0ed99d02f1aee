"""The output of `Status.done(output=...)` is kept with the end record, size-limited, and
served by `Client.result`; an output history cannot keep never fails the procedure."""

from __future__ import annotations

import asyncio
import uuid
from typing import ClassVar

import pytest

from procstore import (
    Client,
    Context,
    InvalidProcedureId,
    Procedure,
    ProcedureFailed,
    ProcedureWithId,
    ResultNotKept,
    Status,
)
from procstore.store.history import OUTPUT_LIMIT
from procstore.testing import MemoryStore
from tests.procedures import World
from tests.runtime.helpers import steps
from tests.runtime.test_operations import failed_and_kept, manager_on
from tests.support import StoreTarget, killed_before_its_end_record, manager_for, store_targets

target = store_targets("memory", "local", "s3")


class Answers(Procedure):
    """Done at once with the output its data names."""

    type_name = "tests::Answers"
    outputs: ClassVar[dict[str, object]] = {
        "dict": {"rows": [1, 2, 3], "name": "é"},
        "large": "x" * (OUTPUT_LIMIT + 1),
        "not json": object(),
        "none": None,
    }

    def __init__(self, which: str) -> None:
        self.which = which

    async def execute(self, ctx: Context) -> Status:
        return Status.done(output=self.outputs[self.which])

    def dump(self) -> str:
        return self.which

    @classmethod
    def load(cls, data: str) -> Answers:
        return cls(data)


async def run_to_end(target: StoreTarget, which: str) -> tuple[ProcedureWithId, object]:
    procedure = ProcedureWithId.new(Answers(which))
    async with manager_for(target, Answers) as manager:
        output = await (await manager.submit(procedure)).wait()
    return procedure, output


async def test_a_done_output_is_kept_and_served_after_the_manager_stopped(target: StoreTarget) -> None:
    procedure, output = await run_to_end(target, "dict")
    async with Client(target.url, target.storage_options) as client:
        assert await client.result(procedure.id) == output == {"rows": [1, 2, 3], "name": "é"}
        (record,) = await client.history(procedure_id=procedure.id)
        assert record.output is not None and record.output_not_kept is None


@pytest.mark.parametrize(("which", "why"), [("large", "above the"), ("not json", "not JSON-serialisable")])
async def test_an_output_history_cannot_keep_is_said_and_the_procedure_is_done_anyway(
    target: StoreTarget, which: str, why: str
) -> None:
    procedure, output = await run_to_end(target, which)
    assert output is Answers.outputs[which], "the in-process watcher still gets the output"
    async with Client(target.url, target.storage_options) as client:
        assert (await client.get(procedure.id)).status == "done"
        with pytest.raises(ResultNotKept, match=why):
            await client.result(procedure.id)


async def test_no_output_is_none(target: StoreTarget) -> None:
    procedure, _ = await run_to_end(target, "none")
    async with Client(target.url, target.storage_options) as client:
        assert await client.result(procedure.id) is None


async def test_the_result_of_a_failed_procedure_raises_its_stored_error(target: StoreTarget) -> None:
    async with manager_on(target.url, storage_options=target.storage_options, keep_failed=True) as manager:
        pid, name = await failed_and_kept(manager)
    async with Client(target.url, target.storage_options) as client:
        status = await client.get(pid)
        assert (status.status, status.is_ended, status.outcome) == ("failed", True, "failed")
        with pytest.raises(ProcedureFailed, match=f"{name} broke at step 2"):
            await client.result(pid)
        with pytest.raises(ProcedureFailed, match=f"{name} broke at step 2"):
            await client.wait(pid, timeout=5)


async def test_list_filters_and_pages_by_id(target: StoreTarget) -> None:
    world = World.new()
    async with manager_for(target) as manager:
        ids = []
        for _ in range(5):
            procedure = steps(world, 1)
            await (await manager.submit(procedure)).wait()
            ids.append(str(procedure.id))
        ids.sort()
        async with Client(target.url, target.storage_options) as client:
            first = await client.list(limit=2)
            assert [str(s.id) for s in first] == ids[:2]
            rest = await client.list(after=first[-1].id, limit=10)
            assert [str(s.id) for s in rest] == ids[2:]
            assert await client.list(after=rest[-1].id) == []
            assert [str(s.id) for s in await client.list(id_prefix=ids[3][:8])] == [ids[3]]
            assert len(await client.list(status="done", type_name="test::Steps")) == 5
            assert await client.list(status=["unfinished", "failed"]) == []
            assert await client.list(type_name="test::Other") == []


async def test_ids_that_are_not_procedure_ids_are_refused() -> None:
    async with Client("memory://client-ids/") as client:
        with pytest.raises(InvalidProcedureId):
            await client.get("not-an-id")
        with pytest.raises(ValueError, match="limit"):
            await client.list(limit=0)


async def test_manager_resume_keeps_its_reason_in_the_new_runs_record(target: StoreTarget) -> None:
    from tests.runtime.test_operations import Flaky

    async with manager_on(target.url, storage_options=target.storage_options, keep_failed=True) as manager:
        pid, name = await failed_and_kept(manager)
        Flaky.broken.discard(name)
        await (await manager.resume(pid, reason="fixed the flaky dependency")).wait()
        await asyncio.sleep(0)
    async with Client(target.url, target.storage_options) as client:
        newest, older = await client.history(procedure_id=pid)
        assert newest.started is not None
        assert (newest.started.kind, newest.started.reason) == ("resume", "fixed the flaky dependency")
        assert older.started is not None and older.started.kind == "submit"
        with pytest.raises(TypeError):
            await manager.resume(pid, reason=42)  # type: ignore[arg-type]


async def test_a_nan_or_infinite_output_is_not_kept_and_says_why(target: StoreTarget) -> None:
    Answers.outputs["nan"] = {"x": float("nan")}
    Answers.outputs["inf"] = [1.0, float("-inf")]
    async with Client(target.url, target.storage_options) as client:
        for which in ("nan", "inf"):
            procedure, _ = await run_to_end(target, which)
            with pytest.raises(ResultNotKept, match="NaN or an infinity"):
                await client.result(procedure.id)
            (record,) = await client.history(procedure_id=procedure.id)
            assert record.output is None and record.output_not_kept is not None


@pytest.mark.parametrize("stored", ["not json", "[" * 2000 + "]" * 2000])
async def test_a_hand_written_output_that_is_not_json_is_not_kept(target: StoreTarget, stored: str) -> None:
    import msgspec

    from procstore.store.history import HistoryStore

    procedure, _ = await run_to_end(target, "dict")
    async with Client(target.url, target.storage_options) as client:
        (record,) = await client.history(procedure_id=procedure.id)
        history = HistoryStore(client._store.store)
        written = msgspec.structs.replace(record, output=stored)
        await history.store.put(history.key(record), msgspec.json.encode(written))
        with pytest.raises(ResultNotKept, match="cannot be read as JSON"):
            await client.result(procedure.id)


async def test_record_times_are_iso_8601_utc_with_z(target: StoreTarget) -> None:
    procedure, _ = await run_to_end(target, "none")
    async with Client(target.url, target.storage_options) as client:
        (record,) = await client.history(procedure_id=procedure.id)
    assert record.started is not None
    times = [record.started_at, record.ended_at, record.started.at]
    assert all(t is not None and t.endswith("Z") and "+" not in t for t in times), times


@pytest.mark.parametrize("which", ["dict", "none"])
async def test_a_record_written_from_keys_says_the_output_is_not_kept(which: str) -> None:
    """A leader killed between a root's `.commit` and its end record: the next manager's
    recovery writes the record from the keys, which hold no output. `Client.wait` answered
    None, as if the procedure had returned None."""
    inner = MemoryStore(f"record-from-keys-{uuid.uuid4().hex[:8]}")
    procedure = ProcedureWithId.new(Answers(which))
    await killed_before_its_end_record(inner, procedure, Answers)
    async with manager_for(inner, Answers), Client(inner) as client:
        with pytest.raises(ResultNotKept, match="written from its keys"):
            await asyncio.wait_for(client.wait(procedure.id), 10)
        (record,) = await client.history(procedure_id=procedure.id)
        assert (record.outcome, record.output) == ("done", None)
