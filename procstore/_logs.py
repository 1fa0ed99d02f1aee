"""Log fields: records about a procedure carry its id, type and step.

Every procstore logger is made by `get_logger`, which adds `ProcedureFields`: a record
logged from a runner's task (whatever the module) gets `procedure_id`, `type_name` and
`step` attributes, which JSON formatters index (see docs/observability.md). A record about
one procedure logged elsewhere (a submit, the requests poll, the store's request keys)
passes them itself: `extra=procedure_fields(procedure_id, ...)`.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Protocol

from procstore._text import terminal_text


class Stepping(Protocol):
    """What is at a step that changes as it goes: a runner."""

    @property
    def step(self) -> int: ...


@dataclass(frozen=True, slots=True)
class ProcedureScope:
    """The procedure a runner task works on, for log records."""

    procedure_id: str
    type_name: str
    runner: Stepping

    def step(self) -> int:
        """The step it is at now (it changes as the runner goes)."""
        return self.runner.step


current_procedure: ContextVar[ProcedureScope | None] = ContextVar("procstore_procedure", default=None)

_running: dict[str, ProcedureScope] = {}
"""The procedures runners of this process work on, by id: fields for records logged outside them."""


def enter_scope(scope: ProcedureScope) -> None:
    """From now on in this task (a runner's), records carry `scope`'s fields, and until
    `leave_scope`, `procedure_fields` finds its type and current step from anywhere in the
    process. Two calls, not a context manager: a runner waiting in a step would hold one."""
    current_procedure.set(scope)
    _running[scope.procedure_id] = scope


def leave_scope(scope: ProcedureScope) -> None:
    if _running.get(scope.procedure_id) is scope:
        del _running[scope.procedure_id]


def procedure_fields(procedure_id: object, type_name: str | None = None, step: int | None = None) -> dict[str, object]:
    """`extra=` for a record about one procedure logged outside its runner's task.

    What the caller does not know (None) is taken from the procedure's runner if one runs
    here (its type, the step it is at), else left None.
    """
    pid = str(procedure_id)
    scope = _running.get(pid)
    if scope is not None:
        type_name = type_name if type_name is not None else scope.type_name
        step = step if step is not None else scope.step()
    return {"procedure_id": pid, "type_name": type_name, "step": step}


_trace_fields: Callable[[], tuple[str, str] | None] | None = None
"""The current span's (trace id, span id), once OpenTelemetry's API is in use."""


def set_trace_fields(current: Callable[[], tuple[str, str] | None]) -> None:
    """Called by the telemetry on OpenTelemetry: records then carry `trace_id` and `span_id`."""
    global _trace_fields
    _trace_fields = current


class ProcedureFields(logging.Filter):
    """Adds `procedure_id`, `type_name` and `step` to records logged within a runner, and
    `trace_id` and `span_id` (hex, as OpenTelemetry writes them) to records logged under a
    span, so that a log line leads to its trace."""

    def filter(self, record: logging.LogRecord) -> bool:
        scope = current_procedure.get()
        if scope is not None and not hasattr(record, "procedure_id"):
            record.procedure_id = scope.procedure_id
            record.type_name = scope.type_name
            record.step = scope.step()
        if _trace_fields is not None and not hasattr(record, "trace_id"):
            ids = _trace_fields()
            if ids is not None:
                record.trace_id, record.span_id = ids
        return True


class InertText(logging.Filter):
    """Makes a record's message inert text: its control characters (C0 with newlines, DEL,
    C1, the bidirectional overrides) escaped as `\x1b`, `\u202e`...

    procstore's messages name stored keys and values, which anyone who can write the bucket
    chooses: raw, an ESC sequence in a key name would set the title of the terminal a log
    is read on (or clear it), and a newline would forge a log line."""

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        inert = terminal_text(message)
        if inert != message:
            record.msg, record.args = inert, None
        return True


_FIELDS = ProcedureFields()
_INERT = InertText()


def get_logger(name: str) -> logging.Logger:
    """`logging.getLogger(name)`, with the procedure fields on every record it makes, and
    its message inert text."""
    logger = logging.getLogger(name)
    for wanted in (_FIELDS, _INERT):
        if wanted not in logger.filters:
            logger.addFilter(wanted)
    return logger
