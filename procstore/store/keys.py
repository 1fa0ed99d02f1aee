"""Store keys: `{prefix}{procedure_id}/{step:010}.{step|commit|rollback}`.

`ParsedKey` is the only place that formats or parses these keys, byte-compatible with
GreptimeDB's `common_procedure::store::ParsedKey`.
"""

from __future__ import annotations

import enum
import operator
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from itertools import repeat

from procstore.ids import CANONICAL_ID_PATTERN, ProcedureId

PROC_PATH = "procedure/"
"""The folder under a store's root that holds every procedure's keys."""
MAX_STEP = 2**32 - 1
"""Step numbers are GreptimeDB's u32: the highest a key may carry. A key above it is no
procedure's (no procedure can write it): anyone who can write the bucket could add one, and a
`.commit` there would otherwise end a procedure that has not ended."""
_MAX_STEP_TEXT = f"{MAX_STEP:010d}"


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
_STEP_DIGITS = 10
"""A step in a key: zero-padded to ten digits (a `u32` has at most ten)."""
_KEY = re.compile(
    rf"({CANONICAL_ID_PATTERN})/([0-9]{{{_STEP_DIGITS}}}|[1-9][0-9]{{{_STEP_DIGITS},}})\.({'|'.join(_KEY_TYPES)})"
)
"""What follows the prefix: `{id}/{step:010}.{type}`, exactly as `key_text` writes it (and
GreptimeDB; a step beyond ten digits has no leading zero, and is no key of ours either: it
is above `MAX_STEP`). A key
of another shape that GreptimeDB's parser (which reads from the right) would take,
`{prefix}x/{id}/1.step`, is not one of ours: every read and delete formats the key from its
parts, so it would act on another key than the one listed, and a stray `.commit` of that
shape, which anyone who can write the bucket can add, would end a procedure that has not."""


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
        # Every key `_KEY` matches has a `/` right after its id (the id pattern is exactly
        # `_ID_LENGTH` long), so a key of no other shape is one: the name after the id is
        # parsed once per distinct name (`0000000001.step` and a few others recur in every
        # folder) and the id once per procedure. Invariant: `folder` is `{prefix}{id}/` of
        # the last key of that shape, and `found` is that id's list; a listing is sorted, so
        # most keys share the folder of the key before them.
        folder = None
        found: list[StepAndType] = []
        names: dict[str, StepAndType | None] = {}
        for key in keys:
            same_folder = folder is not None and key.startswith(folder)
            if same_folder or (key[slash : slash + 1] == "/" and key.startswith(prefix)):
                name = key[slash + 1 :]
                parsed = names.get(name, _UNSEEN)
                if parsed is _UNSEEN:
                    parsed = names[name] = parse_key_name(name)
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
            others.append(key)
        return cls(steps, others)


_UNSEEN: StepAndType | None = (-1, KeyType.STEP)
"""A name not parsed yet (`group`'s cache holds `None` for names that are not a key's)."""


def parent_folder(parent_path: str) -> str:
    """A manager's `parent_path` as the folder every key it writes is under: `region-a` and
    `region-a/` are the same folder; empty is the store's root. Raises `ValueError` for one
    that may name a folder outside the store (a leading `/`, a `.` or `..` part): on a local
    directory, it would read and write outside it. An empty part (`a//b`) is a prefix of
    its own on an object store, and stays allowed."""
    if parent_path.startswith("/") or any(part in (".", "..") for part in parent_path.split("/")):
        raise ValueError(
            f"parent_path {parent_path!r} is no folder inside the store: use a relative path with no '.' or '..' "
            "part (the store's root is the empty path)"
        )
    return parent_path if not parent_path or parent_path.endswith("/") else f"{parent_path}/"


def key_text(prefix: str, procedure_id: ProcedureId, step: int, key_type: KeyType) -> str:
    """The key `ParsedKey(prefix, procedure_id, step, key_type)` stands for, without making
    one (recovery formats a key per procedure)."""
    # The member's value read as a plain attribute: an enum's hash (a dict of suffixes) and
    # `.value` are Python calls, and every step's write formats a key.
    return f"{prefix}{procedure_id}/{step:010d}.{key_type._value_}"


def parse_key_name(name: str) -> StepAndType | None:
    """`(step, key_type)` of a key's last part, `{digits}.{type}`; `None` for any other."""
    step_text, dot, type_text = name.partition(".")
    if (
        dot
        and _padded_as_written(step_text)
        and step_text.isascii()
        and step_text.isdigit()
        and (key_type := _KEY_TYPES.get(type_text)) is not None
    ):
        step = _step_number(step_text)
        return None if step is None else (step, key_type)
    return None


def _padded_as_written(digits: str) -> bool:
    """Whether `{step:010d}` of the step these digits spell gives them back."""
    return len(digits) == _STEP_DIGITS or (len(digits) > _STEP_DIGITS and digits[:1] != "0")


def _step_number(digits: str) -> int | None:
    """The step a key's ASCII digits spell; `None` above `MAX_STEP`: such a key is not one
    of ours. Digits past what `int()` converts (4,300 by default) are never converted, where
    an error would stop every start."""
    if len(digits) > _STEP_DIGITS or (len(digits) == _STEP_DIGITS and digits > _MAX_STEP_TEXT):
        return None
    return int(digits)


def procedure_dir(prefix: str, procedure_id: ProcedureId) -> str:
    """The folder holding every key of one procedure, ending in `/`."""
    return f"{prefix}{procedure_id}/"


def procedure_of_dir(prefix: str, folder: str) -> ProcedureId | None:
    """The procedure whose folder (`procedure_dir`) `folder` is; None for any other folder."""
    if not folder.startswith(prefix):
        return None
    return ProcedureId.parse_canonical(folder[len(prefix) :].rstrip("/"))


FolderLatest = tuple[ProcedureId, StepAndType, str, StepAndType | None, str | None, int]
"""One procedure's keys as recovery needs them (see `latest_in_sorted`): its id; its latest
key (the highest step, and at that step a commit or rollback) and that key's text; with a
`.commit` latest, the highest other key (a rollback over a step at one step) and its text,
if there is one; its lowest step."""


def latest_in_sorted(prefix: str, keys: Sequence[str], *, lowest: bool = True) -> list[FolderLatest] | None:
    """Each procedure's latest key, read off a sorted listing of canonical keys only; `None`
    for any other listing (unsorted, a key of another shape, a step of more than ten digits
    or above `MAX_STEP`), which `KeysByProcedure.group` then reads. The answers are `group`'s
    and `ProcedureKeys.of`'s (`procstore.store.folder`), as `tests/store/test_folder.py` checks.
    Without `lowest`, every lowest step is given as 0 (not looked for).

    Recovery lists every key of every procedure but needs only each one's latest: on a
    listing of `{prefix}{id}/{10 digits}.{type}` keys in order, a folder's keys are sorted
    by step, then `commit` < `rollback` < `step` at one step. So a folder is a run of the
    listing, its last key is at its highest step, and the first key listed at that step is
    the latest (a commit over a rollback over a step); the key read is the listed text
    itself: no tuple per key, no key formatted again.
    """
    cut = len(prefix) + _ID_LENGTH + 1  # `{prefix}{id}/`: a folder
    digits_end = cut + _STEP_DIGITS
    if any(map(operator.ge, keys, keys[1:])):
        return None
    # Each folder's run ends at `last_at[folder]`. A key is of the one shape exactly when its
    # first `cut` characters are a folder's and the rest a key name's: the folders are
    # checked once each, and the names once each distinct one (`0000000001.step` and a few
    # others recur in every folder), instead of a pattern matched against every key.
    last_at = dict(zip(map(operator.itemgetter(slice(cut)), keys), range(len(keys)), strict=True))
    folder_shape = re.compile(rf"{re.escape(prefix)}{CANONICAL_ID_PATTERN}/")
    if not all(map(folder_shape.fullmatch, last_at)):
        return None
    named: dict[str, StepAndType] = {}  # each distinct name's step and type, one tuple shared by its keys
    for name in set(map(operator.itemgetter(slice(cut, None)), keys)):
        if _KEY_NAME.fullmatch(name) is None or name[:_STEP_DIGITS] > _MAX_STEP_TEXT:
            return None  # a key above `MAX_STEP` is no procedure's: `group` sets it apart
        named[name] = (int(name[:_STEP_DIGITS]), _SUFFIX_TYPES[name[_STEP_DIGITS:]])
    ids = ProcedureId._from_checked_texts(list(map(operator.itemgetter(slice(cut - 1 - _ID_LENGTH, cut - 1)), last_at)))
    ends = list(last_at.values())
    tops = list(map(keys.__getitem__, ends))  # each folder's last key
    before_tops = map(["", *keys].__getitem__, ends)  # the key listed before each (or "")
    if not any(map(str.endswith, tops, repeat(".commit"))) and not any(
        map(str.startswith, before_tops, map(operator.itemgetter(slice(digits_end)), tops))
    ):
        # Recovery's usual listing, read with no Python call per folder: each folder's last
        # key is alone at its step (so it is the latest), and none is a `.commit`.
        name_of = operator.itemgetter(slice(cut, None))
        latests = map(named.__getitem__, map(name_of, tops))
        if not lowest:
            return list(zip(ids, latests, tops, repeat(None), repeat(None), repeat(0)))
        firsts = map(keys.__getitem__, [0, *map(operator.add, ends[:-1], repeat(1))])
        lows = map(operator.itemgetter(0), map(named.__getitem__, map(name_of, firsts)))
        return list(zip(ids, latests, tops, repeat(None), repeat(None), lows))
    out: list[FolderLatest] = []
    first = 0  # where the folder's run begins
    for procedure_id, end in zip(ids, last_at.values(), strict=True):
        key = keys[end]
        top = key[:digits_end]
        at = end  # at most two keys back: a commit and a rollback at the top step
        while at > first and keys[at - 1].startswith(top):
            at -= 1
        if at != end:
            key = keys[at]
        latest = named[key[cut:]]
        below: StepAndType | None = None
        below_key = None
        if latest[1] is KeyType.COMMIT and (below_key := _highest_below_commit(keys, at, first, digits_end)):
            below = named[below_key[cut:]]
        low = named[keys[first][cut:]][0] if lowest else 0
        out.append((procedure_id, latest, key, below, below_key, low))
        first = end + 1
    return out


def _highest_below_commit(keys: Sequence[str], at: int, first: int, digits_end: int) -> str | None:
    """For the commit at `at` in the folder whose run of `keys` begins at `first`, the
    message it ends (`folder.ProcedureKeys.newest_message`): the highest key below its step
    that is not a commit, a rollback over a step at one step (`folder.latest_first`), by a
    walk back past any other commit; with none, the key after the commit at its step."""
    for i in range(at - 1, first - 1, -1):
        key = keys[i]
        if key.endswith(".commit"):
            continue
        if key.endswith(".step") and i > first:
            maybe_rollback = keys[i - 1]  # a rollback at the step is listed just before it
            if maybe_rollback.endswith(".rollback") and maybe_rollback.startswith(key[:digits_end]):
                return maybe_rollback
        return key
    if at + 1 < len(keys) and keys[at + 1].startswith(keys[at][:digits_end]):
        return keys[at + 1]  # its rollback or step
    return None


_KEY_NAME = re.compile(rf"[0-9]{{{_STEP_DIGITS}}}\.(?:{'|'.join(_KEY_TYPES)})")
"""The last part of a key as `key_text` writes it, ten digits (`latest_in_sorted`)."""
_SUFFIX_TYPES = {f".{kt.value}": kt for kt in KeyType}
