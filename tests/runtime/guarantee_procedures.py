"""Procedures for the review's reproductions: a table whose region child may fail and be
retried, a procedure whose dump() differs on every call, and a store-wrapping fault that
loses a commit's answer."""

from __future__ import annotations

import itertools
from typing import Any

from procstore import Context, ProcedureId, ProcedureWithId, Status
from procstore.errors import StoreError
from procstore.store.state_store import StateStore
from procstore.store.wrapping import WrappingStore
from tests.procedures import JsonProcedure

_COUNTER = itertools.count()


class Region(JsonProcedure):
    """Creates region `name` (step 0), then fails at step 1 if `fail`; rollback deletes it."""

    type_name = "review::Region"
    rollback_supported = True

    async def execute(self, ctx: Context) -> Status:
        at = self.data.get("at", 0)
        if at == 0:
            self.world.apply(f"region/{self.data['name']}")
            self.data["at"] = 1
            return Status.executing()
        if self.data.get("fail"):
            raise ValueError(f"region {self.data['name']} failed")
        return Status.done()

    async def rollback(self, ctx: Context) -> None:
        self.world.counts[f"rollback/{self.data['name']}/{self.data['attempt']}"] += 1
        self.world.undo(f"region/{self.data['name']}")


class Table(JsonProcedure):
    """Creates region r1 through a child; if that child fails, retries with a second one."""

    type_name = "review::Table"

    def _region(self, attempt: int, fail: bool) -> ProcedureWithId:
        pid = ProcedureId.parse(self.data["children"][attempt])
        data = {"world": self.data["world"], "name": "r1", "fail": fail, "attempt": attempt}
        return ProcedureWithId(pid, Region(data))

    async def execute(self, ctx: Context) -> Status:
        stage = self.data.get("stage", 0)
        if stage == 0:
            self.data["stage"] = 1
            return Status.suspended([self._region(0, fail=True)])
        if stage == 1:
            first = ctx.provider.procedure_state(ProcedureId.parse(self.data["children"][0]))
            assert first is not None and first.is_failed(), first
            self.data["stage"] = 2
            return Status.suspended([self._region(1, fail=False)])
        return Status.done("table created")

    @classmethod
    def new(cls, world_name: str) -> ProcedureWithId:
        children = [str(ProcedureId.random()), str(ProcedureId.random())]
        return ProcedureWithId.new(cls({"world": world_name, "children": children}))


class Stamped(JsonProcedure):
    """Two persisted steps; dump() carries a counter, so no two calls give the same bytes."""

    type_name = "review::Stamped"

    async def execute(self, ctx: Context) -> Status:
        at = self.data.get("at", 0)
        self.world.apply(f"stamped/{at}")
        self.data["at"] = at + 1
        return Status.done() if at + 1 >= 2 else Status.executing()

    def dump(self) -> str:
        return super().dump()[:-1] + f', "dumped": {next(_COUNTER)}}}'


class LostCommit(WrappingStore):
    """The first `.commit` create lands but its answer is lost; every later one fails.

    With `reads_fail`, reading the commit key back fails too.
    """

    def __init__(self, inner: StateStore, *, reads_fail: bool = False) -> None:
        super().__init__(inner)
        self.reads_fail = reads_fail
        self.commit_attempts = 0

    async def put_if_absent(self, key: str, value: bytes) -> bool:
        if not key.endswith(".commit"):
            return await self.inner.put_if_absent(key, value)
        self.commit_attempts += 1
        if self.commit_attempts == 1:
            await self.inner.put_if_absent(key, value)
        raise StoreError(f"connection reset writing {key}", key=key)

    async def get(self, key: str) -> bytes | None:
        if self.reads_fail and key.endswith(".commit"):
            raise StoreError(f"503 reading {key}", key=key)
        return await self.inner.get(key)


def json_data(**data: Any) -> dict[str, Any]:
    return data
