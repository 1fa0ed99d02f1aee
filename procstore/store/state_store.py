"""`StateStore`: the key-value interface the procedure store is written against.

Keys are `/`-separated paths relative to the store's root (`procedure/<id>/0000000001.step`).
Every method is async; a backend over a blocking filesystem runs its calls in a thread and
waits for that thread even when cancelled, so nothing is written after the awaiting task
has been cancelled (see `procstore.aio.run_blocking`).
"""

from __future__ import annotations

import abc
from collections.abc import Sequence

from procstore.aio import gather_settled


class StateStore(abc.ABC):
    """Async key-value access to a store's objects.

    Errors: a missing key is `None` from `get` and ignored by the deletes; anything else
    raises `procstore.errors.StoreError` (or its subclass `StoreUnavailable`) naming the key.
    """

    url: str
    """Where the store lives, for messages (`s3://bucket/prefix/`, `/var/lib/cp/`)."""

    supports_create_only: bool = True
    """Whether `put_if_absent` is atomic (one winner among concurrent writers)."""

    @abc.abstractmethod
    async def put(self, key: str, value: bytes) -> None:
        """Write `value` under `key`, replacing any old value, atomically and durably."""

    @abc.abstractmethod
    async def put_if_absent(self, key: str, value: bytes) -> bool:
        """Create `key` with `value`; `False` (and nothing written) if the key exists."""

    @abc.abstractmethod
    async def get(self, key: str) -> bytes | None:
        """The value under `key`, or `None` if there is none."""

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

    @abc.abstractmethod
    async def batch_delete(self, keys: Sequence[str]) -> None:
        """Delete `keys`; the deletes are durable when this returns. Missing keys are fine."""

    @abc.abstractmethod
    async def delete(self, key: str) -> None:
        """Delete one key, or a folder (`key` ending in `/`) once it is empty."""

    async def check_access(self) -> None:
        """Raise `StoreUnavailable` if the store cannot be listed (wrong URL, no bucket...)."""
        await self.walk("")

    async def close(self) -> None:  # noqa: B027 - most backends hold nothing
        """Release connections. The store must not be used afterwards."""
