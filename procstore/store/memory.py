"""`MemoryStore` (`memory://name/`): procstore's own in-memory store, for tests and the toolkit.

fsspec's memory:// scans every key it holds on each listing and each `find`, so a store
with many keys makes every operation slower (a persisted step cost 126 times a raw put at
10,000 keys). This one keeps a dict and a sorted index of its keys: a read or a write costs
a dict operation and O(log n) on the index, and listing a prefix costs O(log n + the keys
found), whatever else the store holds.

Semantics are memory://'s: keys live as long as the process, and every `MemoryStore` opened
on the same name (`memory://name/`) sees the same keys, so a "restarted" manager finds what the
"killed" one wrote. Create-only and compare-and-swap are atomic (within the process: the
only place the keys are). Each operation yields to the event loop once, as a real store's
request would, so concurrent procedures interleave; but a read of a missing key (a runner's
look for an operator request before every attempt, nearly always) is answered at once, as a
local directory answers it with a `stat`. Wrap it in `FaultyStore` for faults
and crashes.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence

from sortedcontainers import SortedList  # type: ignore[import-untyped]

from procstore.store.state_store import StateStore

SCHEME = "memory://"


class _Space:
    """The keys of one name: values, versions, modification times and a sorted index."""

    def __init__(self) -> None:
        self.values: dict[str, bytes] = {}
        self.versions: dict[str, int] = {}
        self.modified: dict[str, float] = {}
        self.index = SortedList()
        self.next_version = 0

    def write(self, key: str, value: bytes) -> None:
        if key not in self.values:
            self.index.add(key)
        self.values[key] = value
        self.next_version += 1
        self.versions[key] = self.next_version
        self.modified[key] = time.time()

    def remove(self, key: str) -> None:
        if self.values.pop(key, None) is not None:
            self.index.remove(key)
            self.versions.pop(key, None)
            self.modified.pop(key, None)

    def under(self, prefix: str) -> list[str]:
        keys: list[str] = []
        for key in self.index.irange(minimum=prefix):
            if not key.startswith(prefix):
                break
            keys.append(key)
        return keys


_SPACES: dict[str, _Space] = {}


class MemoryStore(StateStore):
    """Keys in this process's memory under `name`, shared by every store opened on it.

    As with a bucket, a path after the first part of `name` is a folder of it:
    `memory://app/tenant/` sees the keys `memory://app/` has under `tenant/`."""

    supports_create_only = True
    supports_compare_and_swap = True

    def __init__(self, name: str) -> None:
        name = name.strip("/")
        self.name = name
        self.url = f"{SCHEME}{name}/"
        space, _, folder = name.partition("/")
        self._space = _SPACES.setdefault(space, _Space())
        self._folder = f"{folder}/" if folder else ""
        """Prefixed to every key: this store's folder of its space."""

    def _key(self, key: str) -> str:
        return self._folder + key

    def _keys_under(self, prefix: str) -> list[str]:
        cut = len(self._folder)
        return [key[cut:] for key in self._space.under(self._folder + prefix)]

    @classmethod
    def from_url(cls, url: str) -> MemoryStore:
        return cls(url.split("://", 1)[1])

    @staticmethod
    def forget(name: str) -> None:
        """Drop every key of `name`'s space (tests that reuse a name start empty)."""
        _SPACES.pop(name.strip("/").partition("/")[0], None)

    async def put(self, key: str, value: bytes) -> None:
        await asyncio.sleep(0)
        self._space.write(self._key(key), bytes(value))

    async def put_if_absent(self, key: str, value: bytes) -> bool:
        await asyncio.sleep(0)
        if self._key(key) in self._space.values:
            return False
        self._space.write(self._key(key), bytes(value))
        return True

    async def get(self, key: str) -> bytes | None:
        if self._key(key) not in self._space.values:
            return None  # answered at once, as a local directory answers one (a `stat`)
        await asyncio.sleep(0)
        return self._space.values.get(self._key(key))

    async def get_versioned(self, key: str) -> tuple[bytes, str] | None:
        await asyncio.sleep(0)
        value = self._space.values.get(self._key(key))
        return None if value is None else (value, str(self._space.versions[self._key(key)]))

    async def put_if_version(self, key: str, value: bytes, version: str | None) -> bool:
        await asyncio.sleep(0)
        current = self._space.versions.get(self._key(key))
        if (None if current is None else str(current)) != version:
            return False
        self._space.write(self._key(key), bytes(value))
        return True

    async def get_many(self, keys: Sequence[str]) -> list[bytes | Exception | None]:
        await asyncio.sleep(0)
        return [self._space.values.get(self._key(key)) for key in keys]

    async def walk(self, prefix: str) -> list[str]:
        await asyncio.sleep(0)
        return self._keys_under(prefix)

    async def walk_modified(self, prefix: str) -> dict[str, float | None]:
        await asyncio.sleep(0)
        return {key: self._space.modified.get(self._key(key)) for key in self._keys_under(prefix)}

    async def batch_delete(self, keys: Sequence[str]) -> None:
        await asyncio.sleep(0)
        for key in keys:
            self._space.remove(self._key(key))

    async def delete(self, key: str) -> None:
        await asyncio.sleep(0)
        if not key.endswith("/"):  # folders are only prefixes here
            self._space.remove(self._key(key))

    async def check_access(self) -> None:
        await asyncio.sleep(0)
