"""Signals: a named message, with a JSON payload, for one procedure, from any process.

A signal is one create-only key under the store's `requests/` folder, outside `procedure/`
so that GreptimeDB's loader never sees it:

    {parent_path}requests/signals/{procedure_id}/{sent_ns:020d}-{token}.json
        {"name":"region-opened","payload":{...},"sent_at":1700000000.5,"sent_by":"ops@host"}

Keys sort in the order signals were sent (by the sender's clock, to the nanosecond; the
random token tells apart two sent in the same nanosecond by two processes), and a procedure
receives the signals of a name in that order. One process's keys are strictly increasing
(`_sent_ns`): two signals it sends one after the other keep that order even when its clock
reads the same twice (a coarse clock) or steps back (an NTP step). A signal is consumed with the step that read it: that
step's stored message names its key (`ProcedureMessage.consumed`), and the key is deleted
only once that message is stored (see `procstore._runtime.waits`).
"""

from __future__ import annotations

import secrets
import time
from collections.abc import Collection
from dataclasses import dataclass
from typing import TYPE_CHECKING

import msgspec
import orjson

from procstore._logs import get_logger
from procstore._text import storable
from procstore.errors import ProcedureError
from procstore.ids import ProcedureId
from procstore.store.finite import has_non_finite
from procstore.store.message import UNDECODABLE
from procstore.store.requests import REQUESTS_PATH, who
from procstore.store.state_store import StateStore, walk_readable

if TYPE_CHECKING:
    from procstore.store.procedure_store import ProcedureStore

logger = get_logger("procstore.store")

SIGNALS_PATH = f"{REQUESTS_PATH}signals/"
"""The folder of signals, under a store's root."""


class _StoredSignal(msgspec.Struct, frozen=True):
    name: str
    payload: msgspec.Raw = msgspec.field(default_factory=lambda: msgspec.Raw(b"null"))
    sent_at: float = 0.0
    sent_by: str = ""


@dataclass(frozen=True, slots=True)
class Signal:
    """One stored signal: its key (its identity, and its place in the order sent)."""

    key: str
    name: str
    payload: object


def encoded_payload(name: object, payload: object) -> bytes:
    """`payload` as JSON, once `name` is checked: `TypeError` for a name that is not non-empty
    text or a payload JSON cannot hold, `ValueError` for a name UTF-8 cannot store (a lone
    surrogate), before anything is written."""
    if not isinstance(name, str) or not name:
        raise TypeError(f"a signal's name is non-empty text, not {name!r}")
    storable(name, "a signal's name")
    try:
        encoded = orjson.dumps(payload)
    except TypeError as e:
        raise TypeError(f"a signal's payload must be a JSON value: {e}") from None
    if b"null" in encoded and has_non_finite(payload):
        raise TypeError("a signal's payload must be a JSON value: it holds a NaN or an infinity, which JSON cannot")
    return encoded


_last_sent_ns = 0
"""The time this process's latest signal carries (see `_sent_ns`)."""


def _sent_ns() -> int:
    """The sender's clock for a new signal's key, later than every earlier one of this process."""
    global _last_sent_ns
    _last_sent_ns = max(time.time_ns(), _last_sent_ns + 1)
    return _last_sent_ns


class SignalStore:
    """Reads and writes signals under `{parent_path}requests/signals/` of a `StateStore`."""

    def __init__(self, store: StateStore, parent_path: str = "") -> None:
        self.store = store
        self.prefix = f"{parent_path}{SIGNALS_PATH}"

    def folder(self, procedure_id: ProcedureId) -> str:
        return f"{self.prefix}{procedure_id}/"

    async def put(self, procedure_id: ProcedureId, name: str, payload: object = None) -> str:
        """Store a signal, create-only; returns its key. Raises `TypeError` for a name that is
        not non-empty text or a payload JSON cannot hold, before anything is written."""
        raw = encoded_payload(name, payload)
        sent = _sent_ns()
        key = f"{self.folder(procedure_id)}{sent:020d}-{secrets.token_hex(4)}.json"
        value = msgspec.json.encode(
            _StoredSignal(name=name, payload=msgspec.Raw(raw), sent_at=sent / 1e9, sent_by=who())
        )
        if not await self.store.put_if_absent(key, value) and await self.store.get(key) != value:
            raise ProcedureError(f"the signal key {key} is taken; send the signal again")
        return key

    def own(self, procedure_id: ProcedureId, consumed: Collection[str]) -> tuple[str, ...]:
        """The keys of `consumed` (a stored step's: the signals it consumed, which are deleted)
        that name a signal of this procedure: one name, ending `.json`, in its folder. A stored
        message is anyone's to write who can write the store, and a key elsewhere (another
        procedure's step or signal, the store's settings, `../` out of a local store's folder)
        is none of its signals: never deleted, logged."""
        folder = self.folder(procedure_id)
        mine = tuple(k for k in consumed if k.startswith(folder) and _signal_name(k[len(folder) :]))
        if len(mine) < len(consumed):
            kept = set(mine)
            others = [k for k in consumed if k not in kept]
            logger.warning(
                "procedure %s: its stored step names %d key(s) as consumed signals that are none of its signals "
                "(never deleted): %s",
                procedure_id,
                len(others),
                ", ".join(repr(k) for k in others[:3]),
            )
        return mine

    async def keys(self, procedure_id: ProcedureId, skip: Collection[str] = ()) -> list[str]:
        """The keys of the procedure's signals, in the order sent, but those in `skip` (consumed already)."""
        skipped = set(skip)  # a stored step's `consumed` is anyone's to make long: one look each
        return sorted(k for k in await walk_readable(self.store, self.folder(procedure_id)) if k not in skipped)

    async def read(self, key: str) -> Signal | None:
        """The signal stored under `key`; None if it is gone, or unreadable (a torn write is no signal)."""
        raw = await self.store.get(key)
        if raw is None:
            return None
        try:
            stored = msgspec.json.decode(raw, type=_StoredSignal)
            payload = orjson.loads(bytes(stored.payload))
        except (msgspec.ValidationError, orjson.JSONDecodeError, *UNDECODABLE):
            return None
        return Signal(key, stored.name, payload)

    def listed_by_procedure(self, listed: Collection[str]) -> dict[ProcedureId, list[str]]:
        """The signal keys that `listed` (a listing of `requests/` or of this folder) shows, by procedure."""
        found: dict[ProcedureId, list[str]] = {}
        for key in listed:
            if key.startswith(self.prefix) and key.endswith(".json"):
                pid = ProcedureId.parse_canonical(key[len(self.prefix) :].split("/", 1)[0])
                if pid is not None:
                    found.setdefault(pid, []).append(key)
        return found

    async def delete(self, keys: Collection[str]) -> None:
        if keys:
            await self.store.batch_delete(list(keys))

    async def delete_all(self, procedure_id: ProcedureId) -> None:
        """Delete every signal of a procedure that has ended (none can be delivered any more)."""
        await self.delete(await self.keys(procedure_id))


async def send_signal(store: ProcedureStore, procedure_id: ProcedureId, name: str, payload: object = None) -> str:
    """Store a signal for a stored procedure that has not ended; returns its key. What any
    process may call (`ProcedureManager.signal`, `Client.signal`, `procstore signal`): the
    manager running the procedure finds it at its next look at `requests/`.

    Raises `ProcedureError` for a procedure the store does not hold (never submitted, or
    ended and deleted) or whose latest key is its end (`.commit`), and `TypeError` for a name
    or payload that cannot be stored; nothing is written then.
    """
    encoded_payload(name, payload)
    await store.check_unfinished(procedure_id, "signal")
    return await store.signals.put(procedure_id, name, payload)


def _signal_name(name: str) -> bool:
    """Whether `name` (a key's part in a procedure's signal folder) is a signal's: one name,
    neither hidden nor a folder's, ending `.json`."""
    return "/" not in name and not name.startswith(".") and name.endswith(".json")


def sent_at(key: str) -> float | None:
    """When the signal under `key` was sent (seconds since the epoch, by its sender's clock),
    read from its name; None for a name procstore did not write."""
    name = key.rsplit("/", 1)[-1]
    sent = name.split("-", 1)[0]
    return int(sent) / 1e9 if sent.isascii() and sent.isdigit() else None
