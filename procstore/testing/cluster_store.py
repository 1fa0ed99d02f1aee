"""One simulated process's view of the shared store, for `ClusterSimulation`.

Every manager (and every operator command) of a cluster simulation reaches the one
in-memory store through its own `ProcessStore`, so that the simulation can act on that
process alone: pause it (every store call it makes blocks, those already past the lease's
check included, and lands once it is resumed: a zombie), kill it at a store operation,
fail its operations, lose the answer of a write that landed, slow a write down, or let a
write whose caller was told it failed land later. Each operation that changes the store is
written to the simulation's log when it lands, in order, with who made it.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Literal, TypeVar

from procstore.errors import StoreError
from procstore.store.state_store import StateStore
from procstore.store.wrapping import CRASH_POINT, MUTATING_KINDS, WRITE_KINDS, WrappingStore
from procstore.testing.plan import SimulatedCrash

T = TypeVar("T")

ERROR_LATENCY = 0.05
"""Virtual seconds an injected error takes to come back."""

Effect = Literal["error", "lost", "slow", "late", "crash_before", "crash_after", "pause_before", "pause_after"]
"""What an armed fault does to the operation it hits:

- `error`: the operation fails and changes nothing;
- `lost`: it lands, and its answer is lost (the caller sees an error);
- `slow`: it lands `seconds` later, the caller waiting;
- `late`: the caller is told it failed at once, and it lands `seconds` later;
- `crash_before` / `crash_after`: the process dies before it is sent, or once it has landed;
- `pause_before` / `pause_after`: the process is paused for `seconds` with the operation
  sent but not landed (after its lease check), or landed with its answer not yet read.
"""


@dataclass(slots=True)
class Armed:
    """A fault for a process's `ahead`-th next operation that changes the store (and
    whose key contains `match`)."""

    effect: Effect
    ahead: int
    seconds: float = 0.0
    match: str = ""
    """Count only the operations whose key contains this (all of them if empty)."""


@dataclass(frozen=True, slots=True)
class LoggedOp:
    """An operation that changed the store (or was told it failed), as the log keeps it."""

    at: float
    process: str
    kind: str
    key: str
    landed: bool
    created: bool = True
    """For a create-only write: whether it created the key."""
    note: str = ""
    value: bytes | None = None
    """What a write stored (the model reads a message's run from it)."""

    def line(self) -> str:
        what = "landed" if self.landed else "failed"
        extra = "" if self.created else " (key existed)"
        return f"{self.at:9.2f}  {self.process:<6} {self.kind:<14} {self.key} {what}{extra}{self.note}"


@dataclass
class Process:
    """One simulated process (a manager's life between starts and kills, or an operator)."""

    name: str
    log: list[LoggedOp]
    rng: random.Random
    armed: list[Armed] = field(default_factory=list)
    dead: bool = False
    error_rate: float = 0.0
    """The chance that an operation fails (a flaky network), drawn per operation."""
    write_outage_until: float = 0.0
    """Until this (loop) time, every write fails (reads still answer)."""
    on_crash: Callable[[Process], None] | None = None
    in_flight: set[asyncio.Task[None]] = field(default_factory=set)
    """Writes on their way to the store that their sender has given up on."""
    _running: asyncio.Event = field(default_factory=asyncio.Event)

    def __post_init__(self) -> None:
        self._running.set()

    @property
    def paused(self) -> bool:
        return not self._running.is_set()

    def pause(self) -> None:
        self._running.clear()

    def resume(self) -> None:
        self._running.set()

    def pause_for(self, seconds: float) -> None:
        self.pause()
        asyncio.get_running_loop().call_later(seconds, self.resume)

    async def wait_running(self) -> None:
        """Block while paused; raise `SimulatedCrash` once the process is dead."""
        if self.dead:
            raise SimulatedCrash(f"{self.name} is dead")
        await self._running.wait()
        if self.dead:
            raise SimulatedCrash(f"{self.name} is dead")

    def die(self) -> None:
        if not self.dead:
            self.dead = True
            self._running.set()  # its blocked calls wake up to find it dead
            if self.on_crash is not None:
                self.on_crash(self)

    def draw(self, key: str) -> Armed | None:
        """The fault armed for this mutating operation on `key`, if any; counts the others down."""
        hit = None
        for armed in self.armed:
            if armed.match not in key:
                continue
            armed.ahead -= 1
            if armed.ahead == 0 and hit is None:
                hit = armed
        self.armed = [a for a in self.armed if a.ahead > 0]
        return hit


class ProcessStore(WrappingStore):
    """`inner` as one process sees it: paused, killed, failed and logged as `process` says."""

    def __init__(self, inner: StateStore, process: Process) -> None:
        super().__init__(inner)
        self.process = process

    async def around(self, kind: str, key: str, call: Callable[[], Awaitable[T]], value: bytes | None = None) -> T:
        process = self.process
        await process.wait_running()
        if kind == CRASH_POINT:
            return await call()
        loop = asyncio.get_running_loop()
        mutating = kind in MUTATING_KINDS
        armed = process.draw(key) if mutating else None
        effect = armed.effect if armed is not None else None
        seconds = armed.seconds if armed is not None else 0.0
        if effect is None and (
            process.rng.random() < process.error_rate
            or (kind in WRITE_KINDS and loop.time() < process.write_outage_until)
        ):
            effect = "error"
        if effect == "crash_before":
            process.die()
            raise SimulatedCrash(f"{process.name} killed before {kind} {key}")
        if effect == "error":
            # A failed request takes a round trip too: an instant error would let a loop
            # that retries at once spin without virtual time ever passing.
            await asyncio.sleep(ERROR_LATENCY)
            self._log(kind, key, landed=False, note=" (injected error)")
            raise StoreError(f"injected error: {kind} {key}", key=key)
        if effect == "late":
            late = loop.create_task(self._land_late(kind, key, call, seconds, value), name=f"sim:late:{key}")
            process.in_flight.add(late)
            late.add_done_callback(process.in_flight.discard)
            self._log(kind, key, landed=False, note=f" (in flight: lands in {seconds:.1f}s)")
            raise StoreError(f"injected timeout: {kind} {key}", key=key)
        if effect == "slow":
            await asyncio.sleep(seconds)
        if effect == "pause_before":
            process.pause_for(seconds)
            await process.wait_running()
        result = await call()
        if mutating:
            self._log(kind, key, landed=True, created=result is not False, note=_note(effect, seconds), value=value)
        if effect == "crash_after":
            process.die()
            raise SimulatedCrash(f"{process.name} killed after {kind} {key}")
        if effect == "pause_after":
            process.pause_for(seconds)
        await process.wait_running()
        if effect == "lost":
            raise StoreError(f"injected lost answer: {kind} {key}", key=key)
        return result

    async def _land_late(
        self, kind: str, key: str, call: Callable[[], Awaitable[T]], seconds: float, value: bytes | None
    ) -> None:
        # The request is in the network: it lands whatever happens to its sender.
        await asyncio.sleep(seconds)
        result = await call()
        self._log(kind, key, landed=True, created=result is not False, note=" (late)", value=value)

    def _log(
        self, kind: str, key: str, *, landed: bool, created: bool = True, note: str = "", value: bytes | None = None
    ) -> None:
        at = asyncio.get_running_loop().time()
        self.process.log.append(LoggedOp(at, self.process.name, kind, key, landed, created, note, value))


def _note(effect: str | None, seconds: float) -> str:
    if effect in ("pause_before", "pause_after", "slow"):
        return f" ({effect.replace('_', ' ')} {seconds:.1f}s)"
    return f" ({effect})" if effect in ("lost", "crash_after") else ""
