"""`--only observability`: what tracing and metrics cost a persisted step, on vs off.

"On" is what an application that exports telemetry runs: the OpenTelemetry SDK configured
with a batching span processor and a metric reader (exporters that drop what they get, so
that the network is not measured). "Off" is `telemetry=False`, the same code path a
process without the `otel` extra takes. Both managers run in this process, on stores of the
same kind, interleaved (five runs each), so the ratio is the cost of the hooks alone.
"""

from __future__ import annotations

from collections.abc import Sequence

from opentelemetry import metrics, trace
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult

from benchmarks.harness import Goal, Report, Row, interleaved
from benchmarks.stores import Target
from benchmarks.suites import both_emptied, manager, one_procedure


class _Dropped(SpanExporter):
    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        return SpanExportResult.SUCCESS


def configure_sdk() -> None:
    """The global providers, once per process (the API refuses a second)."""
    if isinstance(trace.get_tracer_provider(), TracerProvider):
        return
    tracing = TracerProvider()
    tracing.add_span_processor(BatchSpanProcessor(_Dropped()))
    trace.set_tracer_provider(tracing)
    metrics.set_meter_provider(MeterProvider(metric_readers=[InMemoryMetricReader()]))


async def observability_overhead(report: Report, target: Target, steps: int) -> None:
    configure_sdk()
    async with (
        manager(target.url(), target, telemetry=True) as on,
        manager(target.url(), target, telemetry=False) as off,
    ):
        settled = lambda: both_emptied(on, off)  # noqa: E731
        on_elapsed, off_elapsed = await interleaved(
            5, one_procedure(on, steps), one_procedure(off, steps), cleanup=settled
        )
    writes = steps + 1
    report.add(
        Row("observability", f"{target.name}: one persisted step, traced and metered, {steps}-step procedure",
            [1e3 * t / writes for t in on_elapsed], "ms", [1e3 * t / writes for t in off_elapsed],
            "the same, telemetry=False", Goal("<=", 1.01 if target.proxied else 1.05))
    )  # fmt: skip
