"""What a standby's recovery could not load, once it takes over: `recovery_problems`."""

from __future__ import annotations

from pathlib import Path

from procstore import Lease, ProcedureId
from procstore.store.message import ProcedureMessage
from tests.runtime.helpers import eventually
from tests.support import manager_for

TTL = 1.0


async def test_a_takeover_reports_what_its_recovery_could_not_load(tmp_path: Path) -> None:
    """`recovery_problems` is the running term's: a standby that takes over shows its own
    recovery's problems as soon as it leads, not only once `wait_until_leading()` is called."""
    unloadable = ProcedureId.random()
    folder = tmp_path / "procedure" / str(unloadable)
    folder.mkdir(parents=True)
    (folder / "0000000000.step").write_bytes(ProcedureMessage("test::NoLoader", "{}", None, 0).encode())
    leader = manager_for(tmp_path, lease=Lease(ttl=TTL, holder="cp-1"))
    standby = manager_for(tmp_path, lease=Lease(ttl=TTL, holder="cp-2"))
    await leader.start()
    assert [p.procedure_id for p in leader.recovery_problems] == [unloadable]
    await standby.start()
    assert standby.recovery_problems == []  # a standby recovers nothing
    await leader.stop()  # released: the standby takes over at its next look
    try:
        await eventually(lambda: standby.is_leader, timeout=10)
        assert [p.procedure_id for p in standby.recovery_problems] == [unloadable]
    finally:
        await standby.stop()
