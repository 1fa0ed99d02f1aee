"""`ProcedureId`: the identity of a procedure, a UUID in its canonical form."""

from __future__ import annotations

import uuid
from typing import Final

_CANONICAL_LENGTH: Final = 36


class ProcedureId:
    """A procedure's id: a UUID whose `str()` is the canonical lower-case hyphenated form.

    The canonical form is what appears in store keys, so `ProcedureId.parse(str(pid)) == pid`
    always holds. Instances are immutable and hashable.
    """

    __slots__ = ("_text", "_uuid")

    _uuid: uuid.UUID
    _text: str

    def __init__(self, value: uuid.UUID) -> None:
        object.__setattr__(self, "_uuid", value)
        object.__setattr__(self, "_text", str(value))

    @classmethod
    def random(cls) -> ProcedureId:
        """A new random (version 4) id."""
        return cls(uuid.uuid4())

    @classmethod
    def parse(cls, text: str) -> ProcedureId:
        """Parse any form `uuid.UUID` accepts; raises `ValueError` naming the input otherwise."""
        try:
            return cls(uuid.UUID(text))
        except (ValueError, TypeError, AttributeError):
            raise ValueError(f"not a procedure id (a UUID was expected): {text!r}") from None

    @classmethod
    def parse_canonical(cls, text: str) -> ProcedureId | None:
        """Parse only the canonical form used in keys; `None` for anything else."""
        if len(text) != _CANONICAL_LENGTH:
            return None
        try:
            value = uuid.UUID(text)
        except ValueError:
            return None
        return cls(value) if str(value) == text else None

    @property
    def uuid(self) -> uuid.UUID:
        return self._uuid

    def __str__(self) -> str:
        return self._text

    def __repr__(self) -> str:
        return f"ProcedureId('{self._text}')"

    def __eq__(self, other: object) -> bool:
        if isinstance(other, ProcedureId):
            return self._uuid == other._uuid
        return NotImplemented

    def __hash__(self) -> int:
        return hash(self._uuid)

    def __lt__(self, other: ProcedureId) -> bool:
        return self._text < other._text

    def __setattr__(self, name: str, value: object) -> None:
        raise AttributeError("ProcedureId is immutable")
