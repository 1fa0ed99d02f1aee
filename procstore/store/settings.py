"""Settings that guard evidence, kept in the store so that every manager and the CLI obey them.

A manager's own `keep_failed=False`, or a short history retention, would delete what an
operator keeps for a post-mortem: the failed roots of another manager started with
`keep_failed=True`, the history records of last week's incident. Written once by an operator
(`procstore settings URL --keep-failed ...`), outside `procedure/` so that GreptimeDB's
loader never sees it:

    {parent_path}settings.json   {"keep_failed":true,"history_retention":2592000.0,...}

Every manager reads it at each `start()`, and the store's word wins where it keeps more: a
manager keeps failed roots if either says so, and history for the longer retention and the
larger count; the store's `result_limit`, if set, is the size of the output history keeps.
A value that is not settings (anyone who can write the bucket can write anything) is read
as keeping everything, with an error naming the key: nothing is deleted that could matter.
"""

from __future__ import annotations

import math
import time
from datetime import UTC, datetime

import msgspec

from procstore._logs import get_logger
from procstore.errors import StoreError
from procstore.store.history import History
from procstore.store.keys import parent_folder
from procstore.store.message import UNDECODABLE
from procstore.store.requests import who
from procstore.store.state_store import StateStore

logger = get_logger("procstore.store")

MAX_RETENTION = 100 * 365 * 24 * 3600.0
"""The longest history retention a store may ask for: later times overflow clocks' arithmetic."""
MAX_COUNT = 10**9
"""The most records, or bytes of output, a store may ask to keep."""

SETTINGS_KEY = "settings.json"
"""The key under a store's root (after `parent_path`) that holds its `StoreSettings`."""


class StoreSettings(msgspec.Struct, frozen=True, kw_only=True):
    """What the store says every manager and the CLI must keep. None: each manager's own."""

    keep_failed: bool = False
    """Keep the keys of every root that ends failed (as `ProcedureManager(keep_failed=True)`)."""
    history_retention: float | None = None
    """Seconds history records are kept at least."""
    history_max_records: int | None = None
    """History records kept at least."""
    result_limit: int | None = None
    """Bytes of a done procedure's output (as JSON) its end record keeps; the manager's
    `History.output_limit` (`OUTPUT_LIMIT` by default) if None."""
    written_at: str = ""
    """ISO 8601 in UTC: when an operator wrote these."""
    written_by: str = ""
    """Who wrote them (`user@host`)."""

    def __post_init__(self) -> None:
        retention, records, limit = self.history_retention, self.history_max_records, self.result_limit
        if retention is not None and not (math.isfinite(retention) and 0 < retention <= MAX_RETENTION):
            raise ValueError(
                f"history_retention must be seconds in (0, {MAX_RETENTION:g}] (100 years), not {retention!r}"
            )
        for name, value in (("history_max_records", records), ("result_limit", limit)):
            if value is not None and not 1 <= value <= MAX_COUNT:
                raise ValueError(f"{name} must be in [1, {MAX_COUNT}], not {value!r}")

    def history(self, own: History) -> History:
        """A manager's `History`, kept at least as long and as large as the store says."""
        return History(
            retention=max(own.retention, self.history_retention or 0.0),
            max_records=max(own.max_records, self.history_max_records or 0),
            output_limit=own.output_limit if self.result_limit is None else self.result_limit,
        )


KEEP_EVERYTHING = StoreSettings(keep_failed=True, history_retention=10 * 365 * 24 * 3600.0, history_max_records=10**9)
"""What an unreadable settings key is read as: nothing that could matter is deleted."""

_decoder = msgspec.json.Decoder(StoreSettings)


class SettingsStore:
    """Reads and writes `{parent_path}settings.json` of a `StateStore`."""

    def __init__(self, store: StateStore, parent_path: str = "") -> None:
        self.store = store
        self.key = f"{parent_folder(parent_path)}{SETTINGS_KEY}"

    async def read(self) -> StoreSettings:
        """The store's settings: the defaults if none are stored; `KEEP_EVERYTHING` (logged,
        naming the key) for a value that is not settings."""
        try:
            raw = await self.store.get(self.key)
            if raw is None:
                return StoreSettings()
            return _decoder.decode(raw)
        except (*UNDECODABLE, ValueError, StoreError) as e:  # a folder there, a value not settings
            logger.error(
                "the store settings at %s cannot be read (%s): keeping every failed procedure and history record "
                "until an operator writes them again (procstore settings URL ...)",
                self.key,
                e,
            )
            return KEEP_EVERYTHING

    async def write(self, settings: StoreSettings) -> StoreSettings:
        """Store `settings`, stamped with who and when; returns what was stored."""
        stamped = msgspec.structs.replace(
            settings, written_at=datetime.fromtimestamp(time.time(), UTC).isoformat(), written_by=who()
        )
        await self.store.put(self.key, msgspec.json.encode(stamped))
        return stamped
