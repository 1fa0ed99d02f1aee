"""Every span procstore starts is ended: an interrupted step, a cancel during back-off, a
stop while parked / waiting for a slot / mid-step."""

import asyncio
import sys
import uuid

from opentelemetry import trace
from opentelemetry.sdk.trace import SpanProcessor, TracerProvider

from procstore import Client, Context, Procedure, ProcedureManager, ProcedureWithId, Status, TelemetrySettings
from procstore.flow import Concurrency
from procstore.testing import MemoryStore

open_spans: dict[int, str] = {}


class Tracker(SpanProcessor):
    def on_start(self, span, parent_context=None):
        open_spans[span.context.span_id] = span.name

    def on_end(self, span):
        open_spans.pop(span.context.span_id, None)


provider = TracerProvider()
provider.add_span_processor(Tracker())
trace.set_tracer_provider(provider)
MODE = sys.argv[1]


class Work(Procedure):
    type_name = "b::Work"

    def __init__(self, data: str = "") -> None:
        self.n = int(data or 0)

    async def execute(self, ctx: Context) -> Status:
        self.n += 1
        if MODE == "backoff":
            raise ConnectionError("flaky")  # transient: retried with back-off
        if MODE == "uninterruptible":
            with ctx.uninterruptible():
                await asyncio.sleep(0.5)
            await asyncio.sleep(3600)
        await asyncio.sleep(3600)
        return Status.done()

    def concurrency(self):
        return Concurrency("k", 1) if MODE == "slot" else None

    async def rollback(self, ctx: Context) -> None:
        if MODE == "slow_rollback":
            await asyncio.sleep(3600)

    def rollback_supported(self) -> bool:
        return True

    def dump(self) -> str:
        return str(self.n)

    @classmethod
    def load(cls, data: str) -> "Work":
        return cls(data)


async def main() -> None:
    store = MemoryStore(f"b05-{uuid.uuid4().hex[:8]}")
    steps = TelemetrySettings(step_spans="every") if "every" in sys.argv else TelemetrySettings()
    manager = ProcedureManager(store, request_poll_interval=0.05, retry_delay=5, telemetry=steps)
    manager.register(Work)
    await manager.start()
    procs = [ProcedureWithId.new(Work()) for _ in range(2)]
    for p in procs:
        await manager.submit(p)
    await asyncio.sleep(0.3)
    async with Client(store) as client:
        if MODE != "stop":
            for p in procs:
                await client.cancel(p.id, reason="r")
        await asyncio.sleep(1.5)
    await manager.stop()
    await asyncio.sleep(0.1)
    assert not open_spans, f"{MODE}: spans never ended: {sorted(open_spans.values())}"
    print(MODE, "all spans ended")


asyncio.run(main())
