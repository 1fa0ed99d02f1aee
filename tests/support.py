"""What many test modules share: store parametrisation and a manager tuned for tests.

Fixtures live in `conftest.py` (pytest finds them there); the factories that build
fixtures and managers live here, so that no test module carries its own copy.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import pytest

from procstore import ProcedureManager
from procstore.store import open_state_store
from procstore.store.state_store import StateStore

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


def fast_manager(
    store: StateStore | str,
    register: Callable[[ProcedureManager], object],
    storage_options: dict[str, Any] | None = None,
    **options: Any,
) -> ProcedureManager:
    """A manager whose retries wait milliseconds, with `register(manager)` already applied."""
    options = {"retry_delay": 0.001, "max_retry_delay": 0.01, **options}
    manager = ProcedureManager(store, storage_options, **options)
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
