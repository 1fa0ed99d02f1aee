"""Operators' resume, rewind and history: through the manager's public API, crash-tested."""

from __future__ import annotations

import asyncio
import json
import uuid
from pathlib import Path
from typing import Any, ClassVar, Literal

import pytest

from procstore import (
    Context,
    History,
    Procedure,
    ProcedureError,
    ProcedureFailed,
    ProcedureId,
    ProcedureManager,
    ProcedureWithId,
    Status,
)
from procstore.store import StateStore
from procstore.store.history import HistoryStore
from procstore.store.local import LocalDirStore
from procstore.store.procedure_store import ProcedureStore
from procstore.store.requests import OperatorRequest
from procstore.testing import Fault, FaultyStore, kill_manager
from tests.support import manager_for


class Flaky(Procedure):
    """Four steps; step `fail_at` fails while its name is in `broken` (no rollback)."""

    type_name = "tests::Flaky"
    broken: ClassVar[set[str]] = set()
    effects: ClassVar[dict[str, list[int]]] = {}

    def __init__(self, data: dict[str, Any]) -> None:
        self.data = data

    async def execute(self, ctx: Context) -> Status:
        at, name = self.data["at"], self.data["name"]
        if at == self.data["fail_at"] and name in self.broken:
            raise ValueError(f"{name} broke at step {at}")
        self.effects.setdefault(name, []).append(at)
        self.data["at"] = at + 1
        return Status.done(name) if at + 1 >= 4 else Status.executing()

    def dump(self) -> str:
        return json.dumps(self.data)

    @classmethod
    def load(cls, data: str) -> Flaky:
        return cls(json.loads(data))


class Undone(Flaky):
    """Flaky with a rollback."""

    type_name = "tests::Undone"
    rollback_supported = True

    async def rollback(self, ctx: Context) -> None:
        self.effects.setdefault(self.data["name"], []).append(-1)


def flaky(cls: type[Flaky] = Flaky, fail_at: int = 2) -> tuple[ProcedureWithId, str]:
    name = uuid.uuid4().hex
    Flaky.broken.add(name)
    return ProcedureWithId.new(cls({"name": name, "at": 0, "fail_at": fail_at})), name


def manager_on(store: StateStore | str, **options: Any) -> ProcedureManager:
    """A failure is final at once: these tests are about what an operator does next."""
    return manager_for(store, Flaky, Undone, max_retry_times=0, **options)


async def failed_and_kept(manager: ProcedureManager, cls: type[Flaky] = Flaky) -> tuple[ProcedureId, str]:
    procedure, name = flaky(cls)
    watcher = await manager.submit(procedure)
    with pytest.raises(ProcedureFailed):
        await watcher.wait()
    assert await manager.store.procedure_keys(procedure.id), "keep_failed keeps a failed root's keys"
    return procedure.id, name


async def test_resume_runs_a_failed_root_from_its_last_step(tmp_path: Path) -> None:
    async with manager_on(str(tmp_path), keep_failed=True) as manager:
        pid, name = await failed_and_kept(manager)
        Flaky.broken.discard(name)
        assert await (await manager.resume(pid)).wait() == name
        assert Flaky.effects[name] == [0, 1, 2, 3]  # nothing before the failure ran twice
        assert await manager.store.procedure_keys(pid) == []  # done: deleted as usual


async def test_rewind_runs_again_from_the_step_asked_for_and_keeps_every_key(tmp_path: Path) -> None:
    async with manager_on(str(tmp_path), keep_failed=True) as manager:
        pid, name = await failed_and_kept(manager)
        before = [str(k) for k in await manager.store.procedure_keys(pid)]
        Flaky.broken.discard(name)
        Flaky.broken.add(name + "-never")  # still fails nowhere
        watcher = await manager.rewind(pid, 1)
        assert await watcher.wait() == name
        assert Flaky.effects[name] == [0, 1, 1, 2, 3]
    assert before  # step keys were never overwritten: the rewind wrote above them


async def test_a_restart_is_refused_with_the_reason(tmp_path: Path) -> None:
    async with manager_on(str(tmp_path), keep_failed=True) as manager:
        with pytest.raises(ProcedureError, match="not in the store"):
            await manager.resume(ProcedureId.random())
        pid, name = await failed_and_kept(manager)
        with pytest.raises(ProcedureError, match="no step 9"):
            await manager.rewind(pid, 9)
        with pytest.raises(ValueError, match="to_step"):
            await manager.rewind(pid, -1)
        Flaky.broken.discard(name)
        await (await manager.resume(pid)).wait()
        with pytest.raises(ProcedureError, match="finished successfully"):
            await manager.resume(pid)


async def test_a_running_procedure_is_not_restarted(tmp_path: Path) -> None:
    gate = asyncio.Event()

    class Waits(Flaky):
        type_name = "tests::Waits"

        async def execute(self, ctx: Context) -> Status:
            await gate.wait()
            return Status.done()

    async with manager_on(str(tmp_path), keep_failed=True) as manager:
        manager.register(Waits)
        watcher = await manager.submit(ProcedureWithId.new(Waits({"name": "w", "at": 0, "fail_at": 9})))
        with pytest.raises(ProcedureError, match="running here"):
            await manager.resume(watcher.procedure_id)
        with pytest.raises(ProcedureError, match="running here"):
            await manager.rewind(watcher.procedure_id, 0)
        gate.set()
        await watcher.wait()


async def test_a_rolled_back_root_is_rewound_not_resumed(tmp_path: Path) -> None:
    async with manager_on(str(tmp_path), keep_failed=True) as manager:
        pid, name = await failed_and_kept(manager, Undone)
        assert Flaky.effects[name] == [0, 1, -1]
        with pytest.raises(ProcedureError, match="rewind it instead"):
            await manager.resume(pid)
        Flaky.broken.discard(name)
        assert await (await manager.rewind(pid, 0)).wait() == name
        assert Flaky.effects[name] == [0, 1, -1, 0, 1, 2, 3]


async def killed_at_step_1(tmp_path: Path, type_name: str) -> tuple[ProcedureWithId, str]:
    """A `Flaky` of type `type_name` stored at step 1, its manager killed: a store that a
    manager without a loader for `type_name` cannot resume."""
    gate = asyncio.Event()

    class Stalls(Flaky):
        async def execute(self, ctx: Context) -> Status:
            if self.data["at"] == 1:
                await gate.wait()  # never set: the manager is killed here
            return await super().execute(ctx)

    Stalls.type_name = type_name
    name = uuid.uuid4().hex
    procedure = ProcedureWithId.new(Stalls({"name": name, "at": 0, "fail_at": 9}))
    first = manager_on(str(tmp_path))
    first.register(Stalls)
    await first.start()
    await first.submit(procedure)
    await asyncio.sleep(0.1)
    await kill_manager(first)
    await first.stop()
    return procedure, name


async def test_a_root_that_could_not_be_loaded_is_resumed_once_its_loader_is_registered(tmp_path: Path) -> None:
    procedure, name = await killed_at_step_1(tmp_path, "tests::Stalls")
    async with ProcedureManager(str(tmp_path)) as second:  # no loader for it
        assert [p.procedure_id for p in second.recovery_problems] == [procedure.id]
        with pytest.raises(ProcedureError, match="no loader"):
            await second.resume(procedure.id)
        second.register(Flaky)

        class Resumed(Flaky):
            type_name = "tests::Stalls"

        second.register_loader("tests::Stalls", Resumed.load)
        assert await (await second.resume(procedure.id)).wait() == name
    assert Flaky.effects[name] == [0, 1, 2, 3]


async def test_a_cancelled_procedure_is_resumed_without_its_old_request(tmp_path: Path) -> None:
    gate = asyncio.Event()

    class Held(Flaky):
        type_name = "tests::Held"

        async def execute(self, ctx: Context) -> Status:
            if self.data["at"] == 1 and self.data["name"] in Flaky.broken:
                await gate.wait()
            return await super().execute(ctx)

    async with manager_on(str(tmp_path), keep_failed=True, request_poll_interval=0.05) as manager:
        manager.register(Held)
        procedure, name = flaky(Held, fail_at=9)
        watcher = await manager.submit(procedure)
        await asyncio.sleep(0.1)
        await manager.cancel(procedure.id, "operator test")
        gate.set()
        with pytest.raises(ProcedureFailed, match="operator test"):
            await watcher.wait()
        Flaky.broken.discard(name)
        assert await (await manager.resume(procedure.id)).wait() == name


@pytest.mark.parametrize("when", ["before", "after"])
async def test_a_crash_at_any_write_of_a_rewind_leaves_it_applied_or_not_at_all(
    tmp_path: Path, when: Literal["before", "after"]
) -> None:
    async with manager_on(str(tmp_path), keep_failed=True) as manager:
        pid, name = await failed_and_kept(manager)
    Flaky.broken.discard(name)
    writes = frozenset({"put", "put_if_absent", "batch_delete", "delete"})
    for nth in range(3):
        crashing = FaultyStore(LocalDirStore(tmp_path), faults=[Fault("crash", kinds=writes, nth=nth, when=when)])
        manager = manager_on(crashing, keep_failed=True)
        await manager.start()
        try:
            watcher = await manager.rewind(pid, 0)
            await asyncio.wait_for(watcher.wait(), 5)
        except BaseException:
            pass
        await manager.stop()
        async with manager_on(str(tmp_path), keep_failed=True) as after:
            keys = await after.store.procedure_keys(pid)
            if not keys:
                break  # the rewound run finished (here or at this start)
            state = after.procedure_state(pid)
            watcher_after = after.procedure_watcher(pid)
            if watcher_after is not None:
                await asyncio.wait_for(watcher_after.wait(), 5)
                break
            assert state is None  # still ended and kept, untouched: the next try applies it
    effects = Flaky.effects[name]
    assert effects[:2] == [0, 1] and effects[-4:] == [0, 1, 2, 3]


async def test_history_records_every_end_before_keys_go(tmp_path: Path) -> None:
    async with manager_on(str(tmp_path), history=History(max_records=100)) as manager:
        done, done_name = flaky(fail_at=9)
        Flaky.broken.discard(done_name)
        await (await manager.submit(done)).wait()
        failed, _ = flaky()
        with pytest.raises(ProcedureFailed):
            await (await manager.submit(failed)).wait()
        undone, _ = flaky(Undone)
        with pytest.raises(ProcedureFailed):
            await (await manager.submit(undone)).wait()
        await asyncio.sleep(0.05)
    records = {r.id: r for r in await HistoryStore(LocalDirStore(tmp_path)).list()}
    assert records[str(done.id)].outcome == "done" and records[str(done.id)].steps == 4
    assert records[str(failed.id)].outcome == "failed" and "broke at step 2" in (records[str(failed.id)].error or "")
    assert records[str(undone.id)].outcome == "rolled back"
    assert records[str(done.id)].started_at is not None and records[str(done.id)].type_name == "tests::Flaky"


async def test_history_is_swept_beyond_its_count(tmp_path: Path) -> None:
    store = HistoryStore(LocalDirStore(tmp_path), settings=History(max_records=2))
    async with manager_on(str(tmp_path), history=True) as manager:
        for _ in range(4):
            procedure, _ = flaky(fail_at=9)
            await (await manager.submit(procedure)).wait()
    assert len(await store.list()) == 4
    assert await store.sweep() == 2
    assert len(await store.list()) == 2


async def test_two_concurrent_resumes_run_the_procedure_once(tmp_path: Path) -> None:
    async with manager_on(str(tmp_path), keep_failed=True) as manager:
        pid, name = await failed_and_kept(manager)
        Flaky.broken.discard(name)
        results = await asyncio.gather(manager.resume(pid), manager.resume(pid), return_exceptions=True)
        watchers = [r for r in results if not isinstance(r, BaseException)]
        errors = [r for r in results if isinstance(r, BaseException)]
        assert len(watchers) == 1 and isinstance(errors[0], ProcedureError), results
        await watchers[0].wait()
        assert Flaky.effects[name] == [0, 1, 2, 3]


async def test_a_failed_root_whose_keys_went_is_not_restarted(tmp_path: Path) -> None:
    async with manager_on(str(tmp_path)) as manager:  # keep_failed off: deleted as it ends
        procedure, _ = flaky()
        with pytest.raises(ProcedureFailed):
            await (await manager.submit(procedure)).wait()
        with pytest.raises(ProcedureError, match="keys are deleted"):
            await manager.resume(procedure.id)


@pytest.mark.parametrize("value", [b"{not json", b'{"kind":"cancel","x":' + b"[" * 2000 + b"]" * 2000 + b"}"])
async def test_an_unreadable_request_is_logged_once_not_every_poll(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, value: bytes
) -> None:
    gate = asyncio.Event()

    class Waits(Flaky):
        type_name = "tests::WaitsForGate"

        async def execute(self, ctx: Context) -> Status:
            await gate.wait()
            return Status.done()

    async with manager_on(str(tmp_path), request_poll_interval=0.02) as manager:
        manager.register(Waits)
        watcher = await manager.submit(ProcedureWithId.new(Waits({"name": "w", "at": 0, "fail_at": 9})))
        await manager.store.store.put(f"requests/{watcher.procedure_id}.json", value)
        await asyncio.sleep(0.3)
        gate.set()
        await watcher.wait()
    said = [r for r in caplog.records if "ignoring the operator request" in r.getMessage()]
    assert len(said) == 1, said


async def test_cancelling_a_kept_failed_root_after_a_restart_is_refused(tmp_path: Path) -> None:
    async with manager_on(str(tmp_path), keep_failed=True) as manager:
        pid, _ = await failed_and_kept(manager)
    async with manager_on(str(tmp_path), keep_failed=True) as manager:
        assert manager.procedure_state(pid) is None  # not run here: only its keys say it ended
        with pytest.raises(ProcedureError, match="already ended"):
            await manager.cancel(pid, "late")
    assert await LocalDirStore(tmp_path).walk("requests/") == []


async def test_a_resume_nudge_left_while_no_manager_ran_is_honoured_by_a_manager_without_keep_failed(
    tmp_path: Path,
) -> None:
    async with manager_on(str(tmp_path), keep_failed=True) as manager:
        pid, name = await failed_and_kept(manager)
    Flaky.broken.discard(name)
    await ProcedureStore(LocalDirStore(tmp_path)).resumes.put(pid, OperatorRequest.new("resume", "resume"))
    async with manager_on(str(tmp_path), request_poll_interval=0.02) as manager:
        for _ in range(200):
            if (watcher := manager.procedure_watcher(pid)) is not None:
                break
            await asyncio.sleep(0.01)
        assert watcher is not None, "recovery deleted the nudged root instead of resuming it"
        assert await watcher.wait() == name
    assert Flaky.effects[name] == [0, 1, 2, 3]


async def test_resuming_an_unloadable_root_through_the_api_drops_its_old_request(tmp_path: Path) -> None:
    """A request stored before `manager.resume` is older than the operator's word: deleted,
    as for a resume that writes a copy (only a nudge after a rewind's copy keeps one)."""
    procedure, name = await killed_at_step_1(tmp_path, "tests::Stuck")
    async with ProcedureManager(str(tmp_path), request_poll_interval=60) as second:  # no loader for it
        await second.store.requests.put(procedure.id, OperatorRequest.new("cancel", "before the fix"))

        class Fixed(Flaky):
            type_name = "tests::Stuck"

        second.register_loader("tests::Stuck", Fixed.load)
        assert await asyncio.wait_for((await second.resume(procedure.id)).wait(), 10) == name
    assert Flaky.effects[name] == [0, 1, 2, 3]


async def test_a_look_for_requests_and_resume_nudges_is_one_listing(tmp_path: Path) -> None:
    """The watch runs for a manager's whole life: on an object store each listing is a
    request about once a second. `requests/resume/` is inside `requests/`, so one listing
    serves both, and a nudge found by it is still acted on."""
    listed: list[str] = []

    class Counted(LocalDirStore):
        def walk(self, prefix: str) -> Any:
            listed.append(prefix)
            return super().walk(prefix)

    async with manager_on(str(tmp_path), keep_failed=True) as manager:
        pid, name = await failed_and_kept(manager)
    Flaky.broken.discard(name)
    async with manager_on(Counted(tmp_path), keep_failed=True, request_poll_interval=0.02) as manager:
        listed.clear()  # recovery's own listings (once, at the start) are another matter
        await asyncio.sleep(0.2)
        looks = [prefix for prefix in listed if prefix.startswith("requests/")]
        assert looks and set(looks) == {"requests/"}, listed
        await ProcedureStore(LocalDirStore(tmp_path)).resumes.put(pid, OperatorRequest.new("resume", "resume"))
        for _ in range(200):
            if (watcher := manager.procedure_watcher(pid)) is not None:
                break
            await asyncio.sleep(0.01)
        assert watcher is not None
        assert await watcher.wait() == name


async def test_a_cancel_whose_time_no_calendar_holds_is_honoured_and_recorded_as_a_cancel(tmp_path: Path) -> None:
    """A request stored by other hands with `requested_at` 1e300: the runner failed the
    procedure with an `OverflowError` (history said `failed`, the error that) while
    recording who ended it. It is cancelled, its record says so, with no time."""
    from tests.procedures import Parked

    procedure = ProcedureWithId.new(Parked({}))
    async with manager_for(tmp_path, request_poll_interval=0.05) as manager:
        watcher = await manager.submit(procedure)
        while len(await manager.store.procedure_keys(procedure.id)) < 2:
            await asyncio.sleep(0.01)
        request = {"kind": "cancel", "reason": "stored by hand", "requested_at": 1e300}
        await manager.store.store.put(f"requests/{procedure.id}.json", json.dumps(request).encode())
        with pytest.raises(ProcedureFailed, match="cancelled by an operator: stored by hand"):
            await asyncio.wait_for(watcher.wait(), 10)
        (record,) = await HistoryStore(manager.store.store).list()
    assert record.outcome == "cancelled" and record.ended_by is not None and record.ended_by.at is None
