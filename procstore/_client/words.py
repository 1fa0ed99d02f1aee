"""The one vocabulary of status words: `Client`, `procstore ls`, `show` and `history` say
the same word for the same status.

Alive: `unfinished`, `rolling back`. Ended, the outcome (`procstore.store.history.Outcome`):
`done`, `failed`, `rolled back`, `cancelled`, `poisoned`. Nothing runs it: `unreadable` (its
latest value cannot be decoded), `parent cycle` (a corrupt store).
"""

from __future__ import annotations

from typing import Literal, get_args

from procstore.store.folder import StoredStatus

StatusWord = Literal[
    "unfinished", "rolling back", "done", "failed", "rolled back", "cancelled", "poisoned", "unreadable", "parent cycle"
]
"""A procedure's status (see above)."""

STATUS_WORDS: tuple[StatusWord, ...] = get_args(StatusWord)
"""Every status word, alive ones first (what the web view counts and filters by)."""

ENDED_WORDS: frozenset[str] = frozenset({"done", "failed", "rolled back", "cancelled", "poisoned"})

_BY_KEYS: dict[StoredStatus, StatusWord] = {
    StoredStatus.UNFINISHED: "unfinished",
    StoredStatus.ROLLING_BACK: "rolling back",
    # The keys alone do not tell a rolled-back end from a failure without rollback: its
    # history record does, where there is one.
    StoredStatus.COMMITTED: "done",
    StoredStatus.FAILED: "failed",
    StoredStatus.UNREADABLE: "unreadable",
    StoredStatus.PARENT_CYCLE: "parent cycle",
}


def status_word(status: StoredStatus) -> StatusWord:
    """The word for what a procedure's keys tell (`ls` and `Client` alike)."""
    return _BY_KEYS[status]
