"""`Client` reads a store an attacker with write access prepared (`write_hostile_store`):
every listed procedure is answered, none is an internal error."""

from __future__ import annotations

import asyncio
import contextlib
import json
import sys
import uuid
from pathlib import Path
from typing import Any

from procstore import Client, ProcedureError, ProcedureId
from procstore.store import WrappingStore, open_state_store
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


async def test_folders_of_a_commit_alone_list_the_history_once_not_once_each(tmp_path: Path) -> None:
    """A folder holding only a `.commit` does not say which run ended, so its newest record
    is looked for: each such folder listed the whole history (a run 1 record missing), and
    `Client.list`, `procstore ls` and the web overview took folders x records. One listing
    of the history now, however many such folders (ended records still found)."""
    _folders_of_a_commit_alone(tmp_path, 30)
    recorded = str(uuid.UUID(int=(1 << 100) + 3, version=4))
    (tmp_path / "history").mkdir()
    record = {"id": recorded, "type_name": "t", "parent_id": None, "outcome": "cancelled", "run": 2,
              "ended_at": "2026-01-01T00:00:00.000Z"}  # fmt: skip
    (tmp_path / "history" / f"{recorded}.0000000002.json").write_text(json.dumps(record))
    counting = CountingHistoryListings(open_state_store(str(tmp_path)))
    async with Client(counting) as client:
        listed = await client.list(limit=100)
    assert len(listed) == 30 and {s.id: s.status for s in listed}[ProcedureId.parse(recorded)] == "cancelled"
    assert counting.history_listings <= 3, f"{counting.history_listings} listings of history for 30 folders"


async def test_a_list_read_a_chunk_at_a_time_lists_the_history_once(tmp_path: Path) -> None:
    """`Client.list` with a status no procedure has reads every chunk of 100: the folders of
    a `.commit` alone of each chunk looked for their records in a listing of the history of
    their own, chunks x records in all. One listing now, whatever the chunks."""
    _folders_of_a_commit_alone(tmp_path, 500)
    counting = CountingHistoryListings(open_state_store(str(tmp_path)))
    async with Client(counting) as client:
        assert await client.list(status="failed", limit=100) == []
    assert counting.history_listings <= 2, f"{counting.history_listings} listings of history for 5 chunks"


class CountingHistoryListings(WrappingStore):
    """Counts the listings of `history/`."""

    history_listings = 0

    def around(self, kind: str, key: str, call: Any, value: bytes | None = None) -> Any:
        if kind == "walk" and key.startswith("history/"):
            self.history_listings += 1
        return call()


def _folders_of_a_commit_alone(root: Path, count: int) -> None:
    """`count` procedure folders holding only a `.commit`, as a deletion leaves them at its end."""
    for i in range(count):
        pid = uuid.UUID(int=(1 << 100) + i, version=4)
        (root / "procedure" / str(pid)).mkdir(parents=True)
        (root / "procedure" / str(pid) / "0000000000.commit").write_bytes(b"")


async def test_a_request_time_no_calendar_holds_is_answered_without_a_time(tmp_path: Path) -> None:
    """An operator request and a resume nudge whose `requested_at` is 1e300 or -1e300 (any
    float is JSON): `Client.list` and `get`, `procstore show` and the web page raised
    `OverflowError` turning it into a date. They answer, the request's time unknown."""
    from click.testing import CliRunner
    from starlette.testclient import TestClient

    from procstore._cli.app import cli
    from procstore._web.app import create_app

    ids = ["aaaaaaaa-0000-4000-8000-000000000001", "aaaaaaaa-0000-4000-8000-000000000002"]
    for pid in ids:
        (tmp_path / "procedure" / pid).mkdir(parents=True)
        message = {"type_name": "t", "data": "{}", "parent_id": None, "step": 0}
        (tmp_path / "procedure" / pid / "0000000000.step").write_text(json.dumps(message))
    (tmp_path / "requests" / "resume").mkdir(parents=True)
    (tmp_path / "requests" / f"{ids[0]}.json").write_text('{"kind": "cancel", "reason": "r", "requested_at": 1e300}')
    nudge = '{"kind": "resume", "reason": "", "requested_at": -1e300, "step": 0}'
    (tmp_path / "requests" / "resume" / f"{ids[1]}.json").write_text(nudge)
    async with Client(str(tmp_path)) as client:
        listed = {str(s.id): s for s in await client.list()}
        got = [await client.get(pid) for pid in ids]
    assert [s.pending and s.pending.kind for s in got] == ["cancel", "resume"]
    assert all(s.pending is not None and s.pending.at is None for s in [*got, *listed.values()])

    def shown(pid: str) -> tuple[int, int]:
        with TestClient(create_app(str(tmp_path))) as web:
            return CliRunner().invoke(cli, ["show", str(tmp_path), pid]).exit_code, web.get(f"/p/{pid}").status_code

    for pid in ids:
        assert await asyncio.to_thread(shown, pid) == (0, 200)
