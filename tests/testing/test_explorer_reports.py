"""Regressions from a hostile review of the explorer: what it reports, and what it leaves open."""

from __future__ import annotations

from procstore.store import StateStore
from procstore.testing import CrashExplorer
from tests.testing.test_explorer import Deposits, memory_url


class Counting(CrashExplorer):
    """Records every store the explorer opens itself, and which of them it closed."""

    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self.opened: list[StateStore] = []
        self.closed: list[StateStore] = []

    def _store(self, url: str) -> StateStore:
        store = super()._store(url)
        close = store.close

        async def closing() -> None:
            self.closed.append(store)
            await close()

        store.close = closing  # type: ignore[method-assign]
        self.opened.append(store)
        return store


async def test_every_store_the_explorer_opens_is_closed() -> None:
    """An S3 store holds a client session: one not closed is an "Unclosed client session"."""
    explorer = Counting(Deposits(idempotent=True), memory_url)
    (await explorer.explore(double_execution=True)).assert_ok()
    assert explorer.opened and [s for s in explorer.opened if s not in explorer.closed] == []
