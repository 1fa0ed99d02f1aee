"""Publish a new version of a set of objects on object storage, then flip `current` to it.

Layout on the target store, for a publication `name`:

    {name}/versions/{version}/{path}   the objects of each version
    {name}/current                     {"version": "..."}: what readers should use

    Stage        write every object of the new version (overwriting is harmless)
    Verify       read them back and compare SHA-256 checksums (a mismatch re-stages)
    PrepareFlip  record which version is current now, and its store version token
    Flip         compare-and-swap `current` to the new version (If-Match on S3); if someone
                 else moved it meanwhile, go back to PrepareFlip
    CollectOld   delete the previous version's objects
    Published    done

Every step is idempotent; the state is persisted before the flip so that a replay knows
which version to collect. Rollback deletes the staged version unless `current` points at
it. The lock `publish/{name}` makes a second publish of the same name wait.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any

import orjson

from procstore import LockKey, Status, StringKey
from procstore.machine import MachineContext, State, StateMachine, StateRegistry
from procstore.store.state_store import StateStore

TYPE_NAME = "cloud::Publish"
registry = StateRegistry("publish_state", machine=TYPE_NAME)


@dataclass
class Publication:
    name: str
    version: str
    objects: dict[str, str]
    """Object path (relative to the version's folder) -> its SHA-256."""
    previous: str | None = None
    """The version that was current before the flip (set by PrepareFlip)."""
    current_token: str | None = None
    """The store's version token of `current` when PrepareFlip read it."""


@dataclass
class Target:
    """The volatile context: where to publish (`store`), and the build output to publish
    from (`source`, holding `{name}/{version}/{path}`). Only checksums are in the state."""

    store: StateStore
    source: StateStore


Ctx = MachineContext[Publication, Target]


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def version_key(name: str, version: str, path: str = "") -> str:
    return f"{name}/versions/{version}/{path}"


def current_key(name: str) -> str:
    return f"{name}/current"


async def read_current(store: StateStore, name: str) -> tuple[str | None, str | None]:
    """(the current version, its store version token); (None, None) before any publish."""
    found = await store.get_versioned(current_key(name))
    if found is None:
        return None, None
    value, token = found
    return str(orjson.loads(value)["version"]), token


@registry.state
@dataclass
class Stage(State[Ctx]):
    async def next(self, ctx: Ctx) -> tuple[State[Ctx], Status]:
        p, target = ctx.persistent, ctx.volatile
        for path, checksum in sorted(p.objects.items()):
            data = await target.source.get(f"{p.name}/{p.version}/{path}")
            if data is None or sha256(data) != checksum:
                raise RuntimeError(f"{p.name}@{p.version}: the build output of {path!r} is missing or changed")
            await target.store.put(version_key(p.name, p.version, path), data)
        return Verify(), Status.executing()


@registry.state
@dataclass
class Verify(State[Ctx]):
    async def next(self, ctx: Ctx) -> tuple[State[Ctx], Status]:
        p = ctx.persistent
        for path, checksum in sorted(p.objects.items()):
            stored = await ctx.volatile.store.get(version_key(p.name, p.version, path))
            if stored is None or sha256(stored) != checksum:
                return Stage(), Status.executing(persist=False)
        return PrepareFlip(), Status.executing(persist=False)


@registry.state
@dataclass
class PrepareFlip(State[Ctx]):
    async def next(self, ctx: Ctx) -> tuple[State[Ctx], Status]:
        p = ctx.persistent
        current, token = await read_current(ctx.volatile.store, p.name)
        if current != p.version:
            p.previous, p.current_token = current, token
        return Flip(), Status.executing()


@registry.state
@dataclass
class Flip(State[Ctx]):
    async def next(self, ctx: Ctx) -> tuple[State[Ctx], Status]:
        p, store = ctx.persistent, ctx.volatile.store
        pointer = orjson.dumps({"version": p.version})
        if await store.put_if_version(current_key(p.name), pointer, p.current_token):
            return CollectOld(), Status.executing()
        current, _ = await read_current(store, p.name)
        if current == p.version:  # our own flip, replayed after a crash
            return CollectOld(), Status.executing()
        # Someone else moved `current` since PrepareFlip: look again.
        return PrepareFlip(), Status.executing(persist=False)


@registry.state
@dataclass
class CollectOld(State[Ctx]):
    async def next(self, ctx: Ctx) -> tuple[State[Ctx], Status]:
        p, store = ctx.persistent, ctx.volatile.store
        if p.previous and p.previous != p.version:
            await store.batch_delete(await store.walk(version_key(p.name, p.previous)))
        return Published(), Status.executing(persist=False)


@registry.state
@dataclass
class Published(State[Ctx]):
    async def next(self, ctx: Ctx) -> tuple[State[Ctx], Status]:
        p = ctx.persistent
        return self, Status.done({"name": p.name, "version": p.version, "previous": p.previous})


class Publish(StateMachine[Publication, Target]):
    type_name = TYPE_NAME
    states = registry
    persistent_type = Publication
    rollback_supported = True

    @classmethod
    def initial_state(cls) -> State[Ctx]:
        return Stage()

    def lock_key(self) -> LockKey:
        return LockKey([StringKey.exclusive(f"publish/{self.persistent.name}")])

    async def rollback(self, ctx: Any) -> None:
        """Remove the staged version, unless it became current."""
        p, store = self.persistent, self.volatile.store
        current, _ = await read_current(store, p.name)
        if current != p.version:
            await store.batch_delete(await store.walk(version_key(p.name, p.version)))


def register(manager: Any, store: StateStore, source: StateStore) -> None:
    Publish.register_with(manager, lambda _p: Target(store, source))


async def new_publish(store: StateStore, source: StateStore, name: str, version: str) -> Publish:
    """A publish of everything under `{name}/{version}/` in `source`."""
    prefix = f"{name}/{version}/"
    paths = [k[len(prefix) :] for k in await source.walk(prefix)]
    values = await source.get_many([prefix + path for path in paths])
    objects = {path: sha256(v) for path, v in zip(paths, values, strict=True) if isinstance(v, bytes)}
    return Publish.create(Publication(name, version, objects), lambda _p: Target(store, source))
