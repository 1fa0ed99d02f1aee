"""Who leads a store's managers, as its stored lease says: for `procstore lease`, the web
view and `Client` (which never takes the lease, only reads it)."""

from __future__ import annotations

import time

from procstore._runtime.lease import LEASE_KEY, LeaseRecord
from procstore.errors import StoreError
from procstore.store.message import UNDECODABLE
from procstore.store.procedure_store import ProcedureStore


def lease_state(record: LeaseRecord, age: float | None) -> tuple[str, str]:
    """`held`, `released` or `expired`, and what a standby would conclude, from the
    record and its age on this machine's clock."""
    if record.released:
        return "released", "released: the next manager to look takes over"
    if age is None:
        return "held", "held (time of the last renewal unknown)"
    if age > record.ttl:
        return "expired", f"expired: not renewed for {age:.1f} s > ttl {record.ttl:g} s; a standby takes over"
    return "held", f"held (renewed {age:.1f} s ago)"


async def read_lease(store: ProcedureStore) -> tuple[str, bytes | None, float | None]:
    """The lease's key, its bytes (None if absent) and the store's modification time."""
    key = f"{store.parent_path}{LEASE_KEY}"
    modified = await store.store.walk_modified(key.rsplit("/", 1)[0] + "/")
    return key, await store.store.get(key), modified.get(key)


async def no_manager_leads(store: ProcedureStore) -> bool:
    """Whether the store's lease says that no manager leads it now: released, or not
    renewed within its TTL (the store's clock against this machine's). False where nothing
    tells: no lease key (managers without `lease=` keep none), or one that cannot be read."""
    try:
        _, raw, modified = await read_lease(store)
        if raw is None:
            return False
        record = LeaseRecord.decode(raw)
    except (StoreError, *UNDECODABLE, ValueError):
        return False
    age = None if modified is None else max(0.0, time.time() - modified)
    return lease_state(record, age)[0] != "held"
