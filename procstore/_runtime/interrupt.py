"""A step interrupted by an operator's request at the await it is in.

An operator's cancel or fail is seen within `request_poll_interval` (or at once when made
through this manager). A procedure between attempts meets it at its next attempt; one
inside `execute()` would otherwise run to the end of its step, however long that awaits.
`RunningSteps.interrupt` cancels the runner's task there instead: the step's `await` raises
`CancelledError`, which `RunningStep.__exit__` turns into `OperatorRequested`, and the
procedure fails (rolling back if it can) as if the step had raised it. A block inside
`with ctx.uninterruptible():` is not cut: the interrupt waits for its end.

Only the step is cut, never procstore's own work: the window is exactly the `await` of
`execute()`, and a runner's task is suspended inside it only in user code.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from contextlib import contextmanager
from types import TracebackType

from procstore.ids import ProcedureId
from procstore.store.requests import OperatorRequest, OperatorRequested

_WHY = "procstore: the step is interrupted by an operator's request"


class RunningStep:
    """An attempt at a step inside `execute()`: `with steps.running(id, step) as step:`. One
    object serves every attempt of a runner (its `Context` holds `uninterruptible`), begun
    afresh by `RunningSteps.running` at each.

    Invariants: `task` is the runner's task, inside the `with` from enter to exit; it is
    cancelled at most once per attempt by the interrupt (`interrupted`), and never while
    `held > 0`."""

    __slots__ = ("_steps", "attempts", "ended", "held", "interrupted", "procedure_id", "request", "task")

    def __init__(self, steps: RunningSteps, procedure_id: ProcedureId) -> None:
        self._steps = steps
        self.procedure_id = procedure_id
        self.attempts = 0
        """Attempts begun: a block counts in the attempt it began in, and only there."""

    def begin(self, task: asyncio.Task[object]) -> None:
        """A new attempt, in `task`: nothing held, nothing interrupted yet."""
        self.attempts += 1
        self.task = task
        self.held = 0
        """Depth of `ctx.uninterruptible()` blocks the step is in."""
        self.request: OperatorRequest | None = None
        """The request that interrupts it, once one arrived (it may wait for `held` to reach 0)."""
        self.interrupted = False
        """The task was cancelled for `request`: its exit must take that cancel back."""
        self.ended = False
        """`execute()` has returned or raised: nothing may interrupt the task any more."""

    def interrupt(self, request: OperatorRequest) -> None:
        if self.request is None:
            self.request = request
        if not self.interrupted and self.held == 0 and not self.ended:
            self.interrupted = True
            self.task.cancel(_WHY)

    @contextmanager
    def uninterruptible(self) -> Iterator[None]:
        attempt = self.attempts
        self.held += 1
        try:
            yield
        finally:
            # A block that outlived its attempt (in a task the step started) leaves the
            # count of a later attempt alone: lowered, it would let that attempt's own
            # block be cut.
            if attempt == self.attempts:
                self.held -= 1
                if self.held == 0 and self.request is not None:
                    # Not `task.cancel()` now, from inside the task: a step that returns with
                    # no await after the block would carry that cancel into procstore's own
                    # awaits (3.11's `uncancel()` does not take back a cancel not yet
                    # delivered). Once the task yields, it is at an await of the step, or the
                    # step has ended.
                    asyncio.get_running_loop().call_soon(self.interrupt, self.request)

    def __enter__(self) -> RunningStep:
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self.ended = True
        self._steps.ended(self)
        if not self.interrupted:
            return  # a request held off to the step's end: its next attempt meets it
        stopping = self.task.uncancel() > 0  # the manager stopped too: the stop wins
        if stopping and isinstance(exc, asyncio.CancelledError):
            return
        assert self.request is not None
        raise OperatorRequested(self.request) from (None if isinstance(exc, asyncio.CancelledError) else exc)


class RunningSteps:
    """The steps inside `execute()` in a term, by procedure, for `OperatorRequests` to interrupt."""

    __slots__ = ("_running",)

    def __init__(self) -> None:
        self._running: dict[ProcedureId, RunningStep] = {}

    def running(self, procedure_id: ProcedureId, step: RunningStep | None = None) -> RunningStep:
        """The attempt beginning now in the current task: `step` (the runner's last one) begun
        again, or a new one."""
        task = asyncio.current_task()
        assert task is not None
        if step is None:
            step = RunningStep(self, procedure_id)
        step.begin(task)
        self._running[procedure_id] = step
        return step

    def ended(self, step: RunningStep) -> None:
        if self._running.get(step.procedure_id) is step:
            del self._running[step.procedure_id]

    def interrupt(self, procedure_id: ProcedureId, request: OperatorRequest) -> None:
        step = self._running.get(procedure_id)
        if step is not None:
            step.interrupt(request)
