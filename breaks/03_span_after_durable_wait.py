"""A subprocedure woken from a durable sleep (or a signal wait) runs in a trace of its own,
with no parent and no link: "a procedure tree is one trace" (docs/observability.md) breaks."""

import asyncio
import uuid

from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from procstore import Context, Procedure, ProcedureManager, ProcedureWithId, Status
from procstore.testing import MemoryStore

exporter = InMemorySpanExporter()
provider = TracerProvider()
provider.add_span_processor(SimpleSpanProcessor(exporter))
trace.set_tracer_provider(provider)


class Napper(Procedure):
    type_name = "b::Napper"

    def __init__(self, data: str = "") -> None:
        self.slept = data == "1"

    async def execute(self, ctx: Context) -> Status:
        if self.slept:
            return Status.done()
        self.slept = True
        return Status.sleep(0.05)

    def dump(self) -> str:
        return "1" if self.slept else ""

    @classmethod
    def load(cls, data: str) -> "Napper":
        return cls(data)


class Parent(Procedure):
    type_name = "b::Parent"

    def __init__(self, data: str = "") -> None:
        self.spawned = data == "1"

    async def execute(self, ctx: Context) -> Status:
        if self.spawned:
            return Status.done()
        self.spawned = True
        return Status.suspended([ProcedureWithId.new(Napper())])

    def dump(self) -> str:
        return "1" if self.spawned else ""

    @classmethod
    def load(cls, data: str) -> "Parent":
        return cls(data)


async def main() -> None:
    async with ProcedureManager(MemoryStore(f"b03-{uuid.uuid4().hex[:8]}")) as manager:
        manager.register(Parent)
        manager.register(Napper)
        with trace.get_tracer("caller").start_as_current_span("caller"):
            watcher = await manager.submit(ProcedureWithId.new(Parent()))
        await asyncio.wait_for(watcher.wait(), 10)
    spans = [s for s in exporter.get_finished_spans() if s.name.startswith(("procedure", "caller"))]
    for s in spans:
        parent = s.parent.span_id if s.parent else None
        print(f"{s.name:22} trace {s.context.trace_id:032x} parent {parent} links {len(s.links)}")
    traces = {s.context.trace_id for s in spans}
    assert len(traces) == 1, f"the tree is {len(traces)} traces, not one"


asyncio.run(main())
