"""`ProcedureMessage`: the JSON value of a `.step` or `.rollback` key.

Byte-compatible with GreptimeDB's serde encoding: fields in the order
`type_name, data, parent_id, step[, error]`, compact separators, `error` left out when
there is none. Readers accept unknown extra fields and a missing `error`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import orjson

from procstore.ids import ProcedureId

_U32_MAX = 2**32 - 1


class MessageDecodeError(ValueError):
    """A stored value is not a valid `ProcedureMessage`; the text says which field and why."""


@dataclass(frozen=True, slots=True)
class ProcedureMessage:
    """One persisted state of a procedure."""

    type_name: str
    """The procedure's type; recovery uses it to find a loader."""
    data: str
    """What the procedure's `dump()` returned."""
    parent_id: ProcedureId | None
    """The parent, for a subprocedure."""
    step: int
    """The step number, the same as in the key."""
    error: str | None = None
    """Why the procedure failed, on a `.rollback` value."""

    def encode(self) -> bytes:
        """The exact bytes GreptimeDB would write for this message."""
        obj: dict[str, Any] = {
            "type_name": self.type_name,
            "data": self.data,
            "parent_id": None if self.parent_id is None else str(self.parent_id),
            "step": self.step,
        }
        if self.error is not None:
            obj["error"] = self.error
        return orjson.dumps(obj)

    @classmethod
    def decode(cls, raw: bytes) -> ProcedureMessage:
        """Parse a stored value; raises `MessageDecodeError` saying what is wrong."""
        if not raw:
            raise MessageDecodeError("the value is empty (a truncated or torn write?)")
        try:
            obj = orjson.loads(raw)
        except orjson.JSONDecodeError as e:
            raise MessageDecodeError(f"the value is not JSON ({e}); it may be truncated") from None
        if not isinstance(obj, dict):
            raise MessageDecodeError(f"the value is JSON but not an object: {type(obj).__name__}")
        type_name = _field(obj, "type_name", str)
        data = _field(obj, "data", str)
        step = _field(obj, "step", int)
        if isinstance(step, bool) or not 0 <= step <= _U32_MAX:
            raise MessageDecodeError(f"field 'step' must be an integer in 0..2^32-1, got {step!r}")
        parent_text = obj.get("parent_id")
        parent_id = None
        if parent_text is not None:
            if not isinstance(parent_text, str):
                raise MessageDecodeError(f"field 'parent_id' must be a UUID string or null, got {parent_text!r}")
            try:
                parent_id = ProcedureId.parse(parent_text)
            except ValueError as e:
                raise MessageDecodeError(f"field 'parent_id': {e}") from None
        error = obj.get("error")
        if error is not None and not isinstance(error, str):
            raise MessageDecodeError(f"field 'error' must be a string, got {type(error).__name__}")
        return cls(type_name, data, parent_id, step, error)


def _field(obj: dict[str, Any], name: str, kind: type) -> Any:
    if name not in obj:
        raise MessageDecodeError(f"field {name!r} is missing")
    value = obj[name]
    if not isinstance(value, kind):
        raise MessageDecodeError(f"field {name!r} must be {kind.__name__}, got {type(value).__name__}")
    return value
