"""The recent starts of each rate-limited procedure type, stored so that a restart or a
takeover goes on counting them (`RateLimit`):

    {parent_path}flow/starts/{type_name, percent-encoded}.json
        [1700000000.5,1700000012.25]

the wall-clock times (epoch seconds, by the admitting manager's clock) of the type's first
starts in its last period. The manager that admits a start writes the list before the
procedure runs its first step; the next manager to admit one of that type reads it first.
A value that is not a list of numbers (a torn write, another writer) holds no starts.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from urllib.parse import quote

import msgspec

from procstore.store.message import UNDECODABLE
from procstore.store.state_store import StateStore

RATE_STARTS_PATH = "flow/starts/"
"""The folder of the stored starts, under a store's root."""


class RateStartsStore:
    """Reads and writes the recent starts of each type under `{parent_path}flow/starts/`."""

    def __init__(self, store: StateStore, parent_path: str = "") -> None:
        self.store = store
        self.prefix = f"{parent_path}{RATE_STARTS_PATH}"

    def key(self, type_name: str) -> str:
        return f"{self.prefix}{quote(type_name, safe='')}.json"

    async def get(self, type_name: str) -> list[float]:
        """The stored start times of `type_name` (none for a missing or unreadable value)."""
        raw = await self.store.get(self.key(type_name))
        if raw is None:
            return []
        try:
            times = msgspec.json.decode(raw, type=list[float])
        except (msgspec.ValidationError, *UNDECODABLE):
            return []
        return [t for t in times if math.isfinite(t)]

    async def put(self, type_name: str, times: Iterable[float]) -> None:
        await self.store.put(self.key(type_name), msgspec.json.encode(list(times)))
