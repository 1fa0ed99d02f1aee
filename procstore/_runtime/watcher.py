"""`Watcher`: waiting for one procedure to end."""

from __future__ import annotations

from procstore._runtime.meta import ProcedureMeta
from procstore.errors import EndNotRecorded, ManagerStopped, ProcedureFailed
from procstore.ids import ProcedureId
from procstore.state import ProcedureState


class Watcher:
    """Follows one procedure's state; returned by `ProcedureManager.submit()`."""

    def __init__(self, meta: ProcedureMeta) -> None:
        self._meta = meta

    @property
    def procedure_id(self) -> ProcedureId:
        return self._meta.id

    @property
    def state(self) -> ProcedureState:
        """The state now."""
        return self._meta.state

    async def wait_state_change(self) -> ProcedureState:
        """Wait for the next change of state and return the new state."""
        return await self._meta.wait_state_change()

    async def wait(self) -> object:
        """Wait for the procedure to end and return its output.

        Raises `ProcedureFailed` if it failed (after its rollback, if any) or was poisoned,
        once the store says so; `EndNotRecorded` if its run ended but the end could not be
        written (the store says it has not ended); and `ManagerStopped` if the manager
        stopped first. After the last two, the procedure resumes at the next start.
        """
        meta = self._meta
        while True:
            state = meta.state
            if state.is_done():
                return state.output
            if state.is_ended():
                raise (ProcedureFailed if state.recorded else EndNotRecorded)(meta.id, state)
            if meta.abandoned:
                raise ManagerStopped(meta.id)
            await meta.wait_state_change()

    def __repr__(self) -> str:
        return f"Watcher({self._meta.id}, {self._meta.state.kind.value})"
