"""`Telemetry` on the OpenTelemetry API (imported only when `opentelemetry` is installed)."""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Awaitable, Callable, Iterator
from typing import Any, TypeVar

from opentelemetry import context as otel_context
from opentelemetry import metrics, trace
from opentelemetry.metrics import NoOpMeterProvider
from opentelemetry.metrics import _internal as _metrics_api
from opentelemetry.trace import Link, Status, StatusCode

from procstore import __version__
from procstore._logs import get_logger
from procstore._runtime.telemetry import Telemetry
from procstore.errors import describe

T = TypeVar("T")

logger = get_logger("procstore.runtime")

_SCOPE = "procstore"
_NO_SDK = (trace.ProxyTracerProvider, trace.NoOpTracerProvider)
_PROVIDER_FROM_ENVIRONMENT = "OTEL_PYTHON_TRACER_PROVIDER"
"""The variable naming a tracer provider that the API loads at its first look."""
_UNKNOWN = object()
_NO_SPAN = contextlib.nullcontext(trace.INVALID_SPAN)
"""A procedure's span without an SDK, when it changes nothing: one for all, it holds nothing."""


class StepTimer:
    """A step's duration metric without its span (no tracer provider): all a waiting step
    holds. Recorded at the step's end if a meter provider is set by then, as the API's
    proxy instrument would: one set while the step ran gets it."""

    __slots__ = ("_start", "_telemetry", "_type_name")

    def __init__(self, telemetry: OtelTelemetry, type_name: str) -> None:
        self._telemetry = telemetry
        self._type_name = type_name
        self._start = 0.0

    def __enter__(self) -> None:
        self._start = time.perf_counter()

    def __exit__(self, *_exc: object) -> None:
        if self._telemetry.metering():
            elapsed = time.perf_counter() - self._start
            self._telemetry.step_duration.record(elapsed, {"procstore.procedure.type": self._type_name})


class _Guarded:
    """A span's context manager whose own failures (an SDK's span processor that raises, a
    provider whose `get_tracer` does) are logged, never the procedure's: the run or the
    step goes on as without an SDK (`fallback`, what `_tracing()` false would have used),
    and an exception of its body passes through unchanged.

    Without it such an error failed the procedure for good, or ended its runner's task
    with nothing but a debug line while its watchers waited forever."""

    __slots__ = ("_active", "_fallback", "_inner")

    def __init__(
        self, inner: contextlib.AbstractContextManager[Any], fallback: contextlib.AbstractContextManager[Any]
    ) -> None:
        self._inner = inner
        self._fallback = fallback
        self._active: contextlib.AbstractContextManager[Any] | None = None
        """The one entered: `inner`, or `fallback` if entering `inner` failed."""

    def __enter__(self) -> Any:
        try:
            span = self._inner.__enter__()
        except Exception as e:
            _spans_failed(e)
            self._active = self._fallback
            return self._fallback.__enter__()
        self._active = self._inner
        return span

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None, tb: Any) -> bool:
        if self._active is None:
            return False
        try:
            return bool(self._active.__exit__(kind, error, tb))
        except Exception as e:
            if e is error:
                raise  # the body's own, re-raised by the span: it goes on as it came
            _spans_failed(e)
            return False  # the body's exception, if any, goes on unchanged


_span_failures: set[tuple[type[BaseException], str, int | None]] = set()
"""Where spans failed (the error's type and the innermost line it came from): each place is
logged once per process, however its message varies (an exporter's "dropped span 3f2a...")."""
_SPAN_FAILURES_LOGGED = 20


def _spans_failed(e: Exception) -> None:
    tb = e.__traceback__
    while tb is not None and tb.tb_next is not None:
        tb = tb.tb_next
    where = (type(e), tb.tb_frame.f_code.co_filename if tb else "", tb.tb_lineno if tb else None)
    if where in _span_failures or len(_span_failures) > _SPAN_FAILURES_LOGGED:
        return
    _span_failures.add(where)
    if len(_span_failures) > _SPAN_FAILURES_LOGGED:
        logger.warning("spans keep failing in new places; no more such warnings in this process")
        return
    logger.warning("a span could not be made or ended (%s); procedures go on without it", describe(e), exc_info=e)


@contextlib.contextmanager
def use_context(context: otel_context.Context) -> Iterator[Any]:
    token = otel_context.attach(context)
    try:
        yield trace.INVALID_SPAN
    finally:
        otel_context.detach(token)


class OtelTelemetry(Telemetry):
    """Spans on the global tracer provider, instruments on the global meter provider.

    The providers are looked up at each call through the API's proxies, so an SDK that the
    application configures after importing procstore is used all the same.
    """

    enabled = True

    def __init__(self) -> None:
        # The API's proxy, not `get_tracer()`: that one loads a provider named in the
        # environment now, and one that cannot be loaded would fail the manager's start.
        # `_tracing` loads it instead (and warns once if it cannot); the proxy then uses it.
        self.tracer: trace.Tracer = trace.ProxyTracer(_SCOPE, __version__)
        meter = metrics.get_meter(_SCOPE, __version__)
        self.submitted_count = meter.create_counter(
            "procstore.procedures.submitted", "{procedure}", "Procedures submitted"
        )
        self.ended_count = meter.create_counter(
            "procstore.procedures.ended", "{procedure}", "Procedures ended, by outcome"
        )
        self.running_now = meter.create_up_down_counter(
            "procstore.procedures.running", "{procedure}", "Procedures running in this process now"
        )
        self.step_duration = meter.create_histogram("procstore.step.duration", "s", "One attempt at a step")
        self.procedure_duration = meter.create_histogram(
            "procstore.procedure.duration", "s", "From start (or resume) to end, in this process"
        )
        self.retries = meter.create_counter("procstore.retries", "{retry}", "Retries of steps, by reason")
        self.store_duration = meter.create_histogram("procstore.store.duration", "s", "Store requests")
        self.store_errors = meter.create_counter("procstore.store.errors", "{error}", "Store requests that failed")
        self.lease_held_now = meter.create_up_down_counter(
            "procstore.lease.held", "{lease}", "1 while this manager holds the lease"
        )
        self.lease_epoch = meter.create_gauge("procstore.lease.epoch", "{epoch}", "The lease epoch of this term")
        self.lease_renewal = meter.create_histogram("procstore.lease.renewal.duration", "s", "Lease renewals")
        self.takeovers = meter.create_counter("procstore.lease.takeovers", "{term}", "Terms begun by this manager")
        self.recovery_duration = meter.create_histogram("procstore.recovery.duration", "s", "Recoveries at start")
        self._attributes: dict[tuple[str, str], tuple[dict[str, str], dict[str, str]]] = {}
        self._traced = False
        self._metered = False
        self._provider_in_environment = _PROVIDER_FROM_ENVIRONMENT in os.environ
        self._unloadable: str | None = None
        """A provider's name in the environment that the API failed to load (warned once)."""
        self.recovery_problems = meter.create_counter(
            "procstore.recovery.problems", "{procedure}", "Procedures a recovery could not load"
        )

    def _tracing(self) -> bool:
        """Whether spans record: a tracer provider other than the API's proxy (no SDK yet)
        or its no-op one is set. Once one is, it stays: the API sets it only once.

        Asked three times a step. Until a provider is set, the API's `get_tracer_provider()`
        looks in `os.environ` on every call (2 us, a tenth of a step's CPU on memory), so
        the API's global is read first: no provider set, and none named in the environment
        when the current procedure run began (`procedure_span` looks again), is an answer
        without that look. Where the global is not there (another version of the API), the
        API is asked, as before."""
        if not self._traced:
            if getattr(trace, "_TRACER_PROVIDER", _UNKNOWN) is None and not self._provider_in_environment:
                return False
            named = os.environ.get(_PROVIDER_FROM_ENVIRONMENT)  # before the load: what it loads
            try:
                provider = trace.get_tracer_provider()
            except Exception as e:  # a provider named in the environment that cannot be loaded
                self._unloadable = named
                self._provider_in_environment = False
                logger.warning(
                    "no traces: the tracer provider %s=%r cannot be loaded (%s); procedures run without spans",
                    _PROVIDER_FROM_ENVIRONMENT,
                    self._unloadable,
                    describe(e),
                )
                return False
            self._traced = not isinstance(provider, _NO_SDK)
        return self._traced

    def metering(self) -> bool:
        """Whether instruments record: a meter provider other than the API's no-op one is set.
        Once one is, it stays (the API sets it only once).

        Until then the instruments made at `__init__` are the API's proxies, which drop
        every record until a provider is set (`set_meter_provider`, or the API loading one
        named in the environment, which it does only when asked for a provider): a record
        skipped now is one nothing would have seen. Where the API's global is not there
        (another version of the API), every record is made, as before."""
        if not self._metered:
            provider = getattr(_metrics_api, "_METER_PROVIDER", _UNKNOWN)
            self._metered = provider is not None and not isinstance(provider, NoOpMeterProvider)
        return self._metered

    def records_store_calls(self) -> bool:
        return self._metered or self._traced or self.metering() or self._tracing()

    def procedure_span(self, procedure_id: str, type_name: str, *, root: bool, **attrs: Any) -> Any:
        if not self._traced:
            # Once a run, not three times a step: a provider named in the environment since
            # the last run (a test's `setenv`, say) is loaded by the API at `_tracing`'s ask;
            # one that could not be loaded is not asked for again.
            named = os.environ.get(_PROVIDER_FROM_ENVIRONMENT)
            self._provider_in_environment = named is not None and named != self._unloadable
        if self._tracing():
            return _Guarded(self._procedure_span(procedure_id, type_name, root=root, **attrs), self._no_span(root))
        return self._no_span(root)

    @staticmethod
    def _no_span(root: bool) -> Any:
        # No SDK: the API's span would record nothing, yet a procedure waiting in a step would
        # hold it, its context, tokens and context managers while it waits. Only what it would
        # change is done: a root's run is a trace of its own (no current span inside it).
        if root and trace.get_current_span().get_span_context().is_valid:
            return use_context(trace.set_span_in_context(trace.INVALID_SPAN))
        return _NO_SPAN

    @contextlib.contextmanager
    def _procedure_span(self, procedure_id: str, type_name: str, *, root: bool, **attrs: Any) -> Iterator[Any]:
        attributes: dict[str, Any] = {
            "procstore.procedure.id": procedure_id,
            "procstore.procedure.type": type_name,
            **attrs,
        }
        if root:
            # A root's run is a trace of its own, linked to what started it (a submit, a
            # recovery): a recovery that resumes a thousand procedures is not one trace.
            parent = trace.get_current_span().get_span_context()
            links = [Link(parent)] if parent.is_valid else []
            with self.tracer.start_as_current_span(
                f"procedure {type_name}", context=otel_context.Context(), links=links, attributes=attributes
            ) as span:
                yield span
        else:
            with self.tracer.start_as_current_span(f"procedure {type_name}", attributes=attributes) as span:
                yield span

    def step_span(self, procedure_id: str, type_name: str, step: int, attempt: int) -> Any:
        if self._tracing():
            return _Guarded(self._step_span(type_name, step, attempt), StepTimer(self, type_name))
        # No SDK: the span's parent would be the current span, which it would leave as it is.
        return StepTimer(self, type_name)

    @contextlib.contextmanager
    def _step_span(self, type_name: str, step: int, attempt: int) -> Iterator[Any]:
        # On every attempt: the span is attached by hand, a few microseconds cheaper than
        # `start_as_current_span` (see benchmarks/observability.py).
        # Id and type are on the procedure's span, this span's parent: each attribute is
        # validated on every attempt, so only what differs goes here.
        attributes: dict[str, Any] = {"procstore.step": step, "procstore.attempt": attempt}
        start = time.perf_counter()
        span = self.tracer.start_span(f"step {type_name}", attributes=attributes)
        token = otel_context.attach(trace.set_span_in_context(span))
        try:
            yield span
        except BaseException as e:
            span.record_exception(e)
            span.set_status(Status(StatusCode.ERROR, f"{type(e).__name__}: {e}"))
            raise
        finally:
            otel_context.detach(token)
            try:
                span.end()
            finally:  # the metric, even when a span processor fails at the end
                self.step_duration.record(time.perf_counter() - start, {"procstore.procedure.type": type_name})

    def span(self, name: str, *, start_ns: int | None = None, **attrs: Any) -> Any:
        return _Guarded(self.tracer.start_as_current_span(name, attributes=attrs, start_time=start_ns), _NO_SPAN)

    def retried(self, type_name: str, reason: BaseException) -> None:
        kind = type(reason).__name__
        self.retries.add(1, {"procstore.procedure.type": type_name, "procstore.retry.reason": kind})
        if self._tracing():
            event = {"procstore.retry.reason": kind, "exception.message": str(reason)}
            trace.get_current_span().add_event("retry", event)

    def submitted(self, type_name: str) -> None:
        self.submitted_count.add(1, {"procstore.procedure.type": type_name})

    def running(self, type_name: str, delta: int) -> None:
        self.running_now.add(delta, {"procstore.procedure.type": type_name})

    def ended(self, type_name: str, outcome: str, seconds: float | None) -> None:
        attributes = {"procstore.procedure.type": type_name}
        self.ended_count.add(1, {**attributes, "procstore.outcome": outcome})
        if seconds is not None:
            self.procedure_duration.record(seconds, {**attributes, "procstore.outcome": outcome})

    def mark(self, span: Any, outcome: str | None, error: str | None) -> None:
        try:
            if outcome is None:
                span.set_attribute("procstore.outcome", "stopped")  # the manager stopped or lost its lease
                return
            span.set_attribute("procstore.outcome", outcome)
            if outcome != "done":
                span.set_status(Status(StatusCode.ERROR, error or outcome))
        except Exception as e:
            _spans_failed(e)

    async def store_call(self, operation: str, backend: str, call: Callable[[], Awaitable[T]]) -> T:
        ok, failed = self._store_attributes(operation, backend)
        start = time.perf_counter()
        try:
            result = await call()
        except Exception as e:
            elapsed = time.perf_counter() - start
            self.store_errors.add(1, failed)
            self.store_duration.record(elapsed, failed)
            if self._tracing():
                event: dict[str, str | float] = {
                    **failed,
                    "procstore.store.seconds": elapsed,
                    "exception.message": str(e),
                }
                trace.get_current_span().add_event("store request", event)
            raise
        elapsed = time.perf_counter() - start
        self.store_duration.record(elapsed, ok)
        if not self._tracing():
            return result  # no span records it: skip looking for one (each request)
        span = trace.get_current_span()
        if span.is_recording():
            # All four attributes: about 1.5 us more per request than operation and seconds
            # alone, against a persisted step's milliseconds; and a request may happen under
            # a span that has no backend (the lease's, an application's around `submit()`).
            span.add_event("store request", {**ok, "procstore.store.seconds": elapsed})
        return result

    def _store_attributes(self, operation: str, backend: str) -> tuple[dict[str, str], dict[str, str]]:
        # Built once per (operation, backend): a step makes a few requests, each recorded.
        found = self._attributes.get((operation, backend))
        if found is None:
            base = {"procstore.store.operation": operation, "procstore.store.backend": backend}
            found = {**base, "procstore.store.outcome": "ok"}, {**base, "procstore.store.outcome": "error"}
            self._attributes[(operation, backend)] = found
        return found

    def lease_gained(self, epoch: int | None) -> None:
        self.lease_held_now.add(1)
        self.takeovers.add(1)
        if epoch is not None:
            self.lease_epoch.set(epoch)

    def lease_lost(self) -> None:
        self.lease_held_now.add(-1)

    def lease_renewed(self, seconds: float) -> None:
        self.lease_renewal.record(seconds)

    def recovered(self, seconds: float, problems: int) -> None:
        self.recovery_duration.record(seconds)
        if problems:
            self.recovery_problems.add(problems)
