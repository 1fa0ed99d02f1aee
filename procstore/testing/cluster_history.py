"""The one place where a cluster simulation reads history records.

The checks compare history with the runs a simulation saw end, so they need the records
of each procedure in the order its runs ended. Only this function knows how records are
laid out in the store: when that layout changes, this is what changes with it.
"""

from __future__ import annotations

from procstore.store.history import HistoryRecord, HistoryStore
from procstore.store.keys import parent_folder
from procstore.store.state_store import StateStore


async def records_by_procedure(store: StateStore, parent_path: str = "") -> dict[str, list[HistoryRecord]]:
    """Every readable history record of `store`, grouped by procedure id, oldest end first."""
    grouped: dict[str, list[HistoryRecord]] = {}
    for record in await HistoryStore(store, parent_folder(parent_path)).list():
        grouped.setdefault(record.id, []).append(record)
    for records in grouped.values():
        records.sort(key=lambda r: r.ended_at)
    return grouped
