"""`Telemetry` on the OpenTelemetry API (imported only when `opentelemetry` is installed)."""

from __future__ import annotations

import contextlib
import copy
import os
import time
from collections.abc import Awaitable, Callable, Iterator, Mapping
from contextvars import ContextVar
from typing import Any, TypeVar

from opentelemetry import context as otel_context
from opentelemetry import metrics, trace
from opentelemetry.metrics import CallbackOptions, NoOpMeterProvider, Observation
from opentelemetry.metrics import _internal as _metrics_api
from opentelemetry.trace import Link, Status, StatusCode

from procstore import __version__
from procstore._logs import get_logger, set_trace_fields
from procstore._runtime.telemetry import Telemetry, TelemetrySettings
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


_failed_attempt: ContextVar[tuple[trace.Span, int] | None] = ContextVar("procstore_failed_attempt", default=None)
"""The span of the runner's last attempt that raised, and when it ended, kept open until
`retried` puts the retry on it (or the runner goes on): however many steps a procedure has,
its retries are on spans of their own, never dropped by the SDK's limit of events a span
keeps. Per runner task: each runner is a task, with its own context."""


def _end_failed_attempt(retry: dict[str, str] | None = None) -> None:
    held = _failed_attempt.get()
    if held is None:
        return
    _failed_attempt.set(None)
    span, ended_ns = held
    try:
        if retry is not None:
            span.add_event("retry", retry, timestamp=ended_ns)
        span.end(end_time=ended_ns)
    except Exception as e:
        _spans_failed(e)


class Attempt:
    """One attempt at a step, without a span of its own while it runs (`step_spans="failed"`,
    or no tracer provider): its duration is recorded, its success is a `step` event on the
    procedure's span, and an exception makes its span then, begun when the attempt did."""

    __slots__ = ("_attempt", "_procedure_id", "_start", "_start_ns", "_step", "_telemetry", "_type_name")

    def __init__(self, telemetry: OtelTelemetry, procedure_id: str, type_name: str, step: int, attempt: int) -> None:
        self._telemetry = telemetry
        self._procedure_id = procedure_id
        self._type_name = type_name
        self._step = step
        self._attempt = attempt
        self._start = 0.0
        self._start_ns = 0

    def __enter__(self) -> None:
        _end_failed_attempt()
        self._start = time.perf_counter()
        self._start_ns = time.time_ns()

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None, tb: Any) -> None:
        telemetry = self._telemetry
        if telemetry.metering():
            telemetry.step_ended(self._type_name, time.perf_counter() - self._start)
        if not telemetry._tracing():
            return
        try:
            if error is None:
                span = trace.get_current_span()
                if span.is_recording():
                    span.add_event("step", {"procstore.step": self._step, "procstore.attempt": self._attempt})
                return
            span = telemetry.tracer.start_span(
                f"step {self._type_name}",
                attributes=_step_attributes(self._procedure_id, self._type_name, self._step, self._attempt),
                start_time=self._start_ns,
            )
            _mark_failed(span, error)
            _failed_attempt.set((span, time.time_ns()))
        except Exception as e:
            _spans_failed(e)


class _Unrecorded:
    """An attempt at a step while nothing records (no SDK yet): nothing to do at its start;
    a meter provider set during it counts it in `procstore.steps` (untimed: it was not).
    One per type, shared by its attempts."""

    __slots__ = ("_telemetry", "_type_name")

    def __init__(self, telemetry: OtelTelemetry, type_name: str) -> None:
        self._telemetry = telemetry
        self._type_name = type_name

    def __enter__(self) -> None:
        pass

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None, tb: Any) -> None:
        if self._telemetry.metering():
            self._telemetry.step_ended(self._type_name, None)


def _mark_failed(span: trace.Span, error: BaseException) -> None:
    span.record_exception(error)
    span.set_status(Status(StatusCode.ERROR, f"{type(error).__name__}: {error}"))


def _attributes(procedure_id: str, type_name: str, more: Mapping[str, Any]) -> dict[str, Any]:
    """A procedure's span attributes: its id and type, then `more`."""
    return {"procstore.procedure.id": procedure_id, "procstore.procedure.type": type_name, **more}


def _step_attributes(procedure_id: str, type_name: str, step: int, attempt: int) -> dict[str, Any]:
    return _attributes(procedure_id, type_name, {"procstore.step": step, "procstore.attempt": attempt})


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
        self.store_duration = meter.create_histogram(
            "procstore.store.duration", "s", "Store requests (a sample: one in TelemetrySettings.histogram_every)"
        )
        self._store_requests: dict[tuple[str, str], list[int]] = {}
        """Requests made, ok and failed, by (operation, backend): counted here, read by the SDK
        when it collects (a record per request costs the SDK 10-16 us, a count 0.1)."""
        meter.create_observable_counter(
            "procstore.store.requests", [self._observe_store_requests], "{request}", "Store requests, by outcome"
        )
        self._steps: dict[str, list[int]] = {}
        """Attempts at steps ended, by type (a one-item list: counted in place)."""
        meter.create_observable_counter(
            "procstore.steps", [self._observe_steps], "{attempt}", "Attempts at steps ended, by type"
        )

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
        self._unrecorded: dict[str, _Unrecorded] = {}
        """The attempt of each type while nothing records (`step_span`)."""
        self.recovery_problems = meter.create_counter(
            "procstore.recovery.problems", "{procedure}", "Procedures a recovery could not load"
        )
        self.settings = TelemetrySettings()
        set_trace_fields(_trace_fields)

    def configured(self, settings: TelemetrySettings) -> Telemetry:
        if settings == self.settings:
            return self
        made = copy.copy(self)  # the same instruments, and what is known of the providers
        made.settings = settings
        made._unrecorded = {}
        return made

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
        if self._metered or self._traced:
            return True
        if (
            getattr(_metrics_api, "_METER_PROVIDER", _UNKNOWN) is None
            and getattr(trace, "_TRACER_PROVIDER", _UNKNOWN) is None
            and not self._provider_in_environment
        ):
            return False  # no SDK yet, the common case asked at every request: one call, not four
        return self.metering() or self._tracing()

    def procedure_span(self, procedure_id: str, type_name: str, *, root: bool, submitted: bool, **attrs: Any) -> Any:
        own_trace = root and not (submitted and self.settings.root_spans == "child")
        if not self._traced:
            # Once a run, not three times a step: a provider named in the environment since
            # the last run (a test's `setenv`, say) is loaded by the API at `_tracing`'s ask;
            # one that could not be loaded is not asked for again.
            named = os.environ.get(_PROVIDER_FROM_ENVIRONMENT)
            self._provider_in_environment = named is not None and named != self._unloadable
        if self._tracing():
            # A root whose span cannot be made runs outside the caller's trace all the same:
            # its steps' spans would otherwise land in the caller's span.
            made = self._procedure_span(procedure_id, type_name, own_trace=own_trace, **attrs)
            return _Guarded(made, self._no_span(root))
        return self._no_span(own_trace)

    @staticmethod
    def _no_span(own_trace: bool) -> Any:
        # No SDK: the API's span would record nothing, yet a procedure waiting in a step would
        # hold it, its context, tokens and context managers while it waits. Only what it would
        # change is done: a run in a trace of its own has no current span inside it.
        if own_trace and trace.get_current_span().get_span_context().is_valid:
            return use_context(trace.set_span_in_context(trace.INVALID_SPAN))
        return _NO_SPAN

    @contextlib.contextmanager
    def _procedure_span(self, procedure_id: str, type_name: str, *, own_trace: bool, **attrs: Any) -> Iterator[Any]:
        attributes = _attributes(procedure_id, type_name, attrs)
        context, links = None, []
        try:
            if own_trace:
                # A trace of its own, linked to what started it (a recovery, a resume, or a
                # submit with root_spans="link"): a recovery that resumes a thousand
                # procedures is not one trace.
                parent = trace.get_current_span().get_span_context()
                context, links = otel_context.Context(), [Link(parent)] if parent.is_valid else []
            with self.tracer.start_as_current_span(
                f"procedure {type_name}", context=context, links=links, attributes=attributes
            ) as span:
                yield span
        finally:
            _end_failed_attempt()  # its last attempt's span, if it failed for good

    def trace_parent(self) -> Any:
        return otel_context.get_current()

    def under_trace_parent(self, parent: Any) -> None:
        if parent is not None:
            # Never detached: the context is the new run's alone, and ends with its task.
            otel_context.attach(parent)

    def step_span(self, procedure_id: str, type_name: str, step: int, attempt: int) -> Any:
        if not self.records_store_calls():
            # Nothing would see the attempt (no SDK): no span, no timing, no object made. No
            # attempt's span can be held either (`_end_failed_attempt`): only a tracer makes one.
            unrecorded = self._unrecorded.get(type_name)
            if unrecorded is None:
                unrecorded = self._unrecorded[type_name] = _Unrecorded(self, type_name)
            return unrecorded
        attempt_only = Attempt(self, procedure_id, type_name, step, attempt)
        if self.settings.step_spans == "every" and self._tracing():
            return _Guarded(self._step_span(procedure_id, type_name, step, attempt), attempt_only)
        return attempt_only

    @contextlib.contextmanager
    def _step_span(self, procedure_id: str, type_name: str, step: int, attempt: int) -> Iterator[Any]:
        # Attached by hand, a few microseconds cheaper than `start_as_current_span` (see
        # benchmarks/observability.py).
        _end_failed_attempt()
        start = time.perf_counter()
        span = self.tracer.start_span(
            f"step {type_name}", attributes=_step_attributes(procedure_id, type_name, step, attempt)
        )
        token = otel_context.attach(trace.set_span_in_context(span))
        failed = False
        try:
            yield span
        except BaseException as e:
            failed = True
            _mark_failed(span, e)
            raise
        finally:
            otel_context.detach(token)
            try:
                if failed:
                    _failed_attempt.set((span, time.time_ns()))  # ended once its retry is on it
                else:
                    span.end()
            finally:  # the metric, even when a span processor fails at the end
                self.step_ended(type_name, time.perf_counter() - start)

    def rollback_span(self, procedure_id: str, type_name: str, step: int) -> Any:
        if not self._tracing():
            return _NO_SPAN
        _end_failed_attempt()
        attributes = _attributes(procedure_id, type_name, {"procstore.step": step})
        return _Guarded(self.tracer.start_as_current_span(f"rollback {type_name}", attributes=attributes), _NO_SPAN)

    def span(self, name: str, *, start_ns: int | None = None, **attrs: Any) -> Any:
        return _Guarded(self.tracer.start_as_current_span(name, attributes=attrs, start_time=start_ns), _NO_SPAN)

    def retried(self, type_name: str, reason: BaseException) -> None:
        kind = type(reason).__name__
        self.retries.add(1, {"procstore.procedure.type": type_name, "procstore.retry.reason": kind})
        if self._tracing():
            event = {"procstore.retry.reason": kind, "exception.message": str(reason)}
            if _failed_attempt.get() is not None:
                _end_failed_attempt(event)  # on the span of the attempt that is retried
            else:
                trace.get_current_span().add_event("retry", event)  # a rollback's, a submit's

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

    def _observe_store_requests(self, _options: CallbackOptions) -> Iterator[Observation]:
        for (operation, backend), counts in list(self._store_requests.items()):
            ok, failed = self._store_attributes(operation, backend)
            yield Observation(counts[0], ok)
            yield Observation(counts[1], failed)

    def _observe_steps(self, _options: CallbackOptions) -> Iterator[Observation]:
        for type_name, count in list(self._steps.items()):
            yield Observation(count[0], {"procstore.procedure.type": type_name})

    def step_ended(self, type_name: str, seconds: float | None) -> None:
        """An attempt at a step ended: counted, and one in `histogram_every` timed (None: untimed)."""
        count = self._steps.get(type_name)
        if count is None:
            count = self._steps.setdefault(type_name, [0])
        count[0] += 1
        if seconds is not None and (count[0] - 1) % self.settings.histogram_every == 0:  # the first, then 1 in N
            self.step_duration.record(seconds, {"procstore.procedure.type": type_name})

    async def store_call(self, operation: str, backend: str, call: Callable[[], Awaitable[T]]) -> T:
        counts = self._store_requests.get((operation, backend))
        if counts is None:
            counts = self._store_requests.setdefault((operation, backend), [0, 0])
        start = time.perf_counter()
        try:
            result = await call()
        except Exception as e:
            elapsed = time.perf_counter() - start
            counts[1] += 1
            ok, failed = self._store_attributes(operation, backend)
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
        counts[0] += 1
        if (counts[0] - 1) % self.settings.histogram_every == 0:  # each kind's first, then one in N
            self.store_duration.record(elapsed, self._store_attributes(operation, backend)[0])
        if elapsed < self.settings.slow_store_request or not self._tracing():
            return result  # counted: an event per request would crowd out the rest
        ok = self._store_attributes(operation, backend)[0]
        span = trace.get_current_span()
        if span.is_recording():
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


def _trace_fields() -> tuple[str, str] | None:
    """The current span's trace and span ids, in the W3C hex form, for log records."""
    context = trace.get_current_span().get_span_context()
    if not context.is_valid:
        return None
    return f"{context.trace_id:032x}", f"{context.span_id:016x}"
