"""`kill_manager`: a live manager's end as `kill -9` would make it, for integration tests."""

from __future__ import annotations

from procstore._runtime.manager import ProcedureManager, halt


async def kill_manager(manager: ProcedureManager) -> None:
    """End `manager` as if its process were killed: its lease task and every runner stop at
    their next await, nothing more is written, and the lease is *not* released, so that a
    standby takes over only once the lease expires. Watchers raise `ManagerStopped`.

    Afterwards, `await manager.stop()` closes its store; with a lease, that releases the
    lease only if the stored record is still this manager's term (no standby took over yet).
    """
    await halt(manager)
