"""Traces, metrics and log fields, read back from the OpenTelemetry SDK's in-memory exporters."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from opentelemetry import metrics, trace
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from procstore import (
    Context,
    Lease,
    Procedure,
    ProcedureFailed,
    ProcedureId,
    ProcedureWithId,
    Status,
    TelemetrySettings,
)
from procstore.store.history import HistoryStore
from procstore.store.local import LocalDirStore
from procstore.store.requests import OperatorRequest, RequestStore
from procstore.testing import Fault, FaultyStore, kill_manager
from tests.procedures import Parent, Undoable, World
from tests.runtime.helpers import blocker, steps
from tests.runtime.test_timers import Sleeper
from tests.support import manager_for

SPANS = InMemorySpanExporter()
READER = InMemoryMetricReader()


@pytest.fixture(scope="module", autouse=True)
def providers() -> None:
    """The SDK, as an application configures it (once per process: the API allows no second)."""
    if not isinstance(trace.get_tracer_provider(), TracerProvider):
        provider = TracerProvider()
        provider.add_span_processor(SimpleSpanProcessor(SPANS))
        trace.set_tracer_provider(provider)
        metrics.set_meter_provider(MeterProvider(metric_readers=[READER]))


@pytest.fixture(autouse=True)
def fresh() -> Iterator[None]:
    SPANS.clear()
    yield


def spans_of(procedure_id: object) -> list[ReadableSpan]:
    """The procedure's spans: its runs, attempts and rollbacks (each names the procedure)."""
    wanted = str(procedure_id)
    return [s for s in SPANS.get_finished_spans() if (s.attributes or {}).get("procstore.procedure.id") == wanted]


def points(name: str) -> list[Any]:
    data = READER.get_metrics_data()
    if data is None:  # nothing recorded yet
        return []
    return [
        point
        for rm in data.resource_metrics
        for sm in rm.scope_metrics
        for metric in sm.metrics
        if metric.name == name
        for point in metric.data.data_points
    ]


def total(name: str, **attributes: Any) -> float:
    wanted = attributes.items()
    values = [p.value for p in points(name) if all((p.attributes or {}).get(k) == v for k, v in wanted)]
    return float(sum(values))


async def test_a_retried_step_is_a_span_per_attempt_that_raised_with_its_retry(tmp_path: Path) -> None:
    world = World.new()
    async with manager_for(LocalDirStore(tmp_path)) as manager:
        procedure = steps(world, 2, retry_at=1, retries=2)
        await (await manager.submit(procedure)).wait()
    spans = spans_of(procedure.id)
    run = [s for s in spans if s.name == "procedure test::Steps"]
    attempts = [s for s in spans if s.name == "step test::Steps"]
    assert len(run) == 1 and run[0].attributes["procstore.outcome"] == "done"  # type: ignore[index]
    assert run[0].attributes["procstore.store.backend"] == "file"  # type: ignore[index]
    # The two attempts that raised, each with its retry; the step's progress on the run.
    assert [(a.attributes or {}).get("procstore.attempt") for a in attempts] == [1, 2]
    assert all(a.attributes["procstore.procedure.type"] == "test::Steps" for a in attempts)  # type: ignore[index]
    assert all(a.parent is not None and a.parent.span_id == run[0].context.span_id for a in attempts)
    assert all(a.status.status_code.name == "ERROR" for a in attempts)
    for attempt in attempts:
        assert [e.name for e in attempt.events] == ["exception", "retry"]
        assert attempt.events[1].attributes["procstore.retry.reason"] == "RetryLater"  # type: ignore[index]
    progress = [dict(e.attributes or {}) for e in run[0].events if e.name == "step"]
    assert progress == [{"procstore.step": 1, "procstore.attempt": 1}, {"procstore.step": 2, "procstore.attempt": 3}]
    # Store requests are events only when slow or failed: these were neither.
    assert not [e for s in spans for e in s.events if e.name == "store request"]
    assert total("procstore.retries", **{"procstore.retry.reason": "RetryLater"}) >= 2
    assert total("procstore.procedures.submitted", **{"procstore.procedure.type": "test::Steps"}) >= 1
    assert total("procstore.procedures.ended", **{"procstore.outcome": "done"}) >= 1
    assert any(p.count for p in points("procstore.store.duration"))


async def test_every_store_request_is_counted_and_a_sample_timed(tmp_path: Path) -> None:
    def requests() -> float:
        return total("procstore.store.requests", **{"procstore.store.backend": "file"})

    def timed() -> int:
        wanted = {"procstore.store.backend": "file"}.items()
        return sum(p.count for p in points("procstore.store.duration") if wanted <= dict(p.attributes or {}).items())

    before, timed_before = requests(), timed()
    async with manager_for(LocalDirStore(tmp_path), telemetry=TelemetrySettings(histogram_every=4)) as manager:
        await (await manager.submit(steps(World.new(), 40))).wait()
    made, sampled = requests() - before, timed() - timed_before
    assert made >= 41  # a write a step at least
    # One in four of each kind of request, counted from each kind's first ever (the
    # manager's telemetry outlives a test): within one a kind of a quarter of them all.
    kinds = len({p.attributes["procstore.store.operation"] for p in points("procstore.store.requests")})
    assert made / 4 - kinds <= sampled <= made / 4 + kinds


async def test_with_every_step_span_each_attempt_is_a_current_span(tmp_path: Path) -> None:
    world = World.new()
    settings = TelemetrySettings(step_spans="every")
    async with manager_for(LocalDirStore(tmp_path), telemetry=settings) as manager:
        procedure = steps(world, 2, retry_at=1, retries=1)
        await (await manager.submit(procedure)).wait()
    attempts = [s for s in spans_of(procedure.id) if s.name == "step test::Steps"]
    assert [(a.attributes or {}).get("procstore.attempt") for a in attempts] == [1, 1, 2]
    assert [e.name for e in attempts[1].events] == ["exception", "retry"]


async def test_retries_are_kept_however_many_steps_a_procedure_has(tmp_path: Path) -> None:
    """The SDK keeps 128 events a span: a retry on step 200 is on its attempt's own span."""
    world = World.new()
    async with manager_for(LocalDirStore(tmp_path), retry_delay=0.001) as manager:
        procedure = steps(world, 200, retry_at=199, retries=1)
        await (await manager.submit(procedure)).wait()
    retries = [e for s in spans_of(procedure.id) for e in s.events if e.name == "retry"]
    assert len(retries) == 1


async def test_a_slow_store_request_is_an_event(tmp_path: Path) -> None:
    world = World.new()
    settings = TelemetrySettings(slow_store_request=0.0)
    async with manager_for(LocalDirStore(tmp_path), telemetry=settings) as manager:
        procedure = steps(world, 1)
        await (await manager.submit(procedure)).wait()
    run = next(s for s in spans_of(procedure.id) if s.name.startswith("procedure"))
    events = [dict(e.attributes or {}) for e in run.events if e.name == "store request"]
    assert events  # the run's writes, every one "slow" at a threshold of 0
    for attributes in events:  # what docs/observability.md lists
        assert isinstance(attributes.pop("procstore.store.seconds"), float) and attributes.pop(
            "procstore.store.operation"
        )
        assert attributes == {"procstore.store.backend": "file", "procstore.store.outcome": "ok"}


async def test_a_submitted_root_is_a_child_of_the_callers_span_unless_linked(tmp_path: Path) -> None:
    tracer = trace.get_tracer("app")
    async with manager_for(LocalDirStore(tmp_path)) as manager:
        with tracer.start_as_current_span("caller") as caller:
            child = steps(World.new(), 1)
            await (await manager.submit(child)).wait()
    async with manager_for(LocalDirStore(tmp_path), telemetry=TelemetrySettings(root_spans="link")) as manager:
        with tracer.start_as_current_span("caller") as linker:
            linked = steps(World.new(), 1)
            await (await manager.submit(linked)).wait()
    run = next(s for s in spans_of(child.id) if s.name.startswith("procedure"))
    assert run.parent is not None and run.parent.span_id == caller.get_span_context().span_id
    assert run.context.trace_id == caller.get_span_context().trace_id
    own = next(s for s in spans_of(linked.id) if s.name.startswith("procedure"))
    assert own.parent is None and own.context.trace_id != linker.get_span_context().trace_id
    assert [link.context.span_id for link in own.links] == [linker.get_span_context().span_id]


async def test_log_records_carry_the_trace_and_span_ids(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="procstore")
    async with manager_for(LocalDirStore(tmp_path), retry_delay=0.001) as manager:
        procedure = steps(World.new(), 2, retry_at=1, retries=1)
        await (await manager.submit(procedure)).wait()
    run = next(s for s in spans_of(procedure.id) if s.name.startswith("procedure"))
    logged = [r for r in caplog.records if getattr(r, "procedure_id", None) == str(procedure.id)]
    assert logged and all(getattr(r, "trace_id", None) == f"{run.context.trace_id:032x}" for r in logged)
    assert all(len(getattr(r, "span_id", "")) == 16 for r in logged)


async def test_a_failed_store_request_is_an_event_with_its_outcome_backend_and_seconds(tmp_path: Path) -> None:
    world = World.new()
    fault = Fault("transient", key="*procedure/*/0000000001.step", times=1)
    async with manager_for(FaultyStore(LocalDirStore(tmp_path), faults=[fault])) as manager:
        procedure = steps(world, 2)
        await (await manager.submit(procedure)).wait()
    events = [e for s in spans_of(procedure.id) for e in s.events if e.name == "store request"]
    failed = [
        dict(e.attributes or {}) for e in events if (e.attributes or {}).get("procstore.store.outcome") == "error"
    ]
    assert len(failed) == 1
    assert failed[0]["procstore.store.backend"] == "file" and "injected" in str(failed[0]["exception.message"])
    assert isinstance(failed[0]["procstore.store.seconds"], float) and failed[0]["procstore.store.operation"]


async def test_a_rollback_and_a_child_are_traced(tmp_path: Path) -> None:
    world = World.new()
    child_type = {"procstore.procedure.type": "test::Child"}
    submitted, ended = (
        total("procstore.procedures.submitted", **child_type),
        total("procstore.procedures.ended", **child_type),
    )
    async with manager_for(LocalDirStore(tmp_path)) as manager:
        undone = ProcedureWithId.new(Undoable({"world": world.name, "steps": 3, "fail_at": 1}))
        with pytest.raises(ProcedureFailed):
            await (await manager.submit(undone)).wait()
        parent = Parent.create(world, ["a"])
        parent_id = ProcedureWithId.new(parent)
        await (await manager.submit(parent_id)).wait()
    run = next(s for s in spans_of(undone.id) if s.name.startswith("procedure"))
    assert run.attributes["procstore.outcome"] == "rolled back"  # type: ignore[index]
    rollback = [s for s in spans_of(undone.id) if s.name.startswith("rollback")]
    assert [s.name for s in rollback] == ["rollback test::Undoable"]
    assert rollback[0].parent is not None and rollback[0].parent.span_id == run.context.span_id
    assert run.status.status_code.name == "ERROR"
    assert total("procstore.procedures.ended", **{"procstore.outcome": "rolled back"}) >= 1
    parent_run = next(s for s in spans_of(parent_id.id) if s.name.startswith("procedure"))
    child_id = next(iter(parent.data["children"].values()))
    child_run = next(s for s in spans_of(child_id) if s.name.startswith("procedure"))
    assert child_run.context.trace_id == parent_run.context.trace_id  # one trace for the tree
    assert child_run.parent is not None and child_run.parent.span_id == parent_run.context.span_id  # as documented
    # A subprocedure is counted as submitted (by its parent) as it is counted as ended.
    assert total("procstore.procedures.submitted", **child_type) == submitted + 1
    assert total("procstore.procedures.ended", **child_type) == ended + 1


async def test_only_an_operator_cancel_is_counted_as_cancelled(tmp_path: Path) -> None:
    world = World.new()

    def ended(outcome: str) -> float:
        return total(
            "procstore.procedures.ended", **{"procstore.procedure.type": "test::Steps", "procstore.outcome": outcome}
        )

    before = {o: ended(o) for o in ("cancelled", "failed")}
    async with manager_for(LocalDirStore(tmp_path), history=True, request_poll_interval=0.02) as manager:
        # A user's own error whose text happens to say "by an operator": a plain failure.
        mistaken = steps(world, 2, name="quota lowered by an operator", fail_at=1)
        with pytest.raises(ProcedureFailed, match="by an operator"):
            await (await manager.submit(mistaken)).wait()
        outcomes = {}
        for kind in ("cancel", "fail"):
            name, gate = blocker()
            held = steps(world, 3, name=kind, block=name, block_at=0)
            watcher = await manager.submit(held)
            await asyncio.sleep(0.05)
            if kind == "cancel":
                await manager.cancel(held.id, "test")
            else:  # as `procstore fail` does
                await RequestStore(LocalDirStore(tmp_path)).put(held.id, OperatorRequest.new("fail", "test"))
                await asyncio.sleep(0.2)
            gate.set()
            with pytest.raises(ProcedureFailed, match="by an operator"):
                await watcher.wait()
            run = next(s for s in spans_of(held.id) if s.name.startswith("procedure"))
            outcomes[kind] = (run.attributes or {}).get("procstore.outcome")
    assert outcomes == {"cancel": "cancelled", "fail": "failed"}
    assert ended("cancelled") == before["cancelled"] + 1
    assert ended("failed") == before["failed"] + 2
    records = {r.id: r.outcome for r in await HistoryStore(LocalDirStore(tmp_path)).list()}
    assert records[str(mistaken.id)] == "failed"
    assert sorted(records.values()) == ["cancelled", "failed", "failed"]


async def test_a_run_ended_by_stop_is_marked_stopped(tmp_path: Path) -> None:
    world = World.new()
    name, _ = blocker()
    async with manager_for(LocalDirStore(tmp_path)) as manager:
        procedure = steps(world, 2, block=name)
        await manager.submit(procedure)
        await asyncio.sleep(0.05)
    run = next(s for s in spans_of(procedure.id) if s.name.startswith("procedure"))
    assert (run.attributes or {}).get("procstore.outcome") == "stopped"


async def test_a_takeover_and_its_recovery_are_traced(tmp_path: Path) -> None:
    world = World.new()
    first = manager_for(LocalDirStore(tmp_path), lease=Lease(ttl=1.0, holder="cp-1"))
    await first.start()
    await kill_manager(first)
    await first.stop()
    before = total("procstore.lease.takeovers")
    async with manager_for(LocalDirStore(tmp_path), lease=Lease(ttl=1.0, holder="cp-2")) as second:
        await asyncio.wait_for(second.wait_until_leading(), 10)
        await (await second.submit(steps(world, 1))).wait()
    assert total("procstore.lease.takeovers") == before + 1
    assert total("procstore.lease.held") == 0  # back to 0 once it stopped (and released the lease)
    names = [s.name for s in SPANS.get_finished_spans()]
    assert "procstore.lease.acquire" in names and "procstore.recovery" in names
    assert any(p.count for p in points("procstore.recovery.duration"))
    runs = [s for s in SPANS.get_finished_spans() if s.name == "procedure test::Steps"]
    assert runs and runs[-1].attributes["procstore.lease.holder"] == "cp-2"  # type: ignore[index]


async def test_the_lease_acquire_span_covers_the_acquisition_and_carries_the_epoch(tmp_path: Path) -> None:
    read_at: list[int] = []  # when each read of the lease began, on the spans' clock

    class Seen(LocalDirStore):
        async def get_versioned(self, key: str) -> tuple[bytes, str] | None:
            if key == "lease/procedures.json":
                read_at.append(time.time_ns())
            return await super().get_versioned(key)

    async with manager_for(Seen(tmp_path), lease=Lease(ttl=2.0, holder="cp-slow")) as manager:
        await asyncio.wait_for(manager.wait_until_leading(), 10)
    acquired = [s for s in SPANS.get_finished_spans() if s.name == "procstore.lease.acquire"]
    assert len(acquired) == 1 and acquired[0].attributes == {
        "procstore.lease.holder": "cp-slow",
        "procstore.lease.epoch": 1,
    }
    # The span starts when the winning attempt began: its read of the lease is inside it.
    start, end = acquired[0].start_time or 0, acquired[0].end_time or 0
    assert any(start <= at <= end for at in read_at), (start, read_at, end)


async def test_log_records_about_a_procedure_carry_its_fields(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    world = World.new()
    caplog.set_level(logging.INFO, logger="procstore")
    async with manager_for(LocalDirStore(tmp_path)) as manager:
        procedure = steps(world, 2, retry_at=1, retries=1)
        await (await manager.submit(procedure)).wait()
    about = [r for r in caplog.records if getattr(r, "procedure_id", None) == str(procedure.id)]
    assert about and all(r.type_name == "test::Steps" and isinstance(r.step, int) for r in about)  # type: ignore[attr-defined]


async def test_records_of_procedures_skipped_at_recovery_carry_their_fields(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    torn, unknown = ProcedureId.random(), ProcedureId.random()
    root = LocalDirStore(tmp_path)
    await root.put(f"procedure/{torn}/0000000000.step", b'{"type_name": "test::Steps", "da')
    message = b'{"type_name":"test::Unknown","data":"{}","parent_id":null,"step":0}'
    await root.put(f"procedure/{unknown}/0000000000.step", message)
    caplog.set_level(logging.INFO, logger="procstore")
    async with manager_for(root):
        pass
    skipped = {r.getMessage().split()[2]: r for r in caplog.records if r.getMessage().startswith("skipping")}
    assert set(skipped) == {str(torn), str(unknown)}
    for pid, record in skipped.items():
        assert (record.procedure_id, record.step) == (pid, 0)  # type: ignore[attr-defined]
    assert skipped[str(unknown)].type_name == "test::Unknown"  # type: ignore[attr-defined]


async def test_records_about_a_procedure_logged_outside_its_runner_carry_its_fields(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A submit's retry, the requests poll, a torn request key read and replaced: none is
    logged from the procedure's runner, each names the procedure and carries its fields."""
    world = World.new()
    root = LocalDirStore(tmp_path)
    step_0 = Fault("transient", kinds=frozenset({"put_if_absent"}), key="*procedure/*/0000000000.step", times=1)
    requests = RequestStore(root)
    caplog.set_level(logging.INFO, logger="procstore")
    async with manager_for(FaultyStore(root, faults=[step_0]), request_poll_interval=0.02) as manager:
        retried = steps(world, 1)
        await (await manager.submit(retried)).wait()
        name, gate = blocker()
        torn, failed = steps(world, 2, block=name, block_at=0), steps(world, 2, block=name, block_at=0)
        watchers = [await manager.submit(torn), await manager.submit(failed)]
        await asyncio.sleep(0.05)
        await root.put(requests.key(torn.id), b'{"kind": "canc')  # read by the poll
        await requests.put(failed.id, OperatorRequest.new("fail", "test"))  # as `procstore fail` does
        await asyncio.sleep(0.2)
        await manager.cancel(torn.id, "test")  # replaces the torn value
        gate.set()
        for watcher in watchers:
            with pytest.raises(ProcedureFailed):
                await watcher.wait()
    ids = [str(p.id) for p in (retried, torn, failed)]
    about = [(r, pid) for r in caplog.records for pid in ids if pid in r.getMessage()]
    messages = " | ".join(r.getMessage() for r, _ in about)
    for wanted in ("submit retry", "ignoring the operator request", "replaced the unreadable", "failed by an operator"):
        assert wanted in messages
    for record, pid in about:
        fields = (getattr(record, "procedure_id", None), getattr(record, "type_name", None))
        assert fields == (pid, "test::Steps"), record.getMessage()
        assert isinstance(getattr(record, "step", None), int), record.getMessage()


async def test_telemetry_can_be_turned_off(tmp_path: Path) -> None:
    world = World.new()
    async with manager_for(LocalDirStore(tmp_path), telemetry=False) as manager:
        procedure = steps(world, 1)
        await (await manager.submit(procedure)).wait()
    assert spans_of(procedure.id) == []


def test_nothing_is_imported_without_the_api() -> None:
    import subprocess
    import sys

    code = (
        "import sys; sys.modules['opentelemetry'] = None;"  # as if the `otel` extra were not installed
        "import procstore; from procstore._runtime.telemetry import get_telemetry, OFF;"
        "assert get_telemetry() is OFF;"
        "assert not [m for m, v in sys.modules.items() if m.startswith('opentelemetry') and v is not None]"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_telemetry_is_off_with_only_a_namespace_package() -> None:
    """`opentelemetry` importable (a namespace package, as opentelemetry-proto alone installs)
    while the API's modules are not: telemetry is off, and managers run."""
    import subprocess
    import sys

    code = (
        "import sys, importlib.util;"
        "[sys.modules.__setitem__(m, None) for m in ('opentelemetry.trace', 'opentelemetry.metrics', "
        "'opentelemetry.context')];"
        "assert importlib.util.find_spec('opentelemetry') is not None;"
        "from procstore._runtime.telemetry import get_telemetry, OFF;"
        "assert get_telemetry() is OFF"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_without_a_tracer_provider_a_linked_root_still_runs_outside_the_submitters_span() -> None:
    """The API alone (no tracer provider set, as most applications run): procstore makes no
    span, yet what a no-op span would change holds. A submitted root's step sees the span it
    was submitted in (here a remote trace, propagated), as its child would; with
    `root_spans="link"` no span is current inside it, and a subprocedure's step sees its
    parent's; the step duration is still measured (a meter provider may be set without a
    tracer provider). In a process of its own: this module sets the SDK."""
    import subprocess
    import sys

    code = """
import asyncio
from opentelemetry import metrics, trace
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.trace import NonRecordingSpan, SpanContext
from procstore import Procedure, ProcedureId, ProcedureManager, ProcedureWithId, Status, TelemetrySettings

reader = InMemoryMetricReader()
metrics.set_meter_provider(MeterProvider(metric_readers=[reader]))
seen = []

class P(Procedure):
    type_name = "t::P"
    def __init__(self, child: str = "") -> None:
        self.child = child
    def dump(self) -> str:
        return self.child
    async def execute(self, ctx):
        seen.append(trace.get_current_span().get_span_context().is_valid)
        if self.child:
            child, self.child = ProcedureWithId(ProcedureId.parse(self.child), P()), ""
            return Status.suspended([child], persist=False)
        return Status.done()

async def main(telemetry) -> None:
    async with ProcedureManager("memory://no-tracer-provider/", telemetry=telemetry) as manager:
        manager.register(P)
        remote = NonRecordingSpan(SpanContext(1, 2, is_remote=True))
        with trace.use_span(remote):
            assert trace.get_current_span().get_span_context().is_valid
            watcher = await manager.submit(ProcedureWithId.new(P(str(ProcedureId.random()))))
        await watcher.wait()

asyncio.run(main(TelemetrySettings(root_spans="link")))
assert isinstance(trace.get_tracer_provider(), trace.ProxyTracerProvider)
assert seen == [False, False, False], seen
seen.clear()
asyncio.run(main(True))
assert seen == [True, True, True], seen
data = reader.get_metrics_data()
names = {m.name for rm in data.resource_metrics for sm in rm.scope_metrics for m in sm.metrics}
assert "procstore.step.duration" in names, names
"""
    subprocess.run([sys.executable, "-c", code], check=True)


def test_metrics_record_once_a_meter_provider_is_set_after_a_manager_started() -> None:
    """Without a meter provider a store request and a step skip their metrics (the API's
    proxies would drop them); once the application sets one, even with the manager
    running, the next ones are recorded, and so is the step during which it was set (its
    timer began before: the proxy would have forwarded its record). In a process of its
    own: this module sets the SDK."""
    import subprocess
    import sys

    code = """
import asyncio
from opentelemetry import metrics
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from procstore import Procedure, ProcedureManager, ProcedureWithId, Status
from procstore._runtime.telemetry import get_telemetry

reader = InMemoryMetricReader()

class P(Procedure):
    type_name = "t::P"
    def __init__(self, set_provider: bool = False) -> None:
        self.set_provider = set_provider
    def dump(self) -> str:
        return ""
    async def execute(self, ctx):
        if self.set_provider:
            metrics.set_meter_provider(MeterProvider(metric_readers=[reader]))
        return Status.done()

def counts():
    data = reader.get_metrics_data()
    found = {}
    for rm in data.resource_metrics:
        for sm in rm.scope_metrics:
            for m in sm.metrics:
                points = m.data.data_points
                found[m.name] = sum(getattr(p, "count", getattr(p, "value", 0)) for p in points)
    return found

async def main() -> None:
    async with ProcedureManager("memory://meter-set-later/") as manager:
        manager.register(P)
        await (await manager.submit(ProcedureWithId.new(P()))).wait()
        assert not get_telemetry().records_store_calls()
        await (await manager.submit(ProcedureWithId.new(P(set_provider=True)))).wait()
        assert get_telemetry().records_store_calls()
        assert counts()["procstore.steps"] == 1, counts()
        await (await manager.submit(ProcedureWithId.new(P()))).wait()
    found = counts()
    assert found["procstore.steps"] == 2, found
    assert found["procstore.store.duration"] > 0 and found["procstore.procedures.ended"] >= 2, found

asyncio.run(main())
"""
    subprocess.run([sys.executable, "-c", code], check=True)


async def test_spans_record_once_a_provider_is_set_after_the_telemetry_was_made(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """The look for an SDK reads the API's global, not `os.environ` on each call: a provider
    set later is still seen at once, and one named in the environment after a manager ran
    (a test's `setenv`) is loaded, as the API would load it, by the next procedure's run."""
    from opentelemetry.util._once import Once

    from procstore._runtime import telemetry as shared

    def no_provider_yet() -> None:  # a process whose first manager starts now
        monkeypatch.setattr(trace, "_TRACER_PROVIDER", None)
        monkeypatch.setattr(trace, "_TRACER_PROVIDER_SET_ONCE", Once())
        monkeypatch.setattr(shared, "_shared", None)

    no_provider_yet()
    monkeypatch.delenv("OTEL_PYTHON_TRACER_PROVIDER", raising=False)
    async with manager_for(LocalDirStore(tmp_path)) as manager:
        await (await manager.submit(steps(World.new(), 2))).wait()
        assert trace._TRACER_PROVIDER is None
        monkeypatch.setenv("OTEL_PYTHON_TRACER_PROVIDER", "sdk_tracer_provider")
        await (await manager.submit(steps(World.new(), 2))).wait()
        assert isinstance(trace._TRACER_PROVIDER, TracerProvider)
    assert shared.get_telemetry()._tracing()

    no_provider_yet()
    monkeypatch.delenv("OTEL_PYTHON_TRACER_PROVIDER")
    later = shared.get_telemetry()
    assert not later._tracing()
    trace.set_tracer_provider(TracerProvider())
    assert later._tracing()


async def test_a_provider_named_in_the_environment_that_cannot_be_loaded_turns_tracing_off(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """`OTEL_PYTHON_TRACER_PROVIDER` naming no installed provider: `start()` failed with
    "coroutine raised StopIteration". Procedures run without spans and the log says why,
    once, whether the name was there when the first manager started or came later; a good
    name given afterwards is loaded at the next run."""
    from opentelemetry.util._once import Once

    from procstore._runtime import telemetry as shared

    def no_provider_yet() -> None:
        monkeypatch.setattr(trace, "_TRACER_PROVIDER", None)
        monkeypatch.setattr(trace, "_TRACER_PROVIDER_SET_ONCE", Once())
        monkeypatch.setattr(shared, "_shared", None)

    for bad_from_the_start in (True, False):
        no_provider_yet()
        monkeypatch.delenv("OTEL_PYTHON_TRACER_PROVIDER", raising=False)
        if bad_from_the_start:
            monkeypatch.setenv("OTEL_PYTHON_TRACER_PROVIDER", "no_such_provider")
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="procstore"):
            async with manager_for(LocalDirStore(tmp_path / str(bad_from_the_start))) as manager:
                await (await manager.submit(steps(World.new(), 2))).wait()
                monkeypatch.setenv("OTEL_PYTHON_TRACER_PROVIDER", "no_such_provider")
                for _ in range(2):
                    assert await (await manager.submit(steps(World.new(), 2))).wait() == "steps done"
                monkeypatch.setenv("OTEL_PYTHON_TRACER_PROVIDER", "sdk_tracer_provider")
                await (await manager.submit(steps(World.new(), 2))).wait()
                assert isinstance(trace._TRACER_PROVIDER, TracerProvider)
        assert caplog.text.count("'no_such_provider' cannot be loaded") == 1


async def test_a_span_processor_that_raises_never_fails_a_procedure(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An SDK's span processor raising as spans start or end: the procedure ran to its end
    as without telemetry (it was failed for good, or its watchers waited forever), and the
    log says why, once."""
    from opentelemetry.sdk.trace import SpanProcessor

    class Broken(SpanProcessor):
        def on_start(self, span: Any, parent_context: Any = None) -> None:
            raise RuntimeError("processor bug")

    from procstore._runtime import otel

    monkeypatch.setattr(otel, "_span_failures", set())  # each failure is logged once a process
    provider = trace.get_tracer_provider()
    assert isinstance(provider, TracerProvider)
    provider.add_span_processor(Broken())
    try:
        with caplog.at_level(logging.WARNING, logger="procstore"):
            async with manager_for(LocalDirStore(tmp_path)) as manager:
                for _ in range(2):
                    watcher = await manager.submit(steps(World.new(), 3))
                    assert await asyncio.wait_for(watcher.wait(), 10) == "steps done"
    finally:
        provider._active_span_processor._span_processors = tuple(
            p for p in provider._active_span_processor._span_processors if not isinstance(p, Broken)
        )
    warned = [r for r in caplog.records if "a span could not be made" in r.getMessage()]
    assert len(warned) == 1 and "processor bug" in warned[0].getMessage()


async def test_a_run_whose_spans_fail_stays_out_of_the_callers_trace_and_keeps_its_metrics(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Procedure spans that cannot start, step spans that cannot end, with a new message each
    time: a root's run is still a trace of its own (not the caller's span's), each step is
    still in `procstore.step.duration`, and each failing place is logged once."""
    from opentelemetry.sdk.trace import SpanProcessor

    from procstore._runtime import otel

    class Broken(SpanProcessor):
        def on_start(self, span: Any, parent_context: Any = None) -> None:
            if span.name.startswith("procedure "):
                raise RuntimeError(f"no procedure spans ({span.context.span_id:x})")

        def on_end(self, span: Any) -> None:
            if span.name.startswith("step "):
                raise RuntimeError(f"export queue full, dropped span {span.context.span_id:x}")

    monkeypatch.setattr(otel, "_span_failures", set())
    provider = trace.get_tracer_provider()
    assert isinstance(provider, TracerProvider)
    provider.add_span_processor(Broken())

    def step_records() -> int:
        return sum(p.count for p in points("procstore.step.duration"))

    before = step_records()
    try:
        with caplog.at_level(logging.WARNING, logger="procstore"):
            every = TelemetrySettings(step_spans="every", histogram_every=1)
            async with manager_for(LocalDirStore(tmp_path), telemetry=every) as manager:
                with trace.get_tracer("app").start_as_current_span("outer"):
                    for _ in range(3):
                        assert await (await manager.submit(steps(World.new(), 3))).wait() == "steps done"
    finally:
        provider._active_span_processor._span_processors = tuple(
            p for p in provider._active_span_processor._span_processors if not isinstance(p, Broken)
        )
    outer = [s for s in SPANS.get_finished_spans() if s.name == "outer"]
    assert (
        len(outer) == 1 and len(outer[0].events) <= 6
    )  # the submits' writes and end-record looks, in the caller's span
    assert not [s for s in SPANS.get_finished_spans() if s.parent is not None and s.parent == outer[0].context]
    assert step_records() - before >= 9
    warned = [r for r in caplog.records if "a span could not be made" in r.getMessage()]
    assert len(warned) == 2


async def test_each_type_and_store_request_kind_is_timed_from_its_first(tmp_path: Path) -> None:
    """One sampling count per type: a rare type is timed however many steps others take."""

    def timed(type_name: str) -> int:
        wanted = {"procstore.procedure.type": type_name}.items()
        return sum(p.count for p in points("procstore.step.duration") if wanted <= dict(p.attributes or {}).items())

    class Rare(Procedure):
        type_name = "telemetry::Rare"

        async def execute(self, ctx: Context) -> Status:
            return Status.done()

        def dump(self) -> str:
            return "{}"

        @classmethod
        def load(cls, data: str) -> Rare:
            return cls()

    async with manager_for(LocalDirStore(tmp_path), Rare) as manager:
        await (await manager.submit(steps(World.new(), 13))).wait()
        await (await manager.submit(ProcedureWithId.new(Rare()))).wait()
    assert timed("telemetry::Rare") == 1


async def test_activity_writes_are_not_reported_on_another_procedures_span(tmp_path: Path) -> None:
    """The publisher writes every procedure's activity from one task of its own: its failed
    writes are on no procedure's span, never on the first publisher's."""
    name, go = blocker()
    store = FaultyStore(LocalDirStore(tmp_path), faults=[Fault("error", key="*activity/*")])
    async with manager_for(store, retry_delay=0.3, max_retry_delay=0.3, max_retry_times=100) as manager:
        world = World.new()
        first = steps(world, 3, retry_at=0, retries=1, name="a", block=name, block_at=1)
        watcher = await manager.submit(first)
        await asyncio.sleep(0.1)
        await (await manager.submit(steps(world, 2, retry_at=0, retries=8, name="b"))).wait()
        go.set()
        await watcher.wait()
    events = [e for s in spans_of(first.id) for e in s.events if e.name == "store request"]
    assert not [e for e in events if "activity" in str((e.attributes or {}).get("exception.message"))], events


class SpawnsNapper(Procedure):
    """Waits for one child that sleeps durably (0.3 s: long enough to park, not only to store its time)."""

    type_name = "tests::telemetry::SpawnsNapper"

    def __init__(self, data: str = "") -> None:
        self.child = data or None

    async def execute(self, ctx: Context) -> Status:
        if self.child is not None:
            return Status.done()
        child = ProcedureWithId.new(Sleeper({"seconds": 0.3}))
        self.child = str(child.id)
        return Status.suspended([child])

    def dump(self) -> str:
        return self.child or ""

    @classmethod
    def load(cls, data: str) -> SpawnsNapper:
        return cls(data)


async def test_a_run_after_a_durable_wait_stays_in_its_procedures_trace(tmp_path: Path) -> None:
    """Each run after a park began in an empty context: a child's second run was a trace of
    its own, with no parent and no link, so a tree with a durable wait was two traces."""
    tracer = trace.get_tracer("app")
    async with manager_for(LocalDirStore(tmp_path), Sleeper, SpawnsNapper) as manager:
        with tracer.start_as_current_span("caller") as caller:
            parent = SpawnsNapper()
            root, napper = ProcedureWithId.new(parent), ProcedureWithId.new(Sleeper({"seconds": 0.3}))
            watchers = [await manager.submit(root), await manager.submit(napper)]
        for watcher in watchers:
            await asyncio.wait_for(watcher.wait(), 10)
    parent_run = next(s for s in spans_of(root.id) if s.name.startswith("procedure"))
    child_runs = [s for s in spans_of(parent.child) if s.name.startswith("procedure")]
    assert len(child_runs) == 2  # before and after its sleep
    for run in child_runs:
        assert run.context.trace_id == caller.get_span_context().trace_id
        assert run.parent is not None and run.parent.span_id == parent_run.context.span_id
    root_runs = [s for s in spans_of(napper.id) if s.name.startswith("procedure")]
    assert len(root_runs) == 2  # a submitted root: each run a child of the caller's span
    assert all(r.parent is not None and r.parent.span_id == caller.get_span_context().span_id for r in root_runs)
