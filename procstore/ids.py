"""`ProcedureId`: the identity of a procedure, a UUID in its canonical form."""

from __future__ import annotations

import re
import uuid
from collections import deque
from collections.abc import Callable, Sequence
from itertools import repeat

from procstore.errors import InvalidProcedureId

CANONICAL_ID_PATTERN = "[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}"
"""`str(uuid.UUID(...))`: lower-case hex, hyphenated 8-4-4-4-12."""
_CANONICAL = re.compile(CANONICAL_ID_PATTERN)


class ProcedureId:
    """A procedure's id: a UUID whose `str()` is the canonical lower-case hyphenated form.

    The canonical form is what appears in store keys, so `ProcedureId.parse(str(pid)) == pid`
    always holds. Instances are immutable and hashable. Only the text is kept: two UUIDs are
    equal exactly when their canonical texts are, and recovery parses ids by the thousand.
    """

    __slots__ = ("_text",)

    _text: str

    def __init__(self, value: uuid.UUID) -> None:
        # Only a UUID, or the canonical text itself: any other text (a path, upper case)
        # would name a key outside the store, or one recovery never recognises.
        if not isinstance(value, uuid.UUID) and not (isinstance(value, str) and _CANONICAL.fullmatch(value)):
            raise InvalidProcedureId(value)
        object.__setattr__(self, "_text", str(value))

    @classmethod
    def random(cls) -> ProcedureId:
        """A new random (version 4) id (seeded under `procstore.testing.SimulatedLoop`)."""
        return cls(new_uuid())

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
        if _CANONICAL.fullmatch(text) is None:
            return None
        return cls._from_checked_text(text)

    @classmethod
    def _from_checked_text(cls, text: str) -> ProcedureId:
        """The id whose canonical text `text` is, already checked by the caller (recovery's
        listing, matched against `CANONICAL_ID_PATTERN` as a whole): `parse_canonical`
        without its match. Not public: an unchecked text would make an id that is not one."""
        pid = object.__new__(cls)
        object.__setattr__(pid, "_text", text)
        return pid

    @classmethod
    def _from_checked_texts(cls, texts: Sequence[str]) -> list[ProcedureId]:
        """`_from_checked_text` of each of `texts`, without a Python call per id (recovery
        makes one per stored procedure): C calls only, each id made, then its text set."""
        ids = list(map(object.__new__, repeat(cls, len(texts))))
        deque(map(_TEXT_SLOT.__set__, ids, texts), maxlen=0)
        return ids

    @property
    def uuid(self) -> uuid.UUID:
        return uuid.UUID(self._text)

    def __str__(self) -> str:
        return self._text

    def __repr__(self) -> str:
        return f"ProcedureId('{self._text}')"

    def __eq__(self, other: object) -> bool:
        if isinstance(other, ProcedureId):
            return self._text == other._text
        return NotImplemented

    def __hash__(self) -> int:
        return hash(self._text)

    def __lt__(self, other: ProcedureId) -> bool:
        return self._text < other._text

    def __setattr__(self, name: str, value: object) -> None:
        raise AttributeError("ProcedureId is immutable")

    def __reduce__(self) -> tuple[type[ProcedureId], tuple[str]]:
        # Immutability refuses pickle's default attribute restore; rebuild from the text instead.
        return (ProcedureId, (self._text,))


_TEXT_SLOT = vars(ProcedureId)["_text"]
"""The slot holding an id's text: its `__set__` fills a new id in one C call."""

new_uuid: Callable[[], uuid.UUID] = uuid.uuid4
"""Where random ids come from: `uuid.uuid4`, or a seeded generator while a seeded
`procstore.testing.SimulatedLoop` runs (so that a seed replays the same ids)."""
