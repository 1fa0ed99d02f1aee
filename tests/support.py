"""What many test modules share: store targets, their parametrisation, and the one factory
of managers for tests.

Fixtures live in `conftest.py` (pytest finds them there); the factories that build
fixtures and managers live here, so that no test module carries its own copy.
"""

from __future__ import annotations

import asyncio
import os
import random
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pytest

from procstore import Procedure, ProcedureManager, ProcedureWithId
from procstore.store import StateStore, open_state_store
from procstore.testing import Armed, Process, ProcessStore, kill_manager
from tests.procedures import register_all


@dataclass(frozen=True)
class StoreTarget:
    """A store URL and the storage options that reach it."""

    kind: str
    url: str
    storage_options: dict[str, Any] = field(default_factory=dict)


# Backends that need a server get a marker of their own, so that `-m "not s3 and not gcs"`
# is a quick run on this machine alone.
SERVER_KINDS = frozenset({"s3", "gcs"})


def store_targets(*kinds: str, doc: str = "The same test on each of these stores.") -> Any:
    """A fixture parametrised over `kinds` (`memory`, `local`, `s3`, `gcs`, `wrapped`).

    Each parameter resolves the `{kind}_target` fixture of `conftest.py`, and carries the
    `s3` or `gcs` marker when it needs that server.
    """
    params = [pytest.param(kind, marks=[getattr(pytest.mark, kind)] if kind in SERVER_KINDS else []) for kind in kinds]

    @pytest.fixture(params=params)
    def target(request: pytest.FixtureRequest) -> Any:
        return request.getfixturevalue(f"{request.param}_target")

    target.__doc__ = doc
    return target


FAST = {"retry_delay": 0.001, "max_retry_delay": 0.005}
"""Retry delays of milliseconds: a test that retries does not wait."""


def manager_for(
    store: StoreTarget | StateStore | str | os.PathLike[str],
    *procedures: type[Procedure],
    register: Callable[[ProcedureManager], object] | None = None,
    storage_options: dict[str, Any] | None = None,
    **options: Any,
) -> ProcedureManager:
    """A manager on `store` (a `StoreTarget` brings its storage options) whose retries wait
    milliseconds unless `options` say otherwise, with every procedure of `tests/procedures.py`
    registered, then `procedures`, then whatever `register(manager)` adds (machines whose
    loaders need a world)."""
    if isinstance(store, StoreTarget):
        storage_options = {**store.storage_options, **(storage_options or {})}
        store = store.url
    manager = register_all(ProcedureManager(store, storage_options, **{**FAST, **options}))
    for procedure in procedures:
        manager.register(procedure)
    if register is not None:
        register(manager)
    return manager


def put_now(url: str, key: str, value: bytes, storage_options: dict[str, Any] | None = None) -> None:
    """Write one key from synchronous test code (a store prepared by hand, say)."""

    async def write() -> None:
        store = open_state_store(url, storage_options)
        try:
            await store.put(key, value)
        finally:
            await store.close()

    asyncio.run(write())


async def killed_before_its_end_record(
    store: StateStore, procedure: ProcedureWithId, *types: type[Procedure], then: Callable[[], Any] | None = None
) -> None:
    """Run `procedure` on a manager of `store` whose process dies right before it writes an end
    record (between a root's `.commit` and its record): what a leader killed there leaves for
    the next manager. `then`, if given, is awaited once the procedure runs (a cancel, say)."""
    leader = Process("leader", [], random.Random(0))
    leader.armed.append(Armed("crash_before", 1, match="history/"))
    manager = ProcedureManager(ProcessStore(store, leader), request_poll_interval=0.05)
    for procedure_type in types:
        manager.register(procedure_type)
    await manager.start()
    await manager.submit(procedure)
    if then is not None:
        await asyncio.sleep(0.1)
        await then()
    for _ in range(500):
        if leader.dead:
            break
        await asyncio.sleep(0.01)
    await kill_manager(manager)
    assert leader.dead, "the manager never reached an end record"
