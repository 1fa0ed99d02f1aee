"""Store keys: `{prefix}{procedure_id}/{step:010}.{step|commit|rollback}`.

`ParsedKey` is the only place that formats or parses these keys, byte-compatible with
GreptimeDB's `common_procedure::store::ParsedKey`.
"""

from __future__ import annotations

import enum
import re
from collections.abc import Iterable
from dataclasses import dataclass

from procstore.ids import CANONICAL_ID_PATTERN, ProcedureId

PROC_PATH = "procedure/"
"""The folder under a store's root that holds every procedure's keys."""


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
        return key_text(self.prefix, self.procedure_id, self.step, self.key_type)

    @classmethod
    def parse(cls, prefix: str, key: str) -> ParsedKey | None:
        """Parse `key`; `None` for any key that is not one of ours (never raises).

        The last path part must be `{digits}.{step|commit|rollback}` and the part before it a
        canonical UUID. Anything else under the prefix (a temp file, a stray object) is
        not a procedure key.
        """
        match = _KEY.fullmatch(key, len(prefix)) if key.startswith(prefix) else None
        if match is None:
            return None
        id_text, step_text, type_text = match.groups()
        procedure_id = ProcedureId.parse_canonical(id_text)
        assert procedure_id is not None  # the pattern only matches canonical ids
        step = _step_number(step_text)
        return None if step is None else cls(prefix, procedure_id, step, _KEY_TYPES[type_text])


_ID_LENGTH = 36
"""The length of a canonical id."""
_KEY = re.compile(
    rf"(?:.*/)?({CANONICAL_ID_PATTERN})/([0-9]+)\.({'|'.join(_KEY_TYPES)})",
    re.DOTALL,
)
"""What follows the prefix: any folders, then `{id}/{step}.{type}`, as GreptimeDB's parser reads it."""


StepAndType = tuple[int, KeyType]
"""A procedure key without its procedure: its step and suffix."""


@dataclass(slots=True)
class KeysByProcedure:
    """The keys under a prefix, grouped by procedure without building a `ParsedKey` for each."""

    steps: dict[ProcedureId, list[StepAndType]]
    """Each procedure's `(step, key_type)` pairs, in listing order."""
    others: list[str]
    """Keys under the prefix that are not procedure keys."""

    @classmethod
    def group(cls, prefix: str, keys: Iterable[str]) -> KeysByProcedure:
        """Same verdict as `ParsedKey.parse` for every key, at a fraction of its cost.

        Recovery lists every key of every procedure but needs a `ParsedKey` for only the
        latest one of each.
        """
        steps: dict[ProcedureId, list[StepAndType]] = {}
        by_text: dict[str, list[StepAndType]] = {}
        others: list[str] = []
        start = len(prefix)
        slash = start + _ID_LENGTH
        match_key = _KEY.fullmatch
        # The common shape, `{prefix}{id}/{digits}.{type}`, is read without the regex: the
        # name after the id is parsed once per distinct name (`0000000001.step` and a few
        # others recur in every folder) and the id once per procedure. Invariant: `folder`
        # is `{prefix}{id}/` of the last key of that shape, and `found` is that id's list;
        # a listing is sorted, so most keys share the folder of the key before them.
        folder = None
        found: list[StepAndType] = []
        names: dict[str, StepAndType | None] = {}
        for key in keys:
            same_folder = folder is not None and key.startswith(folder)
            if same_folder or (key[slash : slash + 1] == "/" and key.startswith(prefix)):
                name = key[slash + 1 :]
                parsed = names.get(name, _UNSEEN)
                if parsed is _UNSEEN:
                    parsed = names[name] = _parse_name(name)
                if parsed is not None:
                    if not same_folder:
                        id_text = key[start:slash]
                        known = by_text.get(id_text)
                        if known is None:
                            procedure_id = ProcedureId.parse_canonical(id_text)
                            if procedure_id is None:  # the regex would not match either: the id ends the key
                                others.append(key)
                                continue
                            known = by_text[id_text] = steps[procedure_id] = []
                        folder, found = key[: slash + 1], known
                    found.append(parsed)
                    continue
            # Any other shape gets the regex's verdict.
            match = match_key(key, start) if key.startswith(prefix) else None
            step = None if match is None else _step_number(match[2])
            if match is None or step is None:
                others.append(key)
                continue
            id_text, _, type_text = match.groups()
            known = by_text.get(id_text)
            if known is None:
                procedure_id = ProcedureId.parse_canonical(id_text)
                assert procedure_id is not None  # the pattern only matches canonical ids
                known = by_text[id_text] = steps[procedure_id] = []
            known.append((step, _KEY_TYPES[type_text]))
        return cls(steps, others)


_UNSEEN: StepAndType | None = (-1, KeyType.STEP)
"""A name not parsed yet (`group`'s cache holds `None` for names that are not a key's)."""


def key_text(prefix: str, procedure_id: ProcedureId, step: int, key_type: KeyType) -> str:
    """The key `ParsedKey(prefix, procedure_id, step, key_type)` stands for, without making
    one (recovery formats a key per procedure)."""
    return f"{prefix}{procedure_id}/{step:010d}{_SUFFIXES[key_type]}"


_SUFFIXES = {kt: f".{kt.value}" for kt in KeyType}


def _parse_name(name: str) -> StepAndType | None:
    """`(step, key_type)` of a key's last part, `{digits}.{type}`; `None` for any other."""
    step_text, dot, type_text = name.partition(".")
    if dot and step_text.isascii() and step_text.isdigit() and (key_type := _KEY_TYPES.get(type_text)) is not None:
        step = _step_number(step_text)
        return None if step is None else (step, key_type)
    return None


def _step_number(digits: str) -> int | None:
    """The step a key's ASCII digits spell; `None` past the digits `int()` converts (4,300
    by default): such a key is not one of ours, where an error would stop every start."""
    try:
        return int(digits)
    except ValueError:
        return None


def procedure_dir(prefix: str, procedure_id: ProcedureId) -> str:
    """The folder holding every key of one procedure, ending in `/`."""
    return f"{prefix}{procedure_id}/"
