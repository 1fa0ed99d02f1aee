"""Lock keys: `StringKey` (one shared or exclusive key) and `LockKey` (a procedure's set)."""

from __future__ import annotations

import enum
from collections.abc import Iterable, Iterator
from dataclasses import dataclass


class LockMode(enum.Enum):
    SHARE = "share"
    EXCLUSIVE = "exclusive"


@dataclass(frozen=True, slots=True, order=True)
class StringKey:
    """One lock key: a string, held shared (many readers) or exclusive (one writer)."""

    key: str
    mode: LockMode

    @classmethod
    def share(cls, key: str) -> StringKey:
        return cls(key, LockMode.SHARE)

    @classmethod
    def exclusive(cls, key: str) -> StringKey:
        return cls(key, LockMode.EXCLUSIVE)

    @property
    def is_exclusive(self) -> bool:
        return self.mode is LockMode.EXCLUSIVE

    def conflicts_with(self, other: StringKey) -> bool:
        """Two holds of the same key conflict unless both are shared."""
        return self.key == other.key and (self.is_exclusive or other.is_exclusive)

    def __str__(self) -> str:
        return f"{self.mode.value}:{self.key}"


def _none_or_one_checked(keys: Iterable[object]) -> bool:
    """A plain list or tuple (not a subclass, whose `len` or `[0]` could say otherwise) of no
    key or one `StringKey` whose name is a string, as merging several keys makes sure of."""
    if type(keys) is not list and type(keys) is not tuple:
        return False
    return not keys or (len(keys) == 1 and isinstance(key := keys[0], StringKey) and type(key.key) is str)


class LockKey:
    """The keys a procedure locks for its whole life, sorted by key and de-duplicated.

    A key asked for both shared and exclusive is held exclusive. Sorting gives every
    procedure the same acquisition order, so two procedures cannot deadlock on each other.
    """

    __slots__ = ("_keys",)

    def __init__(self, keys: Iterable[StringKey] = ()) -> None:
        if _none_or_one_checked(keys):
            self._keys: tuple[StringKey, ...] = tuple(keys)  # none or one: nothing to merge or sort
            return
        merged: dict[str, StringKey] = {}
        for k in keys:
            if not isinstance(k, StringKey):
                raise TypeError(f"LockKey takes StringKey values, got {k!r}")
            held = merged.get(k.key)
            if held is None or k.is_exclusive:
                merged[k.key] = k
        self._keys = tuple(map(merged.__getitem__, sorted(merged)))

    @classmethod
    def single_exclusive(cls, key: str) -> LockKey:
        return cls([StringKey.exclusive(key)])

    def keys_to_lock(self) -> tuple[StringKey, ...]:
        """The keys in acquisition order."""
        return self._keys

    def conflicts_with(self, other: LockKey) -> list[str]:
        """The key names that `self` and `other` cannot hold at the same time."""
        mine = {k.key: k for k in self._keys}
        return [k.key for k in other._keys if k.key in mine and mine[k.key].conflicts_with(k)]

    def __iter__(self) -> Iterator[StringKey]:
        return iter(self._keys)

    def __len__(self) -> int:
        return len(self._keys)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, LockKey) and self._keys == other._keys

    def __hash__(self) -> int:
        return hash(self._keys)

    def __repr__(self) -> str:
        return f"LockKey({list(self._keys)!r})"


NO_KEYS = LockKey()
"""No lock at all: one shared value (a `LockKey` is never changed once made), for every
procedure that locks nothing."""
