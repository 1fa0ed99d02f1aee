"""`StateStore`: the key-value interface the procedure store is written against.

Keys are `/`-separated paths relative to the store's root (`procedure/<id>/0000000001.step`).
Every method is async; a backend over a blocking filesystem runs its calls in a thread and
waits for that thread even when cancelled, so nothing is written after the awaiting task
has been cancelled (see `procstore._aio.run_blocking`).
"""

from __future__ import annotations

import abc
import asyncio
import hashlib
import weakref
from collections.abc import Collection, Sequence

from procstore._aio import gather_settled
from procstore._logs import get_logger
from procstore.errors import ListingIncomplete
from procstore.ids import ProcedureId

logger = get_logger("procstore.store")

_unlisted_now: dict[tuple[str, str], set[str]] = {}
"""The folders each `walk_readable` (store URL, prefix) could not list last time: warned
about once while they stay so, and again if they come back after being listed."""


class StateStore(abc.ABC):
    """Async key-value access to a store's objects.

    Errors: a missing key is `None` from `get` and ignored by the deletes; anything else
    raises `procstore.errors.StoreError` (or its subclass `StoreUnavailable`) naming the key.
    """

    url: str
    """Where the store lives, for messages (`s3://bucket/prefix/`, `/var/lib/cp/`)."""

    supports_create_only: bool = True
    """Whether `put_if_absent` is atomic (one winner among concurrent writers)."""

    round_trips: bool = False
    """Whether every call is a network round trip (S3, GCS): a runner then looks for its
    operator request while its step's write is under way, not after it."""

    observes_crash_points: bool = False
    """Whether `crash_point` may do anything here. Where it does not (every backend, and
    the wrappers procstore adds for telemetry and the lease), a runner skips the call and
    its key: a step's crash points then cost nothing. True for a class that overrides
    `crash_point` (unless it says otherwise), and for a `WrappingStore` whose `around` is
    its own (`FaultyStore`, say), that overrides `crash_point`, or whose inner store observes
    them."""

    def __init_subclass__(cls, **kwargs: object) -> None:
        super().__init_subclass__(**kwargs)
        if "crash_point" in cls.__dict__ and "observes_crash_points" not in cls.__dict__:
            cls.observes_crash_points = True

    @abc.abstractmethod
    async def put(self, key: str, value: bytes) -> None:
        """Write `value` under `key`, replacing any old value, atomically and durably."""

    @abc.abstractmethod
    async def put_if_absent(self, key: str, value: bytes) -> bool:
        """Create `key` with `value`; `False` (and nothing written) if the key exists."""

    @abc.abstractmethod
    async def get(self, key: str) -> bytes | None:
        """The value under `key`, or `None` if there is none."""

    supports_compare_and_swap: bool = False
    """Whether `put_if_version` is atomic across processes (not only within this one)."""

    async def get_versioned(self, key: str) -> tuple[bytes, str] | None:
        """The value under `key` and an opaque version token for `put_if_version`."""
        value = await self.get(key)
        return None if value is None else (value, content_version(value))

    async def put_if_version(self, key: str, value: bytes, version: str | None) -> bool:
        """Compare-and-swap: write only if the key is still at `version` (`None`: absent).

        Returns False, writing nothing, if someone else changed it. The default compares
        content under a lock held in this process: atomic only among its own callers.
        """
        if version is None:
            return await self.put_if_absent(key, value)
        async with _CAS_LOCKS.setdefault(self, {}).setdefault(key, asyncio.Lock()):
            current = await self.get_versioned(key)
            if current is None or current[1] != version:
                return False
            await self.put(key, value)
            return True

    async def get_many(self, keys: Sequence[str]) -> list[bytes | Exception | None]:
        """The values of `keys`, in order; a failed read is returned as its exception."""

        async def one(key: str) -> bytes | Exception | None:
            try:
                return await self.get(key)
            except Exception as e:  # one unreadable value must not hide the others
                return e

        return await gather_settled(*(one(k) for k in keys))

    @abc.abstractmethod
    async def walk(self, prefix: str) -> list[str]:
        """Every key under `prefix` (recursively), sorted; always a fresh listing."""

    async def walk_modified(self, prefix: str) -> dict[str, float | None]:
        """Like `walk`, with each key's last-modified time (seconds since the epoch) where known."""
        return dict.fromkeys(await self.walk(prefix))

    @abc.abstractmethod
    async def batch_delete(self, keys: Sequence[str]) -> None:
        """Delete `keys`; the deletes are durable when this returns. Missing keys are fine.

        Raises `StoreError` unless every key is gone: a bulk request that reports some keys
        as not deleted (S3's DeleteObjects answers 200 with per-key errors) is a failure.
        """

    @abc.abstractmethod
    async def delete(self, key: str) -> None:
        """Delete one key, or a folder (`key` ending in `/`) once it is empty."""

    async def crash_point(self, key: str) -> None:  # noqa: B027 - a no-op but in tests
        """A place in a procedure's step where a test may kill the process (`Context.crash_point`).

        Nothing in production; `procstore.testing.FaultyStore` counts it as an operation, so
        the crash explorer kills runs there as it does around a store write.
        """

    async def delete_in_order(self, first: Sequence[str], then: Sequence[str], folder: str) -> None:
        """Delete `first` durably, then each key of `then` in its order, then `folder` once empty.

        `batch_delete` raises unless every key is gone, so no key is deleted while one
        before it remains. The caller promises that the last key of `then` and `folder`
        coming back after a crash is harmless (a procedure's `.commit` without its steps
        still reads as finished), so a store may skip making that last delete durable.
        Stops at the first error, keeping the order.
        """
        await self.batch_delete(first)
        for key in then:
            await self.batch_delete([key])
        await self.delete(folder)

    async def check_access(self) -> None:
        """Raise `StoreUnavailable` if the store cannot be listed (wrong URL, no bucket...)."""
        await self.walk("")

    async def close(self) -> None:  # noqa: B027 - most backends hold nothing
        """Release connections. The store must not be used afterwards."""


_CAS_LOCKS: weakref.WeakKeyDictionary[StateStore, dict[str, asyncio.Lock]] = weakref.WeakKeyDictionary()


def content_version(value: bytes) -> str:
    """A version token derived from the content (for stores without native versions).

    Writing the same bytes again keeps the version (an A-B-A change goes unseen), which is
    harmless when every write carries something new, such as a version number.
    """
    return hashlib.sha256(value).hexdigest()


async def walk_readable(store: StateStore, prefix: str) -> list[str]:
    """`store.walk(prefix)`; for folders below `prefix` it could not read
    (`ListingIncomplete`), the keys it did list, with one warning per folder while it stays
    unreadable. For folders looked at again and again (operator requests, history records),
    where a folder that cannot be read must not stop every look at the others."""
    try:
        keys, unlisted = await store.walk(prefix), {}
    except ListingIncomplete as e:
        keys, unlisted = sorted(e.listed), e.unlisted
    warned = _unlisted_now.get((store.url, prefix), set())
    for folder, why in sorted(unlisted.items()):
        if folder not in warned:
            logger.warning(
                "cannot list %s%s (%s): what it holds is left out until it can be read; fix its permissions",
                store.url,
                folder,
                why,
            )
    if unlisted or warned:
        _unlisted_now[(store.url, prefix)] = set(unlisted)
    return keys


class KeyPerProcedure:
    """A folder of one small key per procedure, `{prefix}{id}.json`, of a `StateStore`
    (operator requests, activities)."""

    def __init__(self, store: StateStore, prefix: str) -> None:
        self.store = store
        self.prefix = prefix

    def key(self, procedure_id: ProcedureId) -> str:
        return f"{self.prefix}{procedure_id}.json"

    async def stored_ids(self) -> set[ProcedureId]:
        """The procedures with a key, readable or not (one listing, no reads)."""
        listed = await walk_readable(self.store, self.prefix)
        ids = (ProcedureId.parse_canonical(k[len(self.prefix) : -len(".json")]) for k in listed)
        return {pid for pid in ids if pid is not None}

    async def delete(self, procedure_ids: Collection[ProcedureId]) -> None:
        """Delete the keys of `procedure_ids` (of procedures whose keys are gone)."""
        if procedure_ids:
            await self.store.batch_delete([self.key(pid) for pid in procedure_ids])
