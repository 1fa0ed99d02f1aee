"""Procedures the tests run, and the `World` where they leave their effects.

Effects go to a `World` named in the procedure's data, so a procedure rebuilt by a new
manager after a crash reaches the same world. `World.counts` shows what ran twice.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Self

from procstore import (
    Context,
    LockKey,
    Procedure,
    ProcedureId,
    ProcedureManager,
    ProcedureWithId,
    RetryLater,
    Status,
    StringKey,
)

WORLDS: dict[str, World] = {}
BLOCKERS: dict[str, asyncio.Event] = {}
"""Events a `Steps` with `block` waits on before each step (to hold it mid-run)."""


@dataclass
class World:
    """The outside world procedures act on: a set of effects, and how often each was applied."""

    name: str
    effects: set[str] = field(default_factory=set)
    counts: Counter[str] = field(default_factory=Counter)
    log: list[str] = field(default_factory=list)

    @classmethod
    def new(cls) -> World:
        world = cls(f"world-{uuid.uuid4().hex}")
        WORLDS[world.name] = world
        return world

    def apply(self, effect: str) -> None:
        self.effects.add(effect)
        self.counts[effect] += 1
        self.log.append(effect)

    def undo(self, effect: str) -> None:
        self.effects.discard(effect)
        self.log.append(f"undo:{effect}")


class JsonProcedure(Procedure):
    """A procedure whose state is a JSON dict, with its world looked up by name."""

    def __init__(self, data: dict[str, Any]) -> None:
        self.data = data

    @property
    def world(self) -> World:
        return WORLDS[self.data["world"]]

    def dump(self) -> str:
        return json.dumps(self.data, sort_keys=True)


class CountingProcedure(Procedure):
    """A procedure whose state is one number, `n` (a subclass counts its steps with it)."""

    def __init__(self, n: int = 0) -> None:
        self.n = n

    def dump(self) -> str:
        return json.dumps(self.n)

    @classmethod
    def load(cls, data: str) -> Self:
        return cls(json.loads(data))


class Steps(JsonProcedure):
    """`steps` steps, each applying one effect; options make steps fail or retry.

    data: world, name, steps, at (next step), persist, fail_at (a step that raises),
    retry_at/retries (a step that raises RetryLater that many times), locks.
    """

    type_name = "test::Steps"

    async def execute(self, ctx: Context) -> Status:
        at = self.data.get("at", 0)
        name = self.data.get("name", "steps")
        if self.data.get("fail_at") == at:
            raise ValueError(f"{name} failed at step {at}")
        if self.data.get("retry_at") in (at, "all"):
            self.world.counts[f"{name}/attempts/{at}"] += 1
            if ctx.is_retrying:
                self.world.counts[f"{name}/is_retrying"] += 1
            if self.world.counts[f"{name}/attempts/{at}"] <= self.data.get("retries", 0):
                raise RetryLater(f"{name} not ready at step {at}")
        if self.data.get("block") and self.data.get("block_at", at) == at:
            if self.data.get("hold"):  # a request waits for the block's end
                with ctx.uninterruptible():
                    await BLOCKERS[self.data["block"]].wait()
            else:
                await BLOCKERS[self.data["block"]].wait()
        self.world.apply(f"{name}/{at}")
        self.data["at"] = at + 1
        if at + 1 >= self.data["steps"]:
            return Status.done(f"{name} done")
        return Status.executing(persist=self.data.get("persist", True))

    def lock_key(self) -> LockKey:
        return LockKey(
            [StringKey.exclusive(k) for k in self.data.get("exclusive", [])]
            + [StringKey.share(k) for k in self.data.get("share", [])]
        )


class Undoable(Steps):
    """`Steps` with rollback: undoes every effect it applied."""

    type_name = "test::Undoable"
    rollback_supported = True

    async def rollback(self, ctx: Context) -> None:
        name = self.data.get("name", "steps")
        self.world.counts[f"{name}/rollbacks"] += 1
        if self.world.counts[f"{name}/rollbacks"] <= self.data.get("rollback_failures", 0):
            raise RuntimeError(f"{name} rollback failed")
        for at in range(self.data.get("at", 0)):
            self.world.undo(f"{name}/{at}")
        self.world.apply(f"{name}/rolled-back")


class Child(JsonProcedure):
    """Two steps, each an effect named after the child."""

    type_name = "test::Child"

    async def execute(self, ctx: Context) -> Status:
        stage = self.data.get("stage", 0)
        self.world.apply(f"child/{self.data['name']}/{stage}")
        if self.data.get("fail"):
            raise ValueError(f"child {self.data['name']} failed")
        self.data["stage"] = stage + 1
        if stage + 1 >= 2:
            return Status.done(self.data["name"])
        return Status.executing()

    def lock_key(self) -> LockKey:
        return LockKey([StringKey.exclusive(k) for k in self.data.get("exclusive", [])])


class Parent(JsonProcedure):
    """prepare -> spawn children (ids kept in the state) -> join -> done.

    `join` re-suspends on any child the manager does not know: after a crash between the
    parent's persisted suspension and a child's first write, that child never existed.
    """

    type_name = "test::Parent"

    @classmethod
    def create(cls, world: World, names: list[str], **extra: Any) -> Parent:
        children = {name: str(ProcedureId.random()) for name in names}
        return cls({"world": world.name, "stage": "prepare", "children": children, **extra})

    def _children(self, only: set[str] | None = None) -> list[ProcedureWithId]:
        out = []
        for name, cid in sorted(self.data["children"].items()):
            if only is None or name in only:
                child_data = {"world": self.data["world"], "name": name, **self.data.get("child_extra", {})}
                out.append(ProcedureWithId(ProcedureId.parse(cid), Child(child_data)))
        return out

    async def execute(self, ctx: Context) -> Status:
        stage = self.data["stage"]
        if stage == "prepare":
            self.world.apply("parent/prepared")
            self.data["stage"] = "spawn"
            return Status.executing()
        if stage == "spawn":
            self.data["stage"] = "join"
            return Status.suspended(self._children())
        missing = {
            name
            for name, cid in self.data["children"].items()
            if ctx.provider.procedure_state(ProcedureId.parse(cid)) is None
        }
        if missing:
            return Status.suspended(self._children(missing))
        states = {
            name: ctx.provider.procedure_state(ProcedureId.parse(cid)) for name, cid in self.data["children"].items()
        }
        failed = sorted(name for name, st in states.items() if st is None or not st.is_done())
        if failed:
            raise RuntimeError(f"children failed: {failed}")
        self.world.apply("parent/joined")
        return Status.done("joined")

    def lock_key(self) -> LockKey:
        return LockKey([StringKey.exclusive(k) for k in self.data.get("exclusive", [])])


class Parked(JsonProcedure):
    """Persists one step, then waits in `execute` until its manager stops."""

    type_name = "test::Parked"

    async def execute(self, ctx: Context) -> Status:
        if not self.data.get("persisted"):
            self.data["persisted"] = True
            return Status.executing()
        await asyncio.Event().wait()
        return Status.done()


ALL = (Steps, Undoable, Child, Parent, Parked)


class LabelledSteps(Procedure):
    """A procedure whose data is `label:step`: the label (a fresh one per test) keys what the
    test records of it, the step counts its calls of `execute`. Subclasses say what a step does."""

    def __init__(self, data: str) -> None:
        self.label, step = data.split(":")
        self.step = int(step)

    def dump(self) -> str:
        return f"{self.label}:{self.step}"


def register_all(manager: ProcedureManager) -> ProcedureManager:
    for cls in ALL:
        manager.register(cls)
    return manager
