"""Encoding and validated decoding of persistent contexts and states (dataclasses).

Encoding is orjson (dataclasses in field order, enums by value, `Duration` as humantime).
Decoding is msgspec's `convert`, which checks every type on the way in (nested
dataclasses, `Optional`, enums, lists, dicts, defaults for missing fields) and says where a
value is wrong; hand-written validation would be a module of its own.
"""

from __future__ import annotations

import dataclasses
import enum
from typing import Any, TypeVar

import msgspec
import orjson

from procstore.errors import ProcedureError
from procstore.machine.duration import Duration

T = TypeVar("T")


class MachineDataError(ProcedureError, ValueError):
    """Stored machine data that cannot be decoded; names the machine and the field."""

    def __init__(self, machine: str, field: str, problem: str) -> None:
        self.machine = machine
        self.field = field
        self.problem = problem
        super().__init__(f"{machine}: field `{field}`: {problem}")


def dumps(obj: object) -> str:
    """Compact JSON text, as stored in a message's `data`."""
    return orjson.dumps(to_builtins(obj)).decode()


SKIP_IF_EMPTY = {"skip_if_empty": True}
"""Field metadata: leave the field out of the stored form when it is empty (serde's
`skip_serializing_if`), so that data written before the field existed stays byte-identical."""


def to_builtins(obj: object) -> Any:
    """`obj` as plain JSON values: dataclasses as dicts in field order, enums by value,
    `Duration` as humantime text; fields marked `SKIP_IF_EMPTY` left out when empty."""
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        out: dict[str, Any] = {}
        for f in dataclasses.fields(obj):
            value = getattr(obj, f.name)
            if f.metadata.get("skip_if_empty") and not value:
                continue
            out[f.name] = to_builtins(value)
        return out
    if isinstance(obj, Duration):
        return obj.format()
    if isinstance(obj, enum.Enum):
        return to_builtins(obj.value)
    if isinstance(obj, list | tuple):
        return [to_builtins(v) for v in obj]
    if isinstance(obj, dict):
        return {str(k.value if isinstance(k, enum.Enum) else k): to_builtins(v) for k, v in obj.items()}
    if obj is None or isinstance(obj, str | int | float | bool):
        return obj
    raise TypeError(f"cannot store a {type(obj).__name__} in a machine's data: {obj!r}")


def _dec_hook(kind: type, value: Any) -> Any:
    if kind is Duration:
        return Duration.parse(value)  # a ValueError becomes a ValidationError with its path
    raise NotImplementedError(kind)


def convert(value: Any, kind: type[T], *, machine: str, field: str) -> T:
    """Decode `value` into `kind`, raising `MachineDataError` at the first wrong field."""
    try:
        return msgspec.convert(value, kind, dec_hook=_dec_hook)
    except msgspec.ValidationError as e:
        message, _, where = str(e).partition(" - at `$")
        path = field + where.rstrip("`") if where else field
        raise MachineDataError(machine, path, message) from None
