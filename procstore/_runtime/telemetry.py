"""Traces, metrics and log fields for procedures.

With the `otel` extra (opentelemetry-api) installed, procstore reports to the global
OpenTelemetry tracer and meter providers, as libraries do: nothing is exported until the
application configures an SDK. Without it nothing is imported, and each hook is a call to
an empty method.

Traces: `procedure {type_name}` (one run of a procedure in this process, with each step's
progress as an event; a subprocedure's is a child of its parent's run, a submitted root's a
child of the caller's span, a recovered one's a trace of its own linked to the recovery),
`step {type_name}` (an attempt at a step that raised, with its retry; every attempt with
`TelemetrySettings(step_spans="every")`), `rollback {type_name}`, `procstore.recovery`,
`procstore.lease.acquire`. A store request is an event only when it failed or was slow.

Metrics (names and attributes in `docs/observability.md`): procedures submitted, ended
by outcome and running; step and procedure durations; retries by reason; store request
durations and errors by operation and backend; lease held, epoch, renewal duration and
takeovers; recovery duration and problems.

Log fields: every record of a procstore logger that is about a procedure (logged from its
runner, or passing `procedure_fields` from elsewhere) carries `procedure_id`, `type_name`
and `step` as record attributes, for JSON formatters to index.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.util
import os
import time
from collections.abc import Awaitable, Callable, Coroutine, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Literal, TypeVar

from procstore._logs import ProcedureScope, Stepping, enter_scope, get_logger, leave_scope
from procstore.errors import describe
from procstore.store.state_store import StateStore
from procstore.store.wrapping import WrappingStore

T = TypeVar("T")

logger = get_logger("procstore.runtime")


NOTHING = contextlib.nullcontext()
"""The span of every block when telemetry is off: one for all (it holds nothing, and a
procedure waiting in a step would otherwise hold two)."""


@dataclass(frozen=True)
class TelemetrySettings:
    """How a manager traces: `ProcedureManager(..., telemetry=TelemetrySettings(...))`.

    `telemetry=True` is `TelemetrySettings()`. Which traces are kept (sampling) is the
    OpenTelemetry SDK's sampler's choice: a run it does not sample costs no span work.

    Args:
        step_spans: `"failed"` (the default): a span for each attempt at a step that raised
            (retried or failed), and each step's progress as an event on its procedure's
            span; `"every"`: a span for every attempt, current while `execute()` runs (the
            spans an application makes in a step are its children).
        slow_store_request: seconds after which a store request that succeeded is an event
            on the current span; a failed one always is.
        root_spans: `"child"` (the default): a root submitted inside a span runs as a child
            of it; `"link"`: its run is a trace of its own, linked to that span. A root that
            a recovery or an operator's resume runs is always a trace of its own, linked.
        histogram_every: one step in this many, and one store request in this many, has
            its duration recorded in `procstore.step.duration` and `procstore.store.duration`
            (a uniform sample: percentiles hold; `procstore.steps` and
            `procstore.store.requests` count every one, `procstore.store.errors` every
            failure). A histogram record costs the SDK 10 to 20 us; 1 records every one.
    """

    step_spans: Literal["failed", "every"] = "failed"
    slow_store_request: float = 0.5
    root_spans: Literal["child", "link"] = "child"
    histogram_every: int = 8

    def __post_init__(self) -> None:
        if self.step_spans not in ("failed", "every") or self.root_spans not in ("child", "link"):
            raise ValueError(
                f"TelemetrySettings: step_spans is 'failed' or 'every', root_spans 'child' or 'link': {self!r}"
            )
        if not (isinstance(self.histogram_every, int) and self.histogram_every >= 1):
            raise ValueError(f"TelemetrySettings: histogram_every must be an int >= 1, not {self.histogram_every!r}")
        if not self.slow_store_request >= 0:
            raise ValueError(
                f"TelemetrySettings: slow_store_request must be >= 0 seconds, not {self.slow_store_request!r}"
            )


class Telemetry:
    """The hooks the runtime calls; this base class does nothing (telemetry off)."""

    enabled = False
    settings = TelemetrySettings()

    def configured(self, settings: TelemetrySettings) -> Telemetry:
        """These hooks with `settings` (sharing the instruments): one manager's telemetry."""
        return self

    def procedure_span(self, procedure_id: str, type_name: str, *, root: bool, submitted: bool, **attrs: Any) -> Any:
        """A run's span: `submitted` for a root's first run from `submit()` here."""
        return NOTHING

    def trace_parent(self) -> Any:
        """What a run started now runs under (the current span, say): kept by a procedure that
        parks in a durable wait, whose next run starts in a context of its own."""
        return None

    def under_trace_parent(self, parent: Any) -> None:
        """Make `parent` (from `trace_parent`) current in this context, one made for a new run."""

    def step_span(self, procedure_id: str, type_name: str, step: int, attempt: int) -> Any:
        return NOTHING

    def rollback_span(self, procedure_id: str, type_name: str, step: int) -> Any:
        return NOTHING

    def span(self, name: str, *, start_ns: int | None = None, **attrs: Any) -> Any:
        """A span around the block; `start_ns` (`time.time_ns()`) if it began earlier."""
        return NOTHING

    def retried(self, type_name: str, reason: BaseException) -> None:
        pass

    def submitted(self, type_name: str) -> None:
        pass

    def running(self, type_name: str, delta: int) -> None:
        pass

    def ended(self, type_name: str, outcome: str, seconds: float | None) -> None:
        pass

    def mark(self, span: Any, outcome: str | None, error: str | None) -> None:
        """Put a procedure's outcome on its span (None: it did not end here)."""

    async def store_call(self, operation: str, backend: str, call: Callable[[], Awaitable[T]]) -> T:
        return await call()

    def records_store_calls(self) -> bool:
        """Whether `store_call` reports anything now (False: a store call may skip it, and
        `step_span` is a no-op)."""
        return False

    def lease_gained(self, epoch: int | None) -> None:
        pass

    def lease_lost(self) -> None:
        pass

    def lease_renewed(self, seconds: float) -> None:
        pass

    def recovered(self, seconds: float, problems: int) -> None:
        pass


OFF = Telemetry()


def get_telemetry() -> Telemetry:
    """OpenTelemetry hooks if its API is installed, else `OFF` (without importing anything)."""
    global _shared
    if _shared is None:
        made: Telemetry = OFF  # `_shared` is set once made: a thread asking meanwhile makes its own
        if importlib.util.find_spec("opentelemetry") is not None:
            # `opentelemetry` may be only a namespace package (opentelemetry-proto installed
            # without opentelemetry-api): the API's own modules decide.
            try:
                from procstore._runtime.otel import OtelTelemetry
            except ImportError as e:
                logger.debug("telemetry off: the OpenTelemetry API cannot be imported (%s)", e)
            else:
                try:
                    made = OtelTelemetry()
                except Exception as e:  # a provider named in OTEL_PYTHON_* that the API cannot load
                    named = {
                        k: v for k, v in os.environ.items() if k.startswith("OTEL_PYTHON_") and k.endswith("_PROVIDER")
                    }
                    logger.warning(
                        "telemetry off: OpenTelemetry could not be set up (%s; %s); procedures run without it",
                        describe(e),
                        ", ".join(f"{k}={v!r}" for k, v in sorted(named.items()))
                        or "no provider named in the environment",
                    )
        _shared = made
    return _shared


_shared: Telemetry | None = None


@contextlib.contextmanager
def timed() -> Iterator[Callable[[], float]]:
    """`with timed() as elapsed:` ... `elapsed()` seconds since the block began."""
    start = time.perf_counter()
    yield lambda: time.perf_counter() - start


async def run_traced(
    ctx: Any, meta: Any, runner: Stepping, body: Callable[[], Awaitable[None]], *, submitted: bool
) -> None:
    """Run a runner's `body` inside its procedure's span, with its log fields set;
    `submitted` for a run that `submit()` started here (not a recovery's or a resume's)."""
    telemetry: Telemetry = ctx.settings.telemetry
    telemetry.running(meta.type_name, 1)
    scope = ProcedureScope(str(meta.id), meta.type_name, runner)
    enter_scope(scope)
    try:
        with telemetry.procedure_span(
            str(meta.id), meta.type_name, root=meta.is_root, submitted=submitted, **ctx.term.span_attributes
        ) as span:
            try:
                await body()
            except asyncio.CancelledError:
                telemetry.mark(span, None, None)  # the manager stopped: "stopped"
                raise
            state = meta.state
            ended = state.is_ended() and not meta.abandoned
            telemetry.mark(span, meta.outcome() if ended else None, state.error)
    finally:
        leave_scope(scope)
        telemetry.running(meta.type_name, -1)


def backend_of(url: str) -> str:
    """The store URL's scheme (`s3`, `gs`, `memory`), `file` for a local path."""
    scheme, sep, _ = url.partition("://")
    return scheme if sep else "file"


class TracedStore(WrappingStore):
    """Reports every request to the store (duration, errors) to `telemetry`."""

    def __init__(self, inner: StateStore, telemetry: Telemetry) -> None:
        super().__init__(inner)
        self.telemetry = telemetry
        self.backend = backend_of(inner.url)
        self.observes_crash_points = inner.observes_crash_points  # `crash_point` below skips `around`

    def passes(self, kind: str) -> bool:
        return not self.telemetry.records_store_calls()  # nothing would record it (no SDK)

    def around(
        self, kind: str, key: str, call: Callable[[], Coroutine[Any, Any, T]], value: bytes | None = None
    ) -> Coroutine[Any, Any, T]:
        if not self.telemetry.records_store_calls():
            return call()  # nothing would record it (no SDK): two coroutines fewer per request
        return self.telemetry.store_call(kind, self.backend, call)

    def crash_point(self, key: str) -> Coroutine[Any, Any, None]:
        return self.inner.crash_point(key)  # not a store request: nothing to report

    async def delete_in_order(self, first: Sequence[str], then: Sequence[str], folder: str) -> None:
        # The inner store's own: a local directory's deletes a folder with one fsync, where
        # the base class would make one request (and one fsync) per key.
        await self.around("delete_in_order", folder, lambda: self.inner.delete_in_order(first, then, folder))
