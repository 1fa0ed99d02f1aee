"""Log fields: records about a procedure carry its id, type and step.

Every procstore logger is made by `get_logger`, which adds `ProcedureFields`: a record
logged from a runner's task (whatever the module) gets `procedure_id`, `type_name` and
`step` attributes, which JSON formatters index (see docs/observability.md).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from contextvars import ContextVar
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class ProcedureScope:
    """The procedure a runner task works on, for log records."""

    procedure_id: str
    type_name: str
    step: Callable[[], int]
    """The step it is at now (it changes as the runner goes)."""


current_procedure: ContextVar[ProcedureScope | None] = ContextVar("procstore_procedure", default=None)


class ProcedureFields(logging.Filter):
    """Adds `procedure_id`, `type_name` and `step` to records logged within a runner."""

    def filter(self, record: logging.LogRecord) -> bool:
        scope = current_procedure.get()
        if scope is not None and not hasattr(record, "procedure_id"):
            record.procedure_id = scope.procedure_id
            record.type_name = scope.type_name
            record.step = scope.step()
        return True


_FIELDS = ProcedureFields()


def get_logger(name: str) -> logging.Logger:
    """`logging.getLogger(name)`, with the procedure fields on every record it makes."""
    logger = logging.getLogger(name)
    if _FIELDS not in logger.filters:
        logger.addFilter(_FIELDS)
    return logger
