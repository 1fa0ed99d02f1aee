"""A run's origin (who resumed or rewound it, when and why), kept in its stored messages.

A restart's copy (`{latest + 1}.step`) carries the operator's `Action` in a field of its
own, `run_started`, among the fields procstore's message schema does not name
(`ProcedureMessage.extra`): GreptimeDB's loader ignores it, and every later key of the
run is written with it (`ProcedureStore.unknown_fields`). So whichever manager runs the
copy (the one that wrote it, or the next to start after a crash or a takeover) knows how
the run started, though the operator's nudge may be gone by then. The field names its run:
a rewind to a step of an earlier run copies that step's fields, whose origin is another
run's, and says nothing about this one.
"""

from __future__ import annotations

import msgspec
import orjson

from procstore.store.history import Action
from procstore.store.message import UNDECODABLE, ProcedureMessage

ORIGIN_FIELD = "run_started"


class _RunOrigin(msgspec.Struct, frozen=True):
    run: int
    action: Action


_members = msgspec.json.Decoder(dict[str, msgspec.Raw])
_origin = msgspec.json.Decoder(_RunOrigin)


def _fields(extra: bytes) -> dict[str, msgspec.Raw] | None:
    """The members of `extra`, each value's bytes as stored; None if they cannot be read."""
    if not extra:
        return {}
    try:
        return _members.decode(b"{" + extra + b"}")
    except UNDECODABLE:
        return None


def with_run_origin(extra: bytes, run: int, action: Action) -> bytes:
    """`extra` with `action` as the origin of `run` (replacing any other run's); unchanged
    if `extra` cannot be read (what another writer stored is never rewritten)."""
    fields = _fields(extra)
    if fields is None:
        return extra
    fields[ORIGIN_FIELD] = msgspec.Raw(msgspec.json.encode(_RunOrigin(run, action)))
    return b",".join(orjson.dumps(name) + b":" + bytes(value) for name, value in fields.items())


def run_origin(message: ProcedureMessage) -> Action | None:
    """How the message's run started, if its messages say (a restart's copy and the keys
    after it); None for a run 1, or one whose copy a release without the field wrote."""
    fields = _fields(message.extra)
    if not fields or (raw := fields.get(ORIGIN_FIELD)) is None:
        return None
    try:
        origin = _origin.decode(raw)
    except UNDECODABLE:
        return None
    return origin.action if origin.run == message.run else None
