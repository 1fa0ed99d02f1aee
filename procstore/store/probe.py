"""`probe_conditional_writes`: try a store's create-only write and compare-and-swap for real.

A backend's flags (`supports_create_only`, `supports_compare_and_swap`) say what its protocol
promises. The server behind it can still ignore the preconditions: the GCS emulator does,
and so do some S3-compatible stores and older proxies. Then every conditional write "wins",
two managers can both believe they lead, and step keys can be overwritten. A manager that
relies on conditional writes (`lease=`) therefore tries them on a scratch key before it
takes part.
"""

from __future__ import annotations

import uuid

from procstore._logs import get_logger
from procstore.errors import StoreError
from procstore.store.state_store import StateStore

logger = get_logger("procstore.store")


class ConditionalWritesIgnored(StoreError):
    """The store accepted a conditional write it should have refused (`key` is the scratch key)."""


async def probe_conditional_writes(store: StateStore, folder: str) -> None:
    """Create, re-create, swap and stale-swap a scratch key under `folder`, then delete it.

    Six requests. Raises `ConditionalWritesIgnored` naming what the store accepted that it
    should have refused, or the `StoreError` of a request that failed (a denied write, say).
    """
    key = f"{folder}probe-{uuid.uuid4().hex}.json"

    def expect(held: bool, otherwise: str) -> None:
        if not held:
            raise ConditionalWritesIgnored(f"{store.url}{key}: {otherwise}", key=key)

    try:
        expect(await store.put_if_absent(key, b'{"probe":1}'), "a create-only write of a new key was refused")
        expect(
            not await store.put_if_absent(key, b'{"probe":2}'),
            "a create-only write replaced an existing object (the store ignores If-None-Match / ifGenerationMatch=0)",
        )
        found = await store.get_versioned(key)
        expect(found is not None and found[0] == b'{"probe":1}', f"read back {found!r} after a create")
        assert found is not None
        expect(
            await store.put_if_version(key, b'{"probe":3}', found[1]),
            "a compare-and-swap on the current version was refused",
        )
        expect(
            not await store.put_if_version(key, b'{"probe":4}', found[1]),
            "a compare-and-swap on a replaced version was accepted (the store ignores If-Match / ifGenerationMatch)",
        )
    finally:
        try:
            await store.delete(key)
        except StoreError as e:  # a scratch key left behind is harmless
            logger.warning("could not delete the probe key %s%s: %s", store.url, key, e)
