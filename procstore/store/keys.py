"""Store keys: `{prefix}{procedure_id}/{step:010}.{step|commit|rollback}`.

`ParsedKey` is the only place that formats or parses these keys, byte-compatible with
GreptimeDB's `common_procedure::store::ParsedKey`.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from procstore.ids import ProcedureId

PROC_PATH = "procedure/"
"""The folder under a store's root that holds every procedure's keys."""

_STEP_WIDTH = 10


class KeyType(enum.Enum):
    """The suffix of a key: what the value under it means."""

    STEP = "step"
    """One persisted state of a procedure (a `ProcedureMessage`)."""
    COMMIT = "commit"
    """The procedure finished successfully (empty value)."""
    ROLLBACK = "rollback"
    """The procedure failed and is rolling back (a `ProcedureMessage` with `error`)."""

    @property
    def is_terminal(self) -> bool:
        return self is not KeyType.STEP


_KEY_TYPES = {kt.value: kt for kt in KeyType}


@dataclass(frozen=True, slots=True)
class ParsedKey:
    """A key of the procedure store, split into its parts.

    `prefix` is the procedure path (`{root}procedure/`) and ends in `/`.
    """

    prefix: str
    procedure_id: ProcedureId
    step: int
    key_type: KeyType

    def __str__(self) -> str:
        return f"{self.prefix}{self.procedure_id}/{self.step:0{_STEP_WIDTH}d}.{self.key_type.value}"

    @classmethod
    def parse(cls, prefix: str, key: str) -> ParsedKey | None:
        """Parse `key`; `None` for any key that is not one of ours (never raises).

        The last path part must be `{digits}.{step|commit|rollback}` and the part before it a
        canonical UUID. Anything else under the prefix (a temp file, a stray object) is
        not a procedure key.
        """
        if not key.startswith(prefix):
            return None
        rest = key[len(prefix) :]
        id_text, sep, name = rest.rpartition("/")
        if not sep:
            return None
        id_text = id_text.rpartition("/")[2]
        procedure_id = ProcedureId.parse_canonical(id_text)
        if procedure_id is None:
            return None
        step_text, dot, suffix = name.partition(".")
        key_type = _KEY_TYPES.get(suffix)
        if not dot or key_type is None or not (step_text.isascii() and step_text.isdigit()):
            return None
        return cls(prefix, procedure_id, int(step_text), key_type)


def procedure_dir(prefix: str, procedure_id: ProcedureId) -> str:
    """The folder holding every key of one procedure, ending in `/`."""
    return f"{prefix}{procedure_id}/"
