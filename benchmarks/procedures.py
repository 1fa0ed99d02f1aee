"""The procedure benchmarks run: `Loop` (n persisted steps, ~100 bytes of state)."""

from __future__ import annotations

import asyncio
from collections import Counter
from typing import Any

import orjson

from procstore import Context, Procedure, Status

GATES: dict[str, asyncio.Event] = {}
"""Gates by name. A `Loop` with a gate waits for it before the step numbered `block_at`."""
ARRIVED: Counter[str] = Counter()
"""How many loops reached each gate (a recovered loop counts again)."""
ARRIVALS = asyncio.Condition()
"""Notified at each arrival at a gate."""


async def wait_for_arrivals(gate: str, count: int) -> None:
    """Until `count` loops wait at `gate`."""
    async with ARRIVALS:
        await ARRIVALS.wait_for(lambda: ARRIVED[gate] >= count)


class Loop(Procedure):
    """`steps` steps, each persisting ~100 bytes; optionally waits on a gate at one step."""

    type_name = "bench::Loop"

    def __init__(self, data: dict[str, Any]) -> None:
        self.data = data

    def dump(self) -> str:
        return orjson.dumps(self.data).decode()

    async def execute(self, ctx: Context) -> Status:
        gate = self.data.get("gate")
        if gate and self.data["i"] == self.data.get("block_at", 0):
            event = GATES.setdefault(gate, asyncio.Event())
            if not event.is_set():
                ARRIVED[gate] += 1
                async with ARRIVALS:
                    ARRIVALS.notify_all()
                await event.wait()
        self.data["i"] += 1
        return Status.done() if self.data["i"] >= self.data["steps"] else Status.executing()


def new_loop(steps: int, gate: str | None = None, block_at: int = 0) -> Loop:
    return Loop({"i": 0, "steps": steps, "gate": gate, "block_at": block_at, "pad": "x" * 50})
