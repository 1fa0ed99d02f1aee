"""The measured floors of issue 37's two missed goals: a lone procedure's step path on memory,
and telemetry with an SDK configured, by ablation.

`python -m benchmarks.floors --what step|telemetry --runs N` runs, in one process, a lone
`--steps`-step procedure on `memory://` as shipped, then with each layer of its path removed
alone and cumulatively (in the order listed), each timing `--procedures` procedures, all
interleaved run by run (the machine's other work hits every row alike). A layer is removed
by monkeypatching procstore for the duration of its timing only: MEASUREMENT ONLY, what no
release may ship (most removals break a documented guarantee; the table says which).

- `--what step` (telemetry on, no SDK: as `benchmarks.step_counts`): loop CPU per write
  (`time.thread_time()` of the event loop's thread / (steps + 1)) and its ratio to the raw put
  loop (the same number of puts of the same bytes through the manager's store). The `floor`
  row is what any durable step framework must do per write: run the step, dump the state,
  encode a message, build a key, await one `put_if_absent`.
- `--what telemetry` (the OpenTelemetry SDK configured as `benchmarks.observability` does):
  the same, its ratio to a manager with `telemetry=False` in the same runs. The `SDK no-op`
  row keeps every procstore hook but hands them a tracer and instruments that record
  nothing: procstore's own wrapper cost, without the SDK's.

Rows print best / median over `--runs`; `--json` prints one JSON line instead.

Profile (cProfile, top 25 by tottime, memory store, the shipped path):
`python -m benchmarks.floors --what step --profile 200` (or `--what telemetry`): 200 lone
procedures under cProfile, nothing removed (`--profile-without LAYER`, repeatable, removes
layers first, to profile a row of the table).
"""

from __future__ import annotations

import asyncio
import contextlib
import cProfile
import json
import operator
import pstats
import statistics
import tempfile
import time
from collections.abc import Awaitable, Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, cast

import click
from opentelemetry import metrics, trace

from benchmarks.observability import configure_sdk
from benchmarks.procedures import new_loop
from benchmarks.step_counts import counted
from benchmarks.stores import Target, innermost
from benchmarks.suites import MESSAGE, RAW, manager, one_procedure, raw_cleanup, raw_writes
from procstore import Context, ProcedureManager
from procstore._runtime import otel, runner
from procstore._runtime.activity import ActivityPublisher
from procstore._runtime.meta import ProcedureMeta
from procstore._runtime.operator import OperatorRequests, RequestLooks
from procstore._runtime.runner import Runner
from procstore._runtime.telemetry import NOTHING, TracedStore
from procstore.errors import Fenced
from procstore.ids import ProcedureId
from procstore.store.keys import KeyType, key_text
from procstore.store.message import ProcedureMessage
from procstore.store.procedure_store import ProcedureStore
from procstore.store.state_store import StateStore

Timing = Callable[[], Awaitable[Any]]
Patch = tuple[object, str, object]
"""Set `object.attr` to the value for a timing, and put back what it was after."""


@dataclass(frozen=True)
class Layer:
    name: str
    guarantee: str
    """What removing it for good would give up ("none" if nothing documented)."""
    patches: Callable[[ProcedureManager], list[Patch]]


@contextlib.contextmanager
def patched(patches: Sequence[Patch]) -> Iterator[None]:
    """Each patch for the block. An attribute that is not there is refused: a layer renamed in
    procstore must fail this tool, not leave the layer in place while its row says removed."""
    missing = object()
    saved = []
    for obj, attr, _ in patches:
        if not hasattr(obj, attr):
            raise AttributeError(f"{obj!r} has no {attr!r}: a layer's patch names what procstore no longer has")
        saved.append((obj, attr, vars(obj).get(attr, missing) if isinstance(obj, type) else getattr(obj, attr)))
    try:
        for obj, attr, value in patches:
            setattr(obj, attr, value)
        yield
    finally:
        for obj, attr, value in reversed(saved):
            if value is missing:
                delattr(obj, attr)
            else:
                setattr(obj, attr, value)


class _Answered:
    """An awaitable answering None at once, without a coroutine (a look that found nothing)."""

    def __await__(self) -> Iterator[None]:
        return iter(())


_ANSWERED = _Answered()


def _none(*_args: Any, **_kwargs: Any) -> None:
    return None


async def _create_or_fence_true(self: ProcedureStore, procedure_id: ProcedureId, key: str, value: bytes) -> bool:
    """`ProcedureStore._create_or_fence` answering True, so that the runner's write needs no
    `_with_store_retries` around it (`if not await ...: return`)."""
    if not await self.store.put_if_absent(key, value) and await self.store.get(key) != value:
        raise Fenced(key, procedure_id)
    return True


_PREFIXES: dict[str, str] = {}


def _cached_key(self: ProcedureStore, procedure_id: ProcedureId, step: int, key_type: KeyType) -> str:
    """A step's key from its procedure's folder formatted once (no `str(id)`, no key call)."""
    text = procedure_id._text
    prefix = _PREFIXES.get(text)
    if prefix is None:
        prefix = _PREFIXES[text] = f"{self.proc_path}{text}/"
    return f"{prefix}{step:010d}.step"


async def _delete_only(ctx: Any, root: ProcedureMeta, ids: Any, metas: Any, state: Any, **_: Any) -> None:
    """`runner.delete_tree` without the history record nor the ordered deletion: the keys it
    knows, in one batch (the store is left as clean for the next timing)."""
    await ctx.store.store.batch_delete([str(key) for key in root.keys.known(ctx.store.proc_path, root.id) or []])


def _ctx(m: ProcedureManager) -> Any:
    return m._ctx


STEP_LAYERS = [
    Layer("the look for an operator request per attempt", "a cancel/fail written to the store is seen "
          "before the next attempt (guarantees: operator requests)",
          lambda m: [(RequestLooks, "get", lambda self, pid: _ANSWERED)]),
    Layer("the activity publisher's per-step call", "none (published only while shown)",
          lambda m: [(ActivityPublisher, "running", _none)]),
    Layer("the lease check per attempt", "none without a lease (a lease's check stays)",
          lambda m: [(Runner, "_check_lease", _none)]),
    Layer("the retry wrapper of the step's write", "transient store errors are retried",
          lambda m: [(Runner, "_with_store_retries", lambda self, write: write()),
                     (ProcedureStore, "_create_or_fence", _create_or_fence_true)]),
    Layer("RunningStep, interrupt and NotCancelledByItself around execute()", "a request interrupts a "
          "step at its await; a step's own BaseException is a failure",
          lambda m: [(OperatorRequests, "running_step", lambda self, pid, step=None: NOTHING),
                     (runner, "IN_EXECUTE", NOTHING)]),
    Layer("the telemetry hooks without an SDK (step_span, store passes)", "none while no SDK is set",
          lambda m: [(otel.OtelTelemetry, "step_span", lambda self, *a: NOTHING),
                     (TracedStore, "passes", lambda self, kind: True)]),
    Layer("the message encode (a constant's bytes instead)", "what is stored is the state (wrong data!)",
          lambda m: [(ProcedureMessage, "encode", lambda self: MESSAGE)]),
    Layer("the key's building (a cached folder prefix)", "none (a cache per procedure)",
          lambda m: [(ProcedureStore, "_key_to_write", _cached_key)]),
    Layer("the store wrapper chain (TracedStore)", "telemetry of store requests once an SDK is set",
          lambda m: [(_ctx(m).store, "store", innermost(_ctx(m).store.store)),
                     (_ctx(m).store.requests, "store", innermost(_ctx(m).store.store))]),
    Layer("the meta's state property (read twice a step; set_state runs once a run)", "none",
          lambda m: [(ProcedureMeta, "state", property(operator.attrgetter("_watched.state")))]),
    Layer("the end: history record and ordered deletion (per procedure)", "an ended procedure's history "
          "record; keys deleted children first, the commit last",
          lambda m: [(runner, "delete_tree", _delete_only)]),
]  # fmt: skip


def _event_free_exit(self: otel.Attempt, kind: Any, error: BaseException | None, tb: Any) -> None:
    """`Attempt.__exit__` of a step that succeeded, without its `step` event (metering only)."""
    telemetry = self._telemetry
    if telemetry.metering():
        telemetry.step_ended(self._type_name, time.perf_counter() - self._start)


def _count_only(self: otel.OtelTelemetry, type_name: str, seconds: float | None) -> None:
    """`OtelTelemetry.step_ended` without the histogram record (the count kept)."""
    count = self._steps.setdefault(type_name, [0])
    count[0] += 1


def _sdk_noop(m: ProcedureManager) -> list[Patch]:
    """Every procstore hook runs; the tracer and the instruments record nothing."""
    telemetry = _ctx(m).settings.telemetry
    meter = metrics.NoOpMeter("floors")
    instruments = {
        "submitted_count": meter.create_counter("c"), "ended_count": meter.create_counter("c"),
        "running_now": meter.create_up_down_counter("u"), "step_duration": meter.create_histogram("h"),
        "procedure_duration": meter.create_histogram("h"), "store_duration": meter.create_histogram("h"),
    }  # fmt: skip
    return [(telemetry, "tracer", trace.NoOpTracer()), *((telemetry, k, v) for k, v in instruments.items())]


TELEMETRY_LAYERS = [
    Layer("the step event on the procedure span", "the step's progress on the procedure's span (issue 37's keep)",
          lambda m: [(otel.Attempt, "__exit__", _event_free_exit)]),
    Layer("the step histogram record (1 in histogram_every)", "procstore.step.duration",
          lambda m: [(otel.OtelTelemetry, "step_ended", _count_only)]),
    Layer("the store request hooks (count, histogram 1 in N, slow threshold)", "procstore.store.* and "
          "slow/failed request events", lambda m: [(TracedStore, "passes", lambda self, kind: True)]),
    Layer("the procedure span (SDK start/end per run)", "a span per procedure (issue 37's keep)",
          lambda m: [(otel.OtelTelemetry, "procedure_span", lambda self, *a, **k: otel._NO_SPAN)]),
    Layer("the per-run metrics (running, submitted, ended, duration)", "procstore.procedures.*",
          lambda m: [(otel.OtelTelemetry, n, _none) for n in ("running", "submitted", "ended")]),
    Layer("the attempt object (its clocks, enter/exit)", "procstore.steps, failed attempts' spans",
          lambda m: [(otel.OtelTelemetry, "step_span", lambda self, *a: NOTHING)]),
]  # fmt: skip


def floor_writes(store: StateStore, steps: int) -> Timing:
    """What any durable step framework does per write: run the step (`execute()`, after the
    submitted state's write), dump the state, encode a message, build a key and await one
    create-only put (under `raw/`, which the cleanup deletes)."""

    async def writes() -> None:
        loop, pid = new_loop(steps), ProcedureId.random()
        for step in range(steps + 1):
            if step:
                await loop.execute(cast(Context, None))  # a `Loop` never reads its context
            message = ProcedureMessage(loop.type_name, loop.dump(), None, step, None, 1).encode()
            if not await store.put_if_absent(key_text(RAW, pid, step, KeyType.STEP), message):
                raise Fenced(str(step), pid)

    return writes


async def _cpu(timing: Timing) -> float:
    started = time.thread_time()
    await timing()
    return time.thread_time() - started


def _rows(layers: Sequence[Layer]) -> list[tuple[str, list[Layer]]]:
    """As shipped, each layer removed alone, then the layers removed together, one more a row."""
    alone = [(f"- {layer.name}", [layer]) for layer in layers]
    together = [(f"cumulative, through: {layer.name}", list(layers[: i + 1])) for i, layer in enumerate(layers)]
    return [("as shipped", []), *alone, *together[1:]]


async def measure(what: str, target: Target, steps: int, runs: int, procedures: int) -> dict[str, Any]:
    """Every row's loop CPU per write over `runs` interleaved runs, and its counts per write."""
    writes = (steps + 1) * procedures
    layers = STEP_LAYERS if what == "step" else TELEMETRY_LAYERS
    if what == "telemetry":
        configure_sdk()
    async with contextlib.AsyncExitStack() as managers:
        m = await managers.enter_async_context(manager(target.url(), target, telemetry=True))
        store = _ctx(m).store.store

        def repeated(timing: Timing) -> Timing:
            async def repeat() -> None:
                for _ in range(procedures):
                    await timing()

            return repeat

        procedure = repeated(one_procedure(m, steps))
        timings: list[tuple[str, Timing, list[Patch]]]
        last: list[tuple[str, Timing, list[Patch]]]
        if what == "step":
            timings = [("raw put loop", repeated(lambda: raw_writes(store, steps + 1)), [])]
            last = [
                ("floor: execute(), dump, encode, key, one put_if_absent", repeated(floor_writes(store, steps)), [])
            ]
        else:
            off = await managers.enter_async_context(manager(target.url(), target, telemetry=False))
            timings = [("telemetry off", repeated(one_procedure(off, steps)), [])]
            last = [("SDK no-op (procstore's hooks, nothing recorded)", procedure, _sdk_noop(m))]
        timings += [
            (name, procedure, [p for layer in removed for p in layer.patches(m)]) for name, removed in _rows(layers)
        ]
        timings += last
        cleanup = raw_cleanup(store)
        counts: dict[str, dict[str, Any]] = {}
        cpu: dict[str, list[float]] = {name: [] for name, _, _ in timings}
        for run in range(runs + 2):  # a warm-up, a counted run (`sys.setprofile`), then the timed ones
            for name, timing, patches in timings:
                with patched(patches):
                    if run == 0:
                        await timing()
                    elif run == 1:
                        counts[name] = await counted(timing, writes)
                    else:
                        cpu[name].append(1e6 * await _cpu(timing) / writes)
                await cleanup()
    return {
        "what": what, "store": target.kind, "steps": steps, "procedures per timing": procedures, "runs": runs,
        "ratio to": timings[0][0], "rows": _table(cpu, counts),
        "what removing gives up": {layer.name: layer.guarantee for layer in layers},
    }  # fmt: skip


def _table(cpu: dict[str, list[float]], counts: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    """Per row: best and median loop CPU per write, their ratios to the first row's, and the
    plain calls and coroutines started per write."""
    base = next(iter(cpu.values()))
    base_best, base_median = min(base), statistics.median(base)
    table = []
    for name, xs in cpu.items():
        best, median = min(xs), statistics.median(xs)
        table.append({
            "row": name, "best": round(best, 2), "median": round(median, 2),
            "ratio best": round(best / base_best, 2), "ratio median": round(median / base_median, 2),
            "calls": counts[name].get("plain calls", 0), "coroutines": counts[name].get("coroutines started", 0),
        })  # fmt: skip
    return table


def print_table(result: dict[str, Any]) -> None:
    print(
        f"{result['what']}: lone {result['steps']}-step procedure on {result['store']}; loop CPU per write (us), "
        f"best / median of {result['runs']} interleaved runs; ratio to {result['ratio to']}; plain calls and "
        "coroutines started per write (counted)"
    )
    for row in result["rows"]:
        cpu = f"{row['best']:6.2f} / {row['median']:6.2f}  {row['ratio best']:5.2f} / {row['ratio median']:5.2f}x"
        print(f"  {row['row'][:80]:<80} {cpu}  {row['calls']:5.1f} {row['coroutines']:4.1f}")
    print("  what removing each for good would give up:")
    for name, guarantee in result["what removing gives up"].items():
        print(f"    {name}: {guarantee}")


async def profile(what: str, target: Target, steps: int, procedures: int, without: Sequence[str]) -> None:
    if what == "telemetry":
        configure_sdk()
    layers = [layer for layer in STEP_LAYERS + TELEMETRY_LAYERS if layer.name in without]
    if len(layers) != len(without):
        raise click.BadParameter(f"not a layer's name among {without}: see the table's rows")
    async with manager(target.url(), target, telemetry=True) as m:
        one = one_procedure(m, steps)
        await one()  # warm-up
        with patched([p for layer in layers for p in layer.patches(m)]):
            profiler = cProfile.Profile()
            profiler.enable()
            for _ in range(procedures):
                await one()
            profiler.disable()
    pstats.Stats(profiler).sort_stats("tottime").print_stats(25)


@click.command()
@click.option("--what", type=click.Choice(["step", "telemetry"]), default="step", show_default=True)
@click.option("--store", "kind", type=click.Choice(["memory", "local"]), default="memory", show_default=True)
@click.option("--steps", default=100, show_default=True)
@click.option("--runs", default=5, show_default=True, help="Interleaved runs of every row.")
@click.option("--procedures", default=10, show_default=True, help="Lone procedures, one after another, per timing.")
@click.option("--json", "as_json", is_flag=True, help="One JSON line instead of the table.")
@click.option("--profile", "profiled", default=0, help="Profile this many procedures instead (cProfile, top 25).")
@click.option("--profile-without", multiple=True, help="A layer's name to remove while profiling (repeatable).")
def main(
    what: str, kind: str, steps: int, runs: int, procedures: int, as_json: bool, profiled: int,
    profile_without: tuple[str, ...],
) -> None:  # fmt: skip
    """Loop CPU per write with each layer removed alone and cumulatively (measurement only)."""
    with tempfile.TemporaryDirectory(prefix="procstore-floors-") as tmp:
        target = Target(kind, "memory://" if kind == "memory" else f"{tmp}/")
        if profiled:
            asyncio.run(profile(what, target, steps, profiled, profile_without))
            return
        result = asyncio.run(measure(what, target, steps, runs, procedures))
    if as_json:
        print(json.dumps(result))
    else:
        print_table(result)


if __name__ == "__main__":
    main()
