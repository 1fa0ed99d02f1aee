"""The signals a cluster simulation sends, through each public path, and how each send ended.

A send goes through a manager (`ProcedureManager.signal`, any of the cluster's: the leader,
a standby, a paused one), a `Client` in a process that holds no lease, or the CLI's code
(`procstore signal`, see `cluster_operator`); its payload `{"sig": N}` names it, so that the
checks (`cluster_waits`) can follow it into the store and into the step that saw it.
"""

from __future__ import annotations

import asyncio
import random
import re
import uuid
from collections.abc import Sequence

import click

from procstore._client.client import Client
from procstore._runtime.manager import ProcedureManager
from procstore.errors import OperationRefused, ProcedureError, ProcedureNotFound
from procstore.ids import ProcedureId
from procstore.store.folder import latest_key
from procstore.store.keys import ParsedKey
from procstore.store.message import MessageDecodeError, ProcedureMessage
from procstore.store.signals import SIGNALS_PATH
from procstore.store.state_store import StateStore
from procstore.testing.cluster_operator import run_cli
from procstore.testing.cluster_waits import Outcome, SentSignal, Target

PATHS = ("manager", "client", "cli")


def refusal(error: BaseException) -> bool:
    """Whether `error` is a send's refusal, which writes nothing: the procedure has ended or
    is not stored. Anything else (a store's error, a stopped manager) may follow a write."""
    cause = error.__cause__ if isinstance(error, click.ClickException) else error
    return isinstance(cause, (OperationRefused, ProcedureNotFound)) or type(cause) is ProcedureError


async def waiting_for(store: StateStore, keys: list[ParsedKey]) -> str | None:
    """The signal the latest stored step of a procedure waits for (None: none, or unreadable)."""
    raw = await store.get(str(latest_key(keys)))
    if raw is None:
        return None
    try:
        return ProcedureMessage.decode(raw).signal
    except MessageDecodeError:
        return None


async def choose_target(
    rng: random.Random, store: StateStore, stored: dict[str, list[ParsedKey]], names: Sequence[str]
) -> tuple[Target, str, str]:
    """Whom to signal, and with what name: a procedure waiting for a signal (its name), an
    unfinished one (perhaps not waiting yet), one whose end is stored, or an unknown id."""
    unfinished = sorted(pid for pid, keys in stored.items() if latest_key(keys).key_type.value != "commit")
    ended = sorted(pid for pid, keys in stored.items() if latest_key(keys).key_type.value == "commit")
    drawn = rng.choices(["waiting", "unfinished", "ended", "unknown"], [40, 30, 18, 12])[0]
    target: Target = "waiting" if drawn == "waiting" else "unfinished" if drawn == "unfinished" else "ended"
    if target == "waiting":
        waiting = [(pid, name) for pid in unfinished if (name := await waiting_for(store, stored[pid])) is not None]
        if waiting:
            pid, name = rng.choice(waiting)
            return "waiting", pid, name
        target = "unfinished"
    if target == "unfinished" and unfinished:
        return "unfinished", rng.choice(unfinished), rng.choice(names)
    if drawn != "unknown" and ended:
        return "ended", rng.choice(ended), rng.choice(names)
    return "unknown", str(ProcedureId.parse(str(uuid.UUID(int=rng.getrandbits(128), version=4)))), rng.choice(names)


async def send(signal: SentSignal, *, manager: ProcedureManager | None, store: StateStore, payload: object) -> None:
    """Send `signal` through its path (`via`): `manager` for `manager`, else a process of its
    own reaching the store through `store`; record how it ended."""
    loop = asyncio.get_running_loop()
    outcome: Outcome
    try:
        if signal.via == "manager":
            assert manager is not None
            await manager.signal(ProcedureId.parse(signal.procedure_id), signal.name, payload)
            said = ""
        elif signal.via == "client":
            async with Client(store) as client:
                await client.signal(signal.procedure_id, signal.name, payload)
            said = ""
        else:
            await run_cli(store, "signal", procedure_id=signal.procedure_id, name=signal.name, payload=payload)
            said = ""
        outcome = "accepted"
    except BaseException as e:
        if isinstance(e, asyncio.CancelledError):
            raise
        outcome = "refused" if refusal(e) else "unknown"
        said = f"{type(e).__name__}: {e}"
    # A key carries the real wall clock at the run's start, which no seed decides: left out.
    said = re.sub(rf"{SIGNALS_PATH}\S+", "its key", said)
    signal.returned(outcome, said[:120], loop.time())
