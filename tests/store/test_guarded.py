"""`GuardedStore`: a write is checked before it starts and again right before it is sent."""

from __future__ import annotations

import pytest

from procstore import LeaseExpired
from procstore.store import open_state_store
from procstore.store.guarded import GuardedStore
from tests.support import StoreTarget, store_targets

server_target = store_targets("s3", "gcs")


class RefusesAtSend:
    """Allows the check before a write, refuses every later one: a lease that ran out while
    the request was being prepared (or while the process was paused right there)."""

    def __init__(self) -> None:
        self.calls: list[str] = []

    def __call__(self, key: str) -> None:
        self.calls.append(key)
        if len(self.calls) > 1:
            raise LeaseExpired(key, "cp-1", "it ran out while the request was being sent")


async def test_the_guard_is_asked_again_right_before_the_request_leaves(server_target: StoreTarget) -> None:
    store = open_state_store(server_target.url, server_target.storage_options)
    await store.check_access()
    guard = RefusesAtSend()
    try:
        with pytest.raises(LeaseExpired, match="ran out while the request was being sent"):
            await GuardedStore(store, guard).put_if_absent("procedure/p/0000000000.step", b"late")
        assert guard.calls[0] == "procedure/p/0000000000.step"
        assert "procedure/p/0000000000.step" in guard.calls[1]  # the request's URL
        assert await store.get("procedure/p/0000000000.step") is None  # nothing was sent
        await GuardedStore(store, lambda key: None).put_if_absent("procedure/p/0000000000.step", b"on time")
        assert await store.get("procedure/p/0000000000.step") == b"on time"
    finally:
        await store.close()
