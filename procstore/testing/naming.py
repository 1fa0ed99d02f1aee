"""Procedures named as a person reads them: by type, and a child by its parent too.

Ids are random and differ from run to run, so a report that says only "procedure 3f2a..."
leaves the reader to guess which one it was. A `FaultyStore` given a `ProcedureNames` reads
the type and parent off every step it is asked to write, the one a crash stops included.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from procstore.store.message import ProcedureMessage

_ID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")


@dataclass
class ProcedureNames:
    """Type and parent of every procedure a run's managers knew, by id (as a string)."""

    known: dict[str, tuple[str, str | None]] = field(default_factory=dict)

    def learn(self, key: str, value: bytes) -> None:
        """Read a procedure's type and parent off a step being written to `key`."""
        if not key.endswith(".step") or not (found := _ID.search(key)) or found[0] in self.known:
            return
        try:
            message = ProcedureMessage.decode(value)
        except Exception:  # a torn or foreign value names nothing
            return
        parent = None if message.parent_id is None else str(message.parent_id)
        self.known[found[0]] = (message.type_name, parent)

    def name(self, pid: str) -> str:
        """`procedure 3f2a... (tests::Child, child of tests::Parent 91bc...)`; the bare
        `procedure 3f2a...` if no manager of the run knew it."""
        if pid not in self.known:
            return f"procedure {pid}"
        type_name, parent = self.known[pid]
        if parent is None:
            return f"procedure {pid} ({type_name})"
        return f"procedure {pid} ({type_name}, child of {self.type_of(parent)} {parent})"

    def parent_of(self, pid: str) -> str | None:
        return self.known.get(pid, ("", None))[1]

    def type_of(self, pid: str) -> str:
        return self.known.get(pid, ("procedure", None))[0]


def without_ids(text: str) -> str:
    """`text` with procedure ids masked: failures of different runs compare by their cause."""
    return _ID.sub("<id>", text)


def ids_in(text: str) -> list[str]:
    return _ID.findall(text)
