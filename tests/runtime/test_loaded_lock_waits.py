"""Procedures whose step may have run (loaded from the store, or with stored children) at
their lock waits, and parents of children whose end the store refused: the breaks a
hostile review found in the fixes of the cluster simulator's findings, each a scenario
through the public API on a local directory."""

from __future__ import annotations

import asyncio
import json
import logging
import re
from pathlib import Path
from typing import Any

import pytest

from procstore import (
    Context,
    EndNotRecorded,
    LockCycle,
    LockKey,
    Procedure,
    ProcedureError,
    ProcedureId,
    ProcedureManager,
    ProcedureWithId,
    Status,
    StringKey,
)
from procstore.errors import StoreError
from procstore.store import StateStore, WrappingStore, open_state_store
from procstore.store.message import ProcedureMessage

GATES: dict[str, asyncio.Event] = {}
EFFECTS: list[str] = []


class Step(Procedure):
    """data: locks (exclusive keys), gate (waited for in execute), child (a Step's data to
    suspend on once, with `child_id`), fail (raised), effect (noted when execute runs and
    when rollback undoes it)."""

    type_name = "loaded-lock-waits::Step"
    rollback_supported = True

    def __init__(self, data: dict[str, Any]) -> None:
        self.data = data

    def dump(self) -> str:
        return json.dumps(self.data)

    def lock_key(self) -> LockKey:
        return LockKey([StringKey.exclusive(k) for k in self.data.get("locks", [])])

    async def execute(self, ctx: Context) -> Status:
        if "effect" in self.data:
            EFFECTS.append(f"run {self.data['effect']}")
        if "gate" in self.data:
            await GATES.setdefault(self.data["gate"], asyncio.Event()).wait()
        if "fail" in self.data:
            raise RuntimeError(self.data["fail"])
        if (child := self.data.get("child")) is not None and not self.data.get("suspended"):
            self.data["suspended"] = True
            return Status.suspended([ProcedureWithId(ProcedureId.parse(self.data["child_id"]), Step(child))])
        return Status.done()

    async def rollback(self, ctx: Context) -> None:
        if "effect" in self.data:
            EFFECTS.append(f"undo {self.data['effect']}")


class Refusing(WrappingStore):
    """Refuses (`StoreError`) every write whose key matches one of `refused`."""

    def __init__(self, inner: StateStore) -> None:
        super().__init__(inner)
        self.refused: list[str] = []

    def around(self, kind: str, key: str, call: Any, value: bytes | None = None) -> Any:
        if kind.startswith("put") and any(re.search(p, key) for p in self.refused):

            async def refuse() -> Any:
                raise StoreError(f"access denied (test) {kind} {key}", key=key)

            return refuse()
        return call()


def pid(n: int) -> ProcedureId:
    return ProcedureId.parse(f"00000000-0000-4000-8000-{n:012d}")


async def stored(url: str, procedure_id: ProcedureId, data: dict[str, Any], step: int, parent: int = 0) -> None:
    """A step key as an earlier process left it."""
    store = open_state_store(url)
    message = ProcedureMessage(Step.type_name, json.dumps(data), pid(parent) if parent else None, step)
    assert await store.put_if_absent(f"procedure/{procedure_id}/{step:010d}.step", message.encode())
    await store.close()


def manager(store: str | StateStore, **options: Any) -> ProcedureManager:
    m = ProcedureManager(store, retry_delay=0.001, **options)
    m.register(Step)
    return m


async def parent_at_its_child(url: str, parent_locks: list[str], child_locks: list[str]) -> None:
    """Parent 1 at step 1, suspended on its stored child 2 at step 0."""
    await stored(url, pid(1), {"locks": parent_locks, "child": {}, "child_id": str(pid(2))}, 0)
    await stored(url, pid(1), {"locks": parent_locks, "child": {}, "child_id": str(pid(2)), "suspended": True}, 1)
    await stored(url, pid(2), {"locks": child_locks, "effect": "child"}, 0, parent=1)


@pytest.mark.timeout(30, method="signal")
async def test_a_loaded_child_whose_wait_closes_a_cycle_through_its_parent_fails_and_keeps_its_keys(
    tmp_path: Path,
) -> None:
    """Child 2 takes `a`, and its wait for `k` closes 2 -> X -> parent -> 2 (the parent holds
    `p` while it waits for its child). Giving `a` back cannot end that cycle: the child
    fails with LockCycle (`kept`) without a rollback, its keys kept, and the loop turns."""
    url = str(tmp_path)
    EFFECTS.clear()
    await parent_at_its_child(url, ["p"], ["a", "k"])
    await stored(url, pid(3), {"locks": ["a"], "gate": "y3"}, 0)
    async with manager(url) as m:
        await asyncio.sleep(0.2)  # the parent holds p, 3 holds a, the child waits for a
        x = await m.submit(ProcedureWithId(pid(4), Step({"locks": ["k", "p"]})))
        await asyncio.sleep(0.2)  # X holds k and waits for p
        GATES.setdefault("y3", asyncio.Event()).set()  # the child takes a: its wait for k closes the cycle
        await asyncio.wait_for(x.wait(), 5)
        state = m.procedure_state(pid(2))
        assert state is not None and isinstance(state.cause, LockCycle) and state.cause.kept, state
    assert "undo child" not in EFFECTS
    assert (tmp_path / "procedure" / str(pid(2))).exists()


@pytest.mark.timeout(30, method="signal")
async def test_a_loaded_child_that_needs_its_parents_lock_fails_without_freezing_the_manager(tmp_path: Path) -> None:
    url = str(tmp_path)
    await parent_at_its_child(url, ["p"], ["a", "p"])
    async with manager(url) as m:
        await asyncio.sleep(0.5)
        state = m.procedure_state(pid(2))
        assert state is not None and isinstance(state.cause, LockCycle), state


async def test_a_child_whose_final_commit_is_refused_stops_its_parent_unrecorded(tmp_path: Path) -> None:
    """The child rolls back, but the store refuses its `.commit`: the store says it is still
    rolling back, so the parent must not commit past it."""
    store = Refusing(open_state_store(str(tmp_path)))
    store.refused = [rf"procedure/{pid(2)}/.*\.commit"]
    async with manager(store, max_retry_times=1) as m:
        child = {"fail": "the child fails", "effect": "child"}
        watcher = await m.submit(ProcedureWithId(pid(1), Step({"child": child, "child_id": str(pid(2))})))
        with pytest.raises(EndNotRecorded):
            await asyncio.wait_for(watcher.wait(), 5)
        child_watcher = m.procedure_watcher(pid(2))
        assert child_watcher is not None
        with pytest.raises(EndNotRecorded):
            await child_watcher.wait()
    await store.close()


async def test_a_restart_of_a_parent_stopped_by_its_unrecorded_child_is_refused(tmp_path: Path) -> None:
    """A resume here would run the parent past its child (only the next start knows the
    child again from the store), and a rewind would create the child anew over its keys."""
    store = Refusing(open_state_store(str(tmp_path)))
    store.refused = [rf"procedure/{pid(2)}/.*\.rollback"]
    async with manager(store, max_retry_times=1) as m:
        child = {"fail": "the child fails", "effect": "child"}
        watcher = await m.submit(ProcedureWithId(pid(1), Step({"child": child, "child_id": str(pid(2))})))
        with pytest.raises(EndNotRecorded):
            await asyncio.wait_for(watcher.wait(), 5)
        for restart in (m.resume(pid(1)), m.rewind(pid(1), 0)):
            with pytest.raises(ProcedureError, match="restart the manager"):
                await restart
    await store.close()


async def test_a_request_that_waits_for_a_loaded_procedures_locks_is_logged(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    url = str(tmp_path)
    await stored(url, pid(1), {"locks": ["k"], "gate": "h1"}, 0)
    await stored(url, pid(2), {"locks": ["k"], "effect": "loaded"}, 0)
    async with manager(url, request_poll_interval=0.05) as m:
        await asyncio.sleep(0.2)  # 1 holds k; the loaded 2 waits for it
        with caplog.at_level(logging.WARNING, logger="procstore.runtime"):
            await m.cancel(pid(2), "not needed")
            await asyncio.sleep(0.2)
        assert any("honoured once it holds its locks" in r.getMessage() and str(pid(1)) in r.getMessage()
                   for r in caplog.records), [r.getMessage() for r in caplog.records]  # fmt: skip
        GATES.setdefault("h1", asyncio.Event()).set()
        watcher = m.procedure_watcher(pid(2))
        assert watcher is not None
        with pytest.raises(ProcedureError, match="not needed"):
            await asyncio.wait_for(watcher.wait(), 5)
