"""Signals: `ProcedureManager.signal` stores one under the store's requests, and
`Status.wait_for_signal(name, timeout)` suspends a procedure until one of that name comes;
the next step sees it in `ctx.signals`, consumed exactly once with that step (a crash
before the step is stored delivers it again, one after does not). Virtual time where the
test waits."""

from __future__ import annotations

import asyncio
import gc
import itertools
import json
import time
import weakref
from collections.abc import Callable, Coroutine, Sequence
from pathlib import Path
from typing import Any, Self, TypeVar

import pytest
from click.testing import CliRunner

from procstore import (
    Client,
    Context,
    EndNotRecorded,
    Lease,
    Procedure,
    ProcedureError,
    ProcedureFailed,
    ProcedureId,
    ProcedureWithId,
    Status,
)
from procstore._cli.app import cli
from procstore.store import StateStore, WrappingStore, open_state_store
from procstore.store.procedure_store import ProcedureStore
from procstore.store.signals import SIGNALS_PATH, SignalStore, send_signal
from procstore.testing import Fault, FaultyStore, crash_at, kill_manager, run_simulated
from tests.support import StoreTarget, manager_for, store_targets

T = TypeVar("T")


class Waiter(Procedure):
    """Waits for `waits` signals named "go" (each with `timeout`), recording each step's
    `ctx.signals`, after an optional first sleep; returns what it got."""

    type_name = "test::Waiter"

    def __init__(self, state: dict[str, Any]) -> None:
        self.state = state

    def dump(self) -> str:
        return json.dumps(self.state)

    async def execute(self, ctx: Context) -> Status:
        state = self.state
        if state.get("sleep"):
            seconds = state.pop("sleep")
            return Status.sleep(seconds)
        if state.setdefault("waiting", False):
            state["got"] = [*state.get("got", []), dict(ctx.signals)]
            await ctx.crash_point("read")
            state["waiting"] = False
            return Status.executing()
        if len(state.get("got", [])) < state.get("waits", 1):
            state["waiting"] = True
            return Status.wait_for_signal("go", timeout=state.get("timeout"))
        return Status.done(state["got"])


def waiter(**state: Any) -> ProcedureWithId:
    return ProcedureWithId.new(Waiter(state))


class WaiterParent(Procedure):
    """Runs one `Waiter` child (waiting for two signals) under the id it stores, and ends
    with what the child got; fails if the child failed."""

    type_name = "test::WaiterParent"

    def __init__(self, child: str) -> None:
        self.child = child

    def dump(self) -> str:
        return self.child

    @classmethod
    def load(cls, data: str) -> Self:
        return cls(data)

    def new_child(self) -> Procedure:
        return Waiter({"waits": 2})

    async def execute(self, ctx: Context) -> Status:
        child = ProcedureId.parse(self.child)
        state = ctx.provider.procedure_state(child)
        if state is None:
            return Status.suspended([ProcedureWithId(child, self.new_child())])
        if state.error is not None:
            raise RuntimeError(f"its child failed: {state.error}")
        return Status.done(state.output)


async def stored_signals(manager: Any, pid: ProcedureId) -> list[str]:
    return list(await manager.store.store.walk(f"{SIGNALS_PATH}{pid}/"))


def test_a_signal_ends_the_wait_and_the_next_step_sees_its_payload() -> None:
    async def main() -> None:
        async with manager_for("memory://signals-basic/", Waiter) as manager:
            procedure = waiter()
            watcher = await manager.submit(procedure)
            await asyncio.sleep(3600)  # waits as long as it takes
            assert manager.procedure_state(procedure.id) is not None
            await manager.signal(procedure.id, "other", 0)  # not the one it waits for
            await manager.signal(procedure.id, "go", {"region": 7})
            assert await watcher.wait() == [{"go": {"region": 7}}]
            assert await stored_signals(manager, procedure.id) == [
                k for k in await stored_signals(manager, procedure.id) if "go" not in k
            ]

    run_simulated(main())


def test_signals_sent_before_the_wait_are_kept_and_delivered_in_order() -> None:
    async def main() -> None:
        async with manager_for("memory://signals-early/", Waiter) as manager:
            procedure = waiter(sleep=60, waits=3)
            watcher = await manager.submit(procedure)
            for n in range(3):
                await manager.signal(procedure.id, "go", n)
            assert await watcher.wait() == [{"go": 0}, {"go": 1}, {"go": 2}]
            assert await stored_signals(manager, procedure.id) == []

    run_simulated(main())


def test_signals_sent_one_after_another_are_delivered_in_that_order_when_the_clock_steps_back(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Found by the cluster simulation, whose clock reads the same for back-to-back sends: a
    signal's key carries its sender's clock, and a clock that read the same (a coarse one) or
    went back (an NTP step) ordered a later signal before an earlier one of the same sender."""
    stepping_back = itertools.count(time.time_ns(), -1000)
    monkeypatch.setattr(time, "time_ns", lambda: next(stepping_back))

    async def main() -> None:
        async with manager_for("memory://signals-clock-back/", Waiter) as manager:
            procedure = waiter(sleep=60, waits=3)
            watcher = await manager.submit(procedure)
            for n in range(3):
                await manager.signal(procedure.id, "go", n)
            assert await watcher.wait() == [{"go": 0}, {"go": 1}, {"go": 2}]

    run_simulated(main())


def test_a_timeout_ends_the_wait_with_no_signals() -> None:
    async def main() -> float:
        async with manager_for("memory://signals-timeout/", Waiter) as manager:
            watcher = await manager.submit(waiter(timeout=600))
            assert await watcher.wait() == [{}]
            return asyncio.get_running_loop().time()

    assert 600 <= run_simulated(main()) < 605


def test_a_signal_to_an_unknown_or_ended_procedure_is_refused() -> None:
    async def main() -> None:
        async with manager_for("memory://signals-refused/", Waiter) as manager:
            with pytest.raises(ProcedureError, match="not in the store"):
                await manager.signal(ProcedureId.random(), "go")
            procedure = waiter(timeout=1)
            await (await manager.submit(procedure)).wait()
            with pytest.raises(ProcedureError, match="ended|not in the store"):
                await manager.signal(procedure.id, "go")
            with pytest.raises(TypeError):
                await manager.signal(procedure.id, "")

    run_simulated(main())


def test_a_signal_from_another_process_is_found_by_the_request_poll() -> None:
    async def main() -> None:
        url = "memory://signals-poll/"
        async with manager_for(url, Waiter, request_poll_interval=1.0) as manager:
            procedure = waiter()
            watcher = await manager.submit(procedure)
            await asyncio.sleep(10)
            await send_signal(ProcedureStore(open_state_store(url)), procedure.id, "go", "hi")
            assert await asyncio.wait_for(watcher.wait(), 5) == [{"go": "hi"}]

    run_simulated(main())


def test_a_crash_before_the_step_is_stored_delivers_the_signal_again() -> None:
    async def main() -> None:
        url = "memory://signals-crash-before/"
        procedure = waiter(waits=2, timeout=100)
        store = FaultyStore(open_state_store(url), faults=[crash_at("read")])
        manager = manager_for(store, Waiter)
        await manager.start()
        await manager.submit(procedure)
        await asyncio.sleep(1)
        await manager.signal(procedure.id, "go", "once")
        await asyncio.wait_for(store.crashed.wait(), 5)
        await manager.stop()
        async with manager_for(url, Waiter) as again:
            watcher = again.procedure_watcher(procedure.id)
            assert watcher is not None
            # Delivered again to the step the crash cut short, and to no later wait.
            assert await watcher.wait() == [{"go": "once"}, {}]

    run_simulated(main())


def test_a_crash_after_the_step_is_stored_never_delivers_the_signal_again() -> None:
    async def main() -> None:
        url = "memory://signals-crash-after/"
        procedure = waiter(waits=2, timeout=100)
        # Killed as it deletes the consumed signal: the step that read it is stored.
        deleting = Fault("crash", kinds=frozenset({"batch_delete", "delete"}), key=f"{SIGNALS_PATH}*")
        store = FaultyStore(open_state_store(url), faults=[deleting])
        manager = manager_for(store, Waiter)
        await manager.start()
        await manager.submit(procedure)
        await asyncio.sleep(1)
        await manager.signal(procedure.id, "go", "once")
        await asyncio.wait_for(store.crashed.wait(), 5)
        await manager.stop()
        async with manager_for(url, Waiter) as again:
            watcher = again.procedure_watcher(procedure.id)
            assert watcher is not None
            assert await watcher.wait() == [{"go": "once"}, {}]
            assert await stored_signals(again, procedure.id) == []

    run_simulated(main())


@pytest.mark.parametrize("named_by", ["step", "rollback", "ended"])
def test_a_stored_step_naming_keys_that_are_not_its_signals_as_consumed_deletes_none_of_them(
    tmp_path: Path, named_by: str
) -> None:
    """Anyone who can write the store writes a step's `consumed`: the manager resuming it
    deleted every key it named, another procedure's step, the store's settings, a signal of
    another procedure, and on a local store a file outside the store's folder. Only its own
    signals are deleted; its consumed signal still is. So too for a `.rollback` naming them,
    whose rollback the manager resumes (`rollback`) or that ended under a `.commit` and is
    kept for an operator (`ended`): recovery deletes the signals such a message names."""
    root, outside = tmp_path / "store", tmp_path / "outside.txt"
    outside.write_text("not the store's")
    other = waiter(waits=1)

    async def main() -> None:
        async with manager_for(root, Waiter) as first:
            await first.submit(other)
            while len(await first.store.procedure_keys(other.id)) < 2:
                await asyncio.sleep(0.01)
            await first.signal(other.id, "later", 1)  # another name: it keeps waiting, its signal stays
        other_signal = (await stored_signals_at(root, other.id))[0]
        (root / "settings.json").write_text('{"keep_failed": true}')
        hostile = ProcedureId.random()
        own = f"{SIGNALS_PATH}{hostile}/00000000000000000001-0.json"
        (root / own).parent.mkdir(parents=True)
        (root / own).write_text('{"name": "go"}')
        consumed = ["../outside.txt", f"procedure/{other.id}/0000000000.step", "settings.json", other_signal, own]
        data = json.dumps({"waits": 0, "got": []})
        message = {"type_name": "test::Waiter", "data": data, "parent_id": None, "step": 0, "consumed": consumed}
        folder = root / "procedure" / str(hostile)
        folder.mkdir(parents=True)
        if named_by == "step":
            (folder / "0000000000.step").write_text(json.dumps(message))
        else:
            (folder / "0000000000.step").write_text(json.dumps({**message, "consumed": []}))
            failed = {**message, "step": 1, "error": "failed by hand"}
            (folder / "0000000001.rollback").write_text(json.dumps(failed))
        if named_by == "ended":
            (folder / "0000000002.commit").write_text("")
        async with manager_for(root, Waiter) as second:
            watcher = second.procedure_watcher(hostile)
            if named_by == "step":
                assert watcher is not None
                await asyncio.wait_for(watcher.wait(), 10)
            elif named_by == "rollback":
                assert watcher is not None
                with pytest.raises(ProcedureFailed, match="failed by hand"):
                    await asyncio.wait_for(watcher.wait(), 10)
            # `ended`: its start's recovery keeps it for an operator, and is over.
        assert outside.exists() and (root / "settings.json").exists() and (root / other_signal).exists()
        assert (root / "procedure" / str(other.id) / "0000000000.step").exists()
        assert not (root / own).exists()

    asyncio.run(main())


async def stored_signals_at(root: Path, pid: ProcedureId) -> list[str]:
    store = open_state_store(str(root))
    try:
        return sorted(await store.walk(f"{SIGNALS_PATH}{pid}/"))
    finally:
        await store.close()


real_store = store_targets("memory", "local", "s3")


def test_a_signal_reaches_a_waiter_after_a_restart_on_each_store(real_store: StoreTarget) -> None:
    async def main() -> None:
        procedure = waiter()
        async with manager_for(real_store, Waiter) as first:
            await first.submit(procedure)
            await asyncio.sleep(0.2)
            await first.signal(procedure.id, "early", 1)
        async with manager_for(real_store, Waiter, request_poll_interval=0.1) as second:
            watcher = second.procedure_watcher(procedure.id)
            assert watcher is not None
            await second.signal(procedure.id, "go", [1, 2])
            assert await asyncio.wait_for(watcher.wait(), 10) == [{"go": [1, 2]}]

    asyncio.run(main())


def test_procstore_signal_sends_one_from_the_command_line(tmp_path: Path) -> None:
    async def main() -> None:
        procedure = waiter()
        async with manager_for(str(tmp_path), Waiter, request_poll_interval=0.05) as manager:
            watcher = await manager.submit(procedure)
            await asyncio.sleep(0.1)
            sent = await asyncio.to_thread(
                CliRunner().invoke, cli, ["signal", str(tmp_path), str(procedure.id)[:8], "go", "--payload", '{"a": 1}']
            )
            assert sent.exit_code == 0, sent.output
            assert await asyncio.wait_for(watcher.wait(), 10) == [{"go": {"a": 1}}]
        refused = await asyncio.to_thread(CliRunner().invoke, cli, ["signal", str(tmp_path), str(procedure.id), "go"])
        assert refused.exit_code == 6 and "procedure" in refused.output

    asyncio.run(main())


@pytest.mark.parametrize(
    "payload",
    ['{"id": 123456789012345678901234567890}', "1e400", '{"a": NaN}', "[" * 5000 + "]" * 5000],
)
def test_procstore_signal_refuses_a_payload_it_would_store_changed(tmp_path: Path, payload: str) -> None:
    """orjson read an integer beyond 64 bits as a float: the signal was stored (and
    delivered) rounded, where the Python API refuses it. Nothing is written."""
    folder = tmp_path / "procedure" / "11111111-1111-4111-8111-111111111111"
    folder.mkdir(parents=True)
    (folder / "0000000000.step").write_text(json.dumps({"type_name": "t", "data": "{}", "parent_id": None, "step": 0}))
    sent = CliRunner().invoke(cli, ["signal", str(tmp_path), folder.name, "go", "--payload", payload])
    assert sent.exit_code == 2, sent.output
    assert not (tmp_path / SIGNALS_PATH).exists()


def test_a_signal_name_with_a_lone_surrogate_is_refused_clearly_before_anything_is_written() -> None:
    """UTF-8 cannot store a lone surrogate (what Python makes of an argument's byte that is
    not UTF-8): refused as a reason with one is, naming it, not with the encoder's error."""

    async def main() -> None:
        url = "memory://signals-surrogate-name/"
        async with manager_for(url, Waiter) as manager, Client(url) as client:
            procedure = waiter()
            await manager.submit(procedure)
            with pytest.raises(ValueError, match="a signal's name must be valid Unicode text"):
                await manager.signal(procedure.id, "go\ud800")
            with pytest.raises(ValueError, match="a signal's name must be valid Unicode text"):
                await client.signal(procedure.id, "\udcff")
            assert await stored_signals(manager, procedure.id) == []

    asyncio.run(main())
    # Nor can a step wait for one: no signal could end that wait.
    with pytest.raises(ValueError, match="a signal's name must be valid Unicode text"):
        Status.wait_for_signal("go\ud800")


@pytest.mark.parametrize(
    "command",
    [
        ["signal", "{id}", "\udcff"],
        ["cancel", "{id}", "--yes", "--reason", "\udcff"],
        ["resume", "{id}", "--force", "--reason", "\udcff"],
    ],
)
def test_procstore_refuses_an_argument_that_is_not_utf8_as_a_usage_error(tmp_path: Path, command: list[str]) -> None:
    """A name or reason given with a byte that is not UTF-8 (Python reads it as a lone
    surrogate): exit 2, naming the parameter, and nothing written; not an internal error."""
    folder = tmp_path / "procedure" / "11111111-1111-4111-8111-111111111111"
    folder.mkdir(parents=True)
    (folder / "0000000000.step").write_text(json.dumps({"type_name": "t", "data": "{}", "parent_id": None, "step": 0}))
    args = [command[0], str(tmp_path), *(part.format(id=folder.name) for part in command[1:])]
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 2, result.output
    assert "must be valid Unicode text" in result.output
    assert not (tmp_path / "requests").exists()


def test_old_signals_of_procedures_the_store_no_longer_holds_are_deleted() -> None:
    async def main() -> None:
        url = "memory://signals-stale/"
        gone, recent = ProcedureId.random(), ProcedureId.random()
        store = open_state_store(url)
        old_key = f"{SIGNALS_PATH}{gone}/{1:020d}-00000000.json"
        await store.put(old_key, b'{"name":"go","payload":null}')
        recent_key = await SignalStore(store).put(recent, "go")
        async with manager_for(url, Waiter, request_poll_interval=1.0):
            await asyncio.sleep(3)
        assert await store.walk(SIGNALS_PATH) == [recent_key]

    run_simulated(main())


def test_a_cancel_ends_a_wait_for_a_signal_at_once() -> None:
    async def main() -> float:
        async with manager_for("memory://signals-cancel/", Waiter) as manager:
            procedure = waiter()
            watcher = await manager.submit(procedure)
            await asyncio.sleep(100)
            await manager.cancel(procedure.id, "no signal will come")
            with pytest.raises(ProcedureFailed, match="no signal will come"):
                await watcher.wait()
            return asyncio.get_running_loop().time()

    assert run_simulated(main()) < 101


def test_a_standby_sends_a_signal_that_the_leader_delivers() -> None:
    async def main() -> None:
        url = "memory://signals-standby/"
        procedure = waiter()
        async with (
            manager_for(url, Waiter, lease=Lease(ttl=10.0, holder="leader"), request_poll_interval=1.0) as leader,
            manager_for(url, Waiter, lease=Lease(ttl=10.0, holder="standby")) as standby,
        ):
            await leader.wait_until_leading()
            watcher = await leader.submit(procedure)
            await asyncio.sleep(5)
            assert not standby.is_leader
            await standby.signal(procedure.id, "go", "from the standby")
            assert await asyncio.wait_for(watcher.wait(), 10) == [{"go": "from the standby"}]

    run_simulated(main())


def test_a_takeover_delivers_a_signal_sent_while_no_manager_led() -> None:
    async def main() -> None:
        url = "memory://signals-takeover/"
        procedure = waiter()
        first = manager_for(url, Waiter, lease=Lease(ttl=10.0, holder="first"))
        await first.start()
        await first.wait_until_leading()
        await first.submit(procedure)
        await asyncio.sleep(5)
        await kill_manager(first)
        await send_signal(ProcedureStore(open_state_store(url)), procedure.id, "go", 7)
        async with manager_for(url, Waiter, lease=Lease(ttl=10.0, holder="second")) as second:
            await second.wait_until_leading()
            watcher = second.procedure_watcher(procedure.id)
            assert watcher is not None
            assert await asyncio.wait_for(watcher.wait(), 60) == [{"go": 7}]
        await first.stop()

    run_simulated(main())


class SlowSignalListing(WrappingStore):
    """Answers a listing of signals `seconds` late, with what the folder held when it was
    listed: a signal stored meanwhile is not in the answer."""

    def __init__(self, inner: StateStore, seconds: float) -> None:
        super().__init__(inner)
        self.seconds = seconds
        self.listed = asyncio.Event()

    async def around(
        self, kind: str, key: str, call: Callable[[], Coroutine[Any, Any, T]], value: bytes | None = None
    ) -> T:
        result = await call()
        if kind == "walk" and key.startswith(SIGNALS_PATH) and self.seconds:
            self.listed.set()
            await asyncio.sleep(self.seconds)
        return result


def test_a_signal_sent_while_the_waiter_reads_its_signals_wakes_it_at_once() -> None:
    """The read before parking may miss a signal stored during it: one sent through this
    manager meanwhile makes it read again, instead of waiting for the next poll."""

    async def main() -> float:
        store = SlowSignalListing(open_state_store("memory://signals-during-read/"), seconds=5)
        async with manager_for(store, Waiter, request_poll_interval=1000.0) as manager:
            procedure = waiter()
            watcher = await manager.submit(procedure)
            await store.listed.wait()
            store.seconds = 0
            await manager.signal(procedure.id, "go", "during the read")
            assert await watcher.wait() == [{"go": "during the read"}]
            return asyncio.get_running_loop().time()

    assert run_simulated(main()) < 100


def test_a_cancel_sent_while_the_waiter_reads_its_signals_ends_the_wait() -> None:
    """A cancel noted during the read before parking finds nothing parked to wake: the waiter
    must see it before it parks, or it waits for a signal that may never come."""

    async def main() -> float:
        store = SlowSignalListing(open_state_store("memory://signals-cancel-during-read/"), seconds=5)
        async with manager_for(store, Waiter, request_poll_interval=1.0) as manager:
            procedure = waiter()
            watcher = await manager.submit(procedure)
            await store.listed.wait()
            await manager.cancel(procedure.id, "cancelled during the read")
            with pytest.raises(ProcedureFailed, match="cancelled during the read"):
                await asyncio.wait_for(watcher.wait(), 600)
            return asyncio.get_running_loop().time()

    assert run_simulated(main()) < 100


def test_a_cancel_ends_the_backoff_of_a_failing_read_of_signals_and_is_the_recorded_end() -> None:
    """The read of its signals before it parks fails (the listing, again and again): an
    operator's cancel ends its backoff at once, as it ends a step's, and the procedure ends
    cancelled, not failed with the store's error once the retries run out."""

    async def main() -> float:
        url = "memory://signals-cancel-read-backoff/"
        failing = Fault("transient", kinds=frozenset({"walk"}), key=f"{SIGNALS_PATH}*")
        store = FaultyStore(open_state_store(url), faults=[failing])
        options: dict[str, Any] = {"retry_delay": 5.0, "max_retry_delay": 5.0, "max_retry_times": 5}
        async with manager_for(store, Waiter, **options) as manager, Client(url) as client:
            procedure = waiter()
            watcher = await manager.submit(procedure)
            await asyncio.sleep(1)
            await manager.cancel(procedure.id, "cancelled while its read backs off")
            with pytest.raises(ProcedureFailed, match="cancelled while its read backs off"):
                await watcher.wait()
            ended = asyncio.get_running_loop().time()
            (record,) = await client.history(procedure_id=procedure.id)
            assert record.outcome == "cancelled" and record.ended_by is not None
            return ended

    assert run_simulated(main()) < 2


def test_a_cancel_ends_the_backoff_of_a_failing_deletion_of_consumed_signals() -> None:
    """The step that read a signal is stored, and the signal's deletion fails again and
    again: an operator's cancel ends that backoff at once (the stored message names the
    signal, so it is never delivered again), rather than after every retry."""

    async def main() -> float:
        failing = Fault("transient", kinds=frozenset({"batch_delete", "delete"}), key=f"{SIGNALS_PATH}*")
        store = FaultyStore(open_state_store("memory://signals-cancel-delete-backoff/"), faults=[failing])
        options: dict[str, Any] = {"retry_delay": 5.0, "max_retry_delay": 5.0, "max_retry_times": 5}
        async with manager_for(store, Waiter, **options) as manager:
            procedure = waiter(waits=2)
            watcher = await manager.submit(procedure)
            await asyncio.sleep(1)
            await manager.signal(procedure.id, "go", 1)
            await asyncio.sleep(1)  # its deletion backs off
            await manager.cancel(procedure.id, "cancelled while a deletion backs off")
            cancelled = asyncio.get_running_loop().time()
            with pytest.raises(ProcedureFailed, match="cancelled while a deletion backs off"):
                await watcher.wait()
            return asyncio.get_running_loop().time() - cancelled

    assert run_simulated(main()) < 1


@pytest.mark.parametrize("signalled", ["root", "child"])
def test_a_signal_consumed_before_a_cancel_cut_its_deletions_short_never_reaches_a_rewound_run(signalled: str) -> None:
    """The step that read a signal is stored; its deletion fails, a cancel ends that backoff,
    and the deletion after the failure's `.commit` fails too, so the signal stays in the
    store. A rewind to the first wait copies a message from before it: the rewound run must
    still never get it (it got it again). For a child, whose cancel its parent's brings, its
    messages go with its tree, so the deletion at its `.commit` is retried in full; the
    parent's rewind creates the child again under the same id, and that run must not get
    the signal (it did)."""

    async def main() -> object:
        twice = Fault("transient", kinds=frozenset({"batch_delete", "delete"}), key=f"{SIGNALS_PATH}*", times=2)
        store = FaultyStore(open_state_store(f"memory://signals-cancel-rewind-{signalled}/"), faults=[twice])
        options: dict[str, Any] = {"retry_delay": 5.0, "max_retry_delay": 5.0, "max_retry_times": 5}
        async with manager_for(store, Waiter, WaiterParent, keep_failed=True, **options) as manager:
            if signalled == "root":
                root, to_step = waiter(waits=2), 1
                waits = root.id
            else:
                waits, to_step = ProcedureId.random(), 0
                root = ProcedureWithId.new(WaiterParent(str(waits)))
            watcher = await manager.submit(root)
            await asyncio.sleep(1)
            await manager.signal(waits, "go", 1)
            await asyncio.sleep(1)  # its deletion backs off
            await manager.cancel(root.id, "cancelled while a deletion backs off")
            with pytest.raises(ProcedureFailed, match="cancelled while a deletion backs off"):
                await watcher.wait()
            assert twice.fired == 2
            rewound = await manager.rewind(root.id, to_step, reason="ask again")
            await asyncio.sleep(1)
            await manager.signal(waits, "go", 2)
            await manager.signal(waits, "go", 3)
            return await rewound.wait()

    assert run_simulated(main()) == [{"go": 2}, {"go": 3}]


def test_a_signalled_wait_with_a_long_timeout_leaves_nothing_of_the_procedure_behind() -> None:
    # Its timer's heap item outlives the wait until the timeout: it must not hold the procedure.
    alive: list[weakref.ref[Waiter]] = []

    class Tracked(Waiter):
        type_name = "test::TrackedWaiter"

        def __init__(self, state: dict[str, Any]) -> None:
            super().__init__(state)
            alive.append(weakref.ref(self))

    async def main() -> None:
        async with manager_for("memory://signals-forgotten/", Tracked) as manager:
            procedures = [ProcedureWithId.new(Tracked({"timeout": 7 * 86400})) for _ in range(100)]
            watchers = [await manager.submit(p) for p in procedures]
            await asyncio.sleep(1)
            for procedure in procedures:
                await manager.signal(procedure.id, "go")
            for watcher in watchers:
                await watcher.wait()
            del procedures, watchers, watcher
            await asyncio.sleep(3600)
            gc.collect()
            # Of 100: a context's log scope may still name the last ones to run (as without a timeout).
            assert sum(ref() is not None for ref in alive) <= 2

    run_simulated(main())


class CountingSignalReads(WrappingStore):
    """Counts the listings and the reads of signals (a `get_many` counts each key)."""

    def __init__(self, inner: StateStore) -> None:
        super().__init__(inner)
        self.listings = 0
        self.reads = 0

    def get_many(self, keys: Sequence[str]) -> Coroutine[Any, Any, list[bytes | Exception | None]]:
        self.reads += sum(key.startswith(SIGNALS_PATH) for key in keys)
        return super().get_many(keys)

    def around(
        self, kind: str, key: str, call: Callable[[], Coroutine[Any, Any, T]], value: bytes | None = None
    ) -> Coroutine[Any, Any, T]:
        if key.startswith(SIGNALS_PATH):
            self.listings += kind == "walk"
            self.reads += kind == "get"
        return call()


def test_a_signal_of_another_name_does_not_wake_a_parked_waiter() -> None:
    # It stays for a later wait of its name; the waiter reads it once, and then holds no task.
    async def main() -> None:
        store = CountingSignalReads(open_state_store("memory://signals-other-name/"))
        async with manager_for(store, Waiter, request_poll_interval=1.0) as manager:
            procedure = waiter()
            watcher = await manager.submit(procedure)
            await asyncio.sleep(2)
            await send_signal(ProcedureStore(store), procedure.id, "other", 1)  # from another process
            await manager.signal(procedure.id, "later", 2)  # through the manager
            await asyncio.sleep(5)
            before = store.listings + store.reads
            await asyncio.sleep(600)
            assert store.listings + store.reads == before
            await manager.signal(procedure.id, "go", 3)
            assert await watcher.wait() == [{"go": 3}]

    run_simulated(main())


def test_delivering_n_queued_signals_costs_about_n_reads() -> None:
    n = 200

    async def main() -> None:
        store = CountingSignalReads(open_state_store("memory://signals-queued/"))
        async with manager_for(store, Waiter) as manager:
            procedure = waiter(waits=n)
            watcher = await manager.submit(procedure)
            await asyncio.gather(*(manager.signal(procedure.id, "go", i) for i in range(n)))
            got = await watcher.wait()
            assert isinstance(got, list)
            assert sorted(g["go"] for g in got) == list(range(n))  # sent at once: in no set order
            assert store.reads <= 3 * n

    run_simulated(main())


class Picky(Procedure):
    """Waits for one signal "go" and ends with its value; fails, having seen it, on "boom"."""

    type_name = "test::Picky"

    def __init__(self, state: dict[str, Any]) -> None:
        self.state = state

    def dump(self) -> str:
        return json.dumps(self.state)

    async def execute(self, ctx: Context) -> Status:
        if not self.state.get("waiting"):
            self.state["waiting"] = True
            return Status.wait_for_signal("go")
        if ctx.signals.get("go") == "boom":
            raise ValueError("boom")
        return Status.done(ctx.signals.get("go"))


class PickyParent(WaiterParent):
    """Runs one `Picky` child under the id it stores; fails if the child failed."""

    type_name = "test::PickyParent"

    def new_child(self) -> Procedure:
        return Picky({})


@pytest.mark.parametrize("crash", ["rollback", "commit"])
def test_a_signal_a_failed_child_saw_never_reaches_the_child_its_rewound_parent_creates_after_a_crash(
    crash: str,
) -> None:
    """A child's step sees a signal and fails: its `.rollback` names it, and it is deleted
    after the `.commit`. Killed before that deletion (after the `.rollback`, or after the
    `.commit`), the next start finished the child and never deleted the signal: the child
    its kept parent's rewind creates again under the same id got it a second time."""

    async def main() -> object:
        url = f"memory://signals-failed-child-crash-{crash}/"
        child = ProcedureId.random()
        # Killed as the child writes its `.commit` (the `.rollback` is stored), or as it
        # deletes the signal its failed step saw (the `.commit` is stored).
        writes, deletes = frozenset({"put", "put_if_absent"}), frozenset({"batch_delete", "delete"})
        point = (
            Fault("crash", kinds=writes, key=f"*{child}*.commit")
            if crash == "rollback"
            else Fault("crash", kinds=deletes, key=f"{SIGNALS_PATH}*")
        )
        store = FaultyStore(open_state_store(url), faults=[point])
        parent = ProcedureWithId.new(PickyParent(str(child)))
        manager = manager_for(store, Picky, PickyParent, keep_failed=True)
        await manager.start()
        await manager.submit(parent)
        await asyncio.sleep(1)
        await manager.signal(child, "go", "boom")
        await asyncio.wait_for(store.crashed.wait(), 5)
        await manager.stop()
        async with manager_for(url, Picky, PickyParent, keep_failed=True) as again:
            watcher = again.procedure_watcher(parent.id)
            assert watcher is not None
            with pytest.raises(ProcedureFailed, match="its child failed"):
                await watcher.wait()
            rewound = await again.rewind(parent.id, 0, reason="again")
            await asyncio.sleep(1)
            await again.signal(child, "go", "fine")
            return await rewound.wait()

    assert run_simulated(main()) == "fine"


@pytest.mark.parametrize("rewound", ["before the next start", "in its term"])
def test_a_signal_a_failed_child_saw_never_reaches_the_child_of_its_parents_rewound_run_when_its_deletion_failed(
    rewound: str,
) -> None:
    """The deletion of the signal a failed child's step saw fails past its retries, and the
    child's keys stay with its kept parent's: its manager killed as it deletes them, the
    parent rewound before the next start; or the parent's end refused by the store, and it
    rewound on the same manager. The rewind's run (at that start, or at once) deletes the
    child of the earlier run, and deleted none of the signals its `.rollback` names: the
    child the new run creates under the same id got it a second time."""

    async def main() -> object:
        url = f"memory://signals-failed-child-rewound-{rewound.replace(' ', '-')}/"
        child = ProcedureId.random()
        parent = ProcedureWithId.new(PickyParent(str(child)))
        deletes, writes = frozenset({"batch_delete", "delete"}), frozenset({"put", "put_if_absent"})
        kept = (
            Fault("crash", kinds=deletes, key=f"*{child}*")
            if rewound == "before the next start"
            else Fault("error", kinds=writes, key=f"*{parent.id}*.commit")
        )
        store = FaultyStore(open_state_store(url), faults=[Fault("error", kinds=deletes, key=f"{SIGNALS_PATH}*"), kept])
        manager = manager_for(store, Picky, PickyParent, keep_failed=True)
        await manager.start()
        first = await manager.submit(parent)
        await asyncio.sleep(1)
        await manager.signal(child, "go", "boom")
        if rewound == "before the next start":
            await asyncio.wait_for(store.crashed.wait(), 5)
            await manager.stop()
            async with Client(url) as client:
                await client.rewind(parent.id, 0, reason="again")
            manager = manager_for(url, Picky, PickyParent, keep_failed=True)
            await manager.start()
            watcher = manager.procedure_watcher(parent.id)
            assert watcher is not None
        else:
            with pytest.raises(EndNotRecorded):
                await first.wait()
            store.plan.faults.clear()
            watcher = await manager.rewind(parent.id, 0, reason="again")
        try:
            await asyncio.sleep(1)
            await manager.signal(child, "go", "fine")
            return await watcher.wait()
        finally:
            await manager.stop()

    assert run_simulated(main()) == "fine"
