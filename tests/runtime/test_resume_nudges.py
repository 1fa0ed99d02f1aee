"""A leader acting on a resume nudge, killed before and after each of its store writes."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

import pytest

from procstore.store.local import LocalDirStore
from procstore.store.procedure_store import ProcedureStore
from procstore.store.requests import OperatorRequest
from procstore.testing import Fault, FaultyStore
from tests.runtime.helpers import eventually
from tests.runtime.test_operations import Flaky, failed_and_kept, manager_on

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
