"""The procedures benchmarks run: `Loop` (n persisted steps, ~100 bytes of state)."""

from __future__ import annotations

import asyncio
import json
from typing import Any

from procstore import Context, Procedure, Status

GATES: dict[str, asyncio.Event] = {}


class Loop(Procedure):
    """`steps` steps, each persisting ~100 bytes; optionally waits on a gate first."""

    type_name = "bench::Loop"

    def __init__(self, data: dict[str, Any]) -> None:
        self.data = data

    def dump(self) -> str:
        return json.dumps(self.data)

    async def execute(self, ctx: Context) -> Status:
        gate = self.data.get("gate")
        if gate:
            await GATES[gate].wait()
        self.data["i"] += 1
        return Status.done() if self.data["i"] >= self.data["steps"] else Status.executing()


def new_loop(steps: int, gate: str | None = None) -> Loop:
    return Loop({"i": 0, "steps": steps, "gate": gate, "pad": "x" * 40})
