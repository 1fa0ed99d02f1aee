"""A leader acting on a resume nudge, killed before and after each of its store writes."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

import pytest

from procstore import Client, ProcedureFailed, ProcedureWithId
from procstore.ids import ProcedureId
from procstore.store import open_state_store
from procstore.store.local import LocalDirStore
from procstore.store.procedure_store import ProcedureStore
from procstore.store.requests import OperatorRequest
from procstore.testing import Fault, FaultyStore
from tests.procedures import World
from tests.runtime.helpers import eventually
from tests.runtime.test_operations import Flaky, failed_and_kept, manager_on
from tests.runtime.test_runs import Flaky as RunsFlaky
from tests.runtime.test_runs_with_restarts import Joiner
from tests.support import StoreTarget, manager_for

WRITES = frozenset({"put", "put_if_absent", "put_if_version", "batch_delete", "delete"})


@pytest.mark.parametrize("write", ["request", "copy", "nudge"])
@pytest.mark.parametrize("when", ["before", "after"])
async def test_a_leader_killed_while_acting_on_a_resume_nudge_leaves_it_for_the_next_start(
    tmp_path: Path, write: str, when: Literal["before", "after"]
) -> None:
    """Its writes, in order: the operator request's deletion, the copy above the commit, the
    nudge's deletion. Whichever it died at, the next start runs the procedure to its end."""
    async with manager_on(str(tmp_path), keep_failed=True) as manager:
        pid, name = await failed_and_kept(manager)  # ended at 4.commit
    Flaky.broken.discard(name)
    await ProcedureStore(LocalDirStore(tmp_path)).resumes.put(pid, OperatorRequest.new("resume", "resume", step=4))
    key = {
        "request": f"requests/{pid}.json",
        "copy": f"procedure/{pid}/0000000005.step",
        "nudge": f"requests/resume/{pid}.json",
    }[write]
    crashing = FaultyStore(LocalDirStore(tmp_path), faults=[Fault("crash", kinds=WRITES, key=key, when=when)])
    dying = manager_on(crashing, keep_failed=True, request_poll_interval=0.05)
    await dying.start()
    await eventually(crashing.plan.crashed.is_set)
    await dying.stop()
    async with manager_on(str(tmp_path), keep_failed=True, request_poll_interval=0.05):
        await eventually(lambda: not (tmp_path / "procedure" / str(pid)).exists())
        await eventually(lambda: not list((tmp_path / "requests").rglob("*.json")))
    effects = Flaky.effects[name]
    assert effects[:2] == [0, 1] and effects[-2:] == [2, 3] and 0 not in effects[2:], effects


async def test_a_resume_nudge_whose_copy_stayed_in_doubt_goes_on_with_the_children_its_run_finished(
    local_target: StoreTarget,
) -> None:
    """The leader writes the copy for a `Client.resume` nudge, and every answer is lost past
    the retries: the copy is stored, the nudge stays, and its next look runs the copy. That
    copy is a resume's (its run's origin says so), not a `procstore rewind`'s: the run goes
    on with the child its earlier run finished, never running that child again."""
    world = World.new()
    joiner = ProcedureWithId.new(Joiner({"world": world.name, "child_id": str(ProcedureId.random())}))
    store = FaultyStore(open_state_store(local_target.url))
    options: dict[str, Any] = {"keep_failed": True, "max_retry_times": 1, "request_poll_interval": 0.05}
    async with manager_for(store, RunsFlaky, Joiner, **options) as manager:
        with pytest.raises(ProcedureFailed, match="failed once"):
            await (await manager.submit(joiner)).wait()
        copy = f"procedure/{joiner.id}/*.step"
        lost = Fault("transient", kinds=frozenset({"put_if_absent"}), key=copy, when="after", times=2)
        store.plan.faults[:] = [lost]
        client = Client(local_target.url)
        await client.resume(joiner.id)
        await eventually(lambda: (state := manager.procedure_state(joiner.id)) is not None and state.is_done())
        await client.close()
        assert lost.fired == 2  # the first look's copy, and its retry: both answers lost
    assert world.counts["c/1"] == 1 and world.counts["joins"] == 2
    await store.inner.close()
