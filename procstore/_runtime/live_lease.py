"""Why a manager without `lease=` refuses a store whose lease has a live holder.

Such a manager runs every procedure the store holds, the leader's included: each step
would run twice, and the two managers' identical bytes read as each one's own earlier
write, so fencing never notices. `start()` therefore looks at the lease first.

A lease is *live* when its holder is seen renewing it: stored records carry no wall-clock
time (no two machines' clocks are compared), so a record is judged as a standby judges
it. Released, or no lease object: not live, at once. Otherwise (unreadable records too)
the version is watched for the stored TTL times `1 + drift`: a change that is not a
release means a holder renews it (live, refused); none means its holder stopped renewing,
as a standby would then take it over (not live, the start goes on).
"""

from __future__ import annotations

import asyncio

from procstore._logs import get_logger
from procstore._runtime.lease import Lease, LeaseRecord
from procstore._runtime.lease_clock import LeaseClock
from procstore.errors import LeaseHeld
from procstore.store.state_store import StateStore

logger = get_logger("procstore.lease")

LOOKS_PER_TTL = 8
"""How often the lease is read while watched: a live holder renews four times a TTL."""


async def refuse_if_lease_is_live(store: StateStore, key: str, clock: LeaseClock | None = None) -> None:
    """Return once the lease at `key` is absent, released or expired; raise `LeaseHeld`
    (naming the key, the holder and what to do) if its holder renews it meanwhile.

    Waits up to the stored TTL times `1 + drift` for a lease left by a holder that did not
    release it (killed, say). Raises `StoreError` if the store cannot be read.
    """
    clock = clock or LeaseClock()
    found = await store.get_versioned(key)
    if found is None:
        return
    raw, version = found
    record = _decoded(raw)
    if record is not None and record.released:
        return
    ttl = record.ttl if record is not None else Lease().ttl
    watch = ttl * (1 + Lease().drift)
    logger.warning(
        "%s%s names %s and was not released: watching it for up to %.1fs, as a manager without `lease=` must not "
        "run while a leader renews it",
        store.url,
        key,
        record.holder if record is not None else "no readable holder",
        watch,
    )
    deadline = clock.now() + watch
    while (left := deadline - clock.now()) > 0:
        await asyncio.sleep(min(ttl / LOOKS_PER_TTL, left))
        found = await store.get_versioned(key)
        if found is None:
            return  # deleted by hand: nobody holds it
        raw, now_version = found
        if now_version == version:
            continue
        renewed = _decoded(raw)
        if renewed is not None and renewed.released:
            return
        raise _held(store, key, renewed)
    logger.info("%s%s was not renewed for %.1fs: its holder is gone; starting", store.url, key, watch)


def _decoded(raw: bytes) -> LeaseRecord | None:
    try:
        return LeaseRecord.decode(raw)
    except ValueError:
        return None  # a torn write: judged by whether its version changes, as a standby does


def _held(store: StateStore, key: str, record: LeaseRecord | None) -> LeaseHeld:
    holder = record.holder if record is not None else "an unreadable record"
    about = "" if record is None else f" (epoch {record.epoch}, ttl {record.ttl:g}s)"
    return LeaseHeld(
        f"{store.url}{key}: the lease of this store is held by {holder}{about}, which renewed it while this manager "
        "looked: a manager leads this store, and one without `lease=` would run its procedures a second time. "
        "Start this manager with a `lease=` (it then stands by and takes over when that leader stops), or stop "
        "that leader (a clean stop releases the lease at once; a killed one's expires a TTL after its last "
        "renewal) and start this one again",
        key=key,
        holder=holder,
    )
