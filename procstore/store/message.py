"""`ProcedureMessage`: the JSON value of a `.step` or `.rollback` key.

Byte-compatible with GreptimeDB's serde encoding: fields in the order
`type_name, data, parent_id, step[, error][, run]`, compact separators, `error` left out
when there is none. Readers accept a missing `error`, and keep the fields they do not know
(GreptimeDB's `context`, say) in `extra`, which `encode` writes back after the others.

`wake_at`, `signal` and `consumed` are procstore's durable waits (see
`procstore._runtime.waits`): the epoch second a sleeping or waiting step wakes at, the
signal name it waits for, and the signal keys the step consumed. Each is left out when
unset, and GreptimeDB's loader ignores them as unknown fields: it resumes such a
procedure at once, as after a `RetryLater`.

`run` is procstore's: which run of the procedure id wrote the message (a submit is run 1,
each resume or rewind starts the next). It is left out for run 1, so a procedure that was
never restarted is stored byte for byte as GreptimeDB would store it, and GreptimeDB's
loader (serde, unknown fields ignored) reads the others.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Any

import msgspec
import orjson

from procstore.ids import ProcedureId
from procstore.wake_time import clamped_wake_at, wake_at_text

_U32_MAX = 2**32 - 1

MAX_RUN = _U32_MAX
"""The highest run a stored message can carry (GreptimeDB's u32): no restart goes past it."""


@dataclass(frozen=True, slots=True)
class StepWait:
    """What a stored step says about durable waits: when it wakes (epoch seconds), the signal
    it waits for, and the signal keys the step before it consumed."""

    wake_at: float | None = None
    signal: str | None = None
    consumed: tuple[str, ...] = ()

    @classmethod
    def of(cls, message: ProcedureMessage) -> StepWait:
        if message.wake_at is None and message.signal is None and not message.consumed:
            return NO_WAIT  # most messages: recovery asks this of every one it resumes
        return cls(message.wake_at, message.signal, message.consumed)

    @property
    def waits(self) -> bool:
        """Whether the step ends in a wait (a timer, a signal, or both)."""
        return self.wake_at is not None or self.signal is not None

    def describe(self) -> str:
        """The wait in words: `sleeping until {time}`, `waiting for signal 'name' [until {time}]`."""
        until = "" if self.wake_at is None else wake_at_text(self.wake_at)
        if self.signal is None:
            return f"sleeping until {until}"
        return f"waiting for signal {self.signal!r}" + (f" until {until}" if until else "")


NO_WAIT = StepWait()


class MessageDecodeError(ValueError):
    """A stored value is not a valid `ProcedureMessage`; the text says which field and why."""


UNDECODABLE = (msgspec.DecodeError, UnicodeDecodeError, RecursionError)
"""What a msgspec JSON decoder raises for a value it cannot read: besides its own errors,
invalid UTF-8 inside a JSON string comes out as `UnicodeDecodeError`, and arrays or objects
nested about a thousand deep (in a field it keeps whole, or one it skips) as
`RecursionError`. Every stored value is decoded catching these, so that such a value is
unreadable, never an internal error that stops a whole `start()`."""


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
    run: int = 1
    """The run that wrote it: 1 for a submit (and for a message without the field, written
    before runs were stored), one more for each resume or rewind. A child is created in its
    parent's run, so a run number never repeats for one id."""
    wake_at: float | None = None
    """Seconds since the epoch at which a step that returned `Status.sleep`, `sleep_until` or
    `wait_for_signal(..., timeout=)` wakes (None: no timer)."""
    signal: str | None = None
    """The signal name a step that returned `Status.wait_for_signal` waits for."""
    consumed: tuple[str, ...] = ()
    """The signal keys the step before this message consumed (delivered in `ctx.signals`):
    once this message is stored they are never delivered again, even if their deletion was lost."""
    extra: bytes = b""
    """The fields of the stored message that procstore does not know, as the members of a
    JSON object (`"context":{...}`), each value's bytes as stored: written back on every key
    procstore writes for the procedure, so that what another writer added is never lost."""

    def encode(self) -> bytes:
        """The exact bytes GreptimeDB would write for this message (its known fields first)."""
        obj: dict[str, Any] = {
            "type_name": self.type_name,
            "data": self.data,
            "parent_id": None if self.parent_id is None else str(self.parent_id),
            "step": self.step,
        }
        if self.error is not None:
            obj["error"] = self.error
        if self.run != 1:
            obj["run"] = self.run
        if self.wake_at is not None:
            obj["wake_at"] = self.wake_at
        if self.signal is not None:
            obj["signal"] = self.signal
        if self.consumed:
            obj["consumed"] = list(self.consumed)
        # orjson hands back its whole output buffer (4 KiB at the least) as the bytes object:
        # a store that keeps the value (memory://, mem://) held 4 KiB per key, most of the
        # memory of a procedure waiting in its step. A copy is exactly as long as the value.
        encoded = orjson.dumps(obj)
        if self.extra:
            return b"".join((memoryview(encoded)[:-1], b",", self.extra, b"}"))
        return bytes(memoryview(encoded))

    @classmethod
    def decode(cls, raw: bytes) -> ProcedureMessage:
        """Parse a stored value; raises `MessageDecodeError` saying what is wrong, and where
        (`$.step`, for a field)."""
        if not raw:
            raise MessageDecodeError("the value is empty (a truncated or torn write?)")
        if cls is ProcedureMessage and (direct := decoded_directly(raw)) is not None:
            return direct
        # Any value the direct pass refuses (a field it does not know, a step out of range) is
        # decoded again, for its unknown fields or the error saying why.
        try:
            stored = _decoder.decode(raw)
        except msgspec.ValidationError as e:
            raise MessageDecodeError(f"the value is not a procedure message: {e}") from None
        except RecursionError:
            raise MessageDecodeError("the value nests arrays or objects too deeply to be read") from None
        except UNDECODABLE as e:
            raise MessageDecodeError(f"the value is not JSON ({e}); it may be truncated") from None
        parent_id = None
        if stored.parent_id is not None:
            try:
                parent_id = ProcedureId.parse(stored.parent_id)
            except ValueError as e:
                raise MessageDecodeError(f"the value is not a procedure message: {e} - at `$.parent_id`") from None
        return cls(
            stored.type_name,
            stored.data,
            parent_id,
            stored.step,
            stored.error,
            stored.run,
            None if stored.wake_at is None else clamped_wake_at(stored.wake_at),
            stored.signal,
            tuple(stored.consumed),
            _unknown_fields(raw),
        )


def _unknown_fields(raw: bytes) -> bytes:
    """The members of the stored object that are not `ProcedureMessage`'s, each value's
    bytes exactly as stored (a number, a string or a nested object is never read and
    written again, so it comes back as it was)."""
    try:
        fields = _members_decoder.decode(raw)
    except UNDECODABLE as e:
        raise MessageDecodeError(f"the value is not JSON ({e})") from None
    unknown = (orjson.dumps(name) + b":" + bytes(value) for name, value in fields.items() if name not in _KNOWN_FIELDS)
    return b",".join(unknown)


class _StoredMessage(msgspec.Struct, kw_only=True):
    """The wire form read back: every field's type and range checked, unknown fields allowed
    (GreptimeDB has since added an optional `context`), `parent_id` and `error` optional."""

    type_name: str
    data: str
    parent_id: str | None = None
    step: Annotated[int, msgspec.Meta(ge=0, le=_U32_MAX)]
    error: str | None = None
    run: Annotated[int, msgspec.Meta(ge=1, le=_U32_MAX)] = 1
    wake_at: float | None = None
    signal: str | None = None
    consumed: list[str] = msgspec.field(default_factory=list)


_decoder = msgspec.json.Decoder(_StoredMessage)


def _procedure_id(type_: type, text: Any) -> Any:
    if type_ is ProcedureId:
        return ProcedureId.parse(text)  # a ValueError is a `ValidationError` at `$.parent_id`
    raise NotImplementedError(type_)


class _KnownFieldsOnly(msgspec.Struct, forbid_unknown_fields=True, gc=False):
    """Every field present (`parent_id` too, as GreptimeDB writes it) and no other."""

    type_name: str
    data: str
    parent_id: ProcedureId | None
    step: int
    error: str | None = None
    run: int = 1
    wake_at: float | None = None
    signal: str | None = None
    consumed: tuple[str, ...] = ()


_KNOWN_FIELDS = frozenset(_KnownFieldsOnly.__struct_fields__)
(
    _set_type_name,
    _set_data,
    _set_parent_id,
    _set_step,
    _set_error,
    _set_run,
    _set_wake_at,
    _set_signal,
    _set_consumed,
    _set_extra,
) = (
    vars(ProcedureMessage)[name].__set__
    for name in ("type_name", "data", "parent_id", "step", "error", "run", "wake_at", "signal", "consumed", "extra")
)


def decoded_directly(raw: bytes) -> ProcedureMessage | None:
    """The message a value of known fields only holds, in one pass (recovery decodes
    thousands); None for any other value, which `ProcedureMessage.decode` reads (or says why
    it cannot)."""
    try:
        known = _direct_decoder.decode(raw)
    except (msgspec.ValidationError, *UNDECODABLE):
        return None
    if 0 <= known.step <= _U32_MAX and 1 <= known.run <= _U32_MAX:
        return _message_of(known)
    return None


def _message_of(known: _KnownFieldsOnly) -> ProcedureMessage:
    """The message of a value with known fields only, its slots filled directly: the frozen
    dataclass's `__init__` costs as much again as the decoding (recovery decodes thousands)."""
    message = object.__new__(ProcedureMessage)
    _set_type_name(message, known.type_name)
    _set_data(message, known.data)
    _set_parent_id(message, known.parent_id)
    _set_step(message, known.step)
    _set_error(message, known.error)
    _set_run(message, known.run)
    # A stored wake-up time is kept within what every reader can show (any finite float may be stored).
    _set_wake_at(message, None if known.wake_at is None else clamped_wake_at(known.wake_at))
    _set_signal(message, known.signal)
    _set_consumed(message, known.consumed)
    _set_extra(message, b"")
    return message


_members_decoder = msgspec.json.Decoder(dict[str, msgspec.Raw])
_direct_decoder = msgspec.json.Decoder(_KnownFieldsOnly, dec_hook=_procedure_id)
