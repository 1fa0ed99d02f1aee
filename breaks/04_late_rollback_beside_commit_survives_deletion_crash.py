"""A committed run whose folder holds a former leader's late `.rollback` beside its `.commit`
(the df8157d layout: `0.step, 1.commit, 1.rollback`) reads COMMITTED. Its deletion removes
the `.step` first, then the terminal keys: a crash between leaves `1.rollback, 1.commit`,
where the commit ends the message beside it (none is below), so the run now reads FAILED.
With keep_failed=True the next start keeps it as a failed root for an operator, forever
(it has no step to resume or rewind from), and `procstore ls`/the Client call it failed
though it committed (stores.md: "a crash part way leaves the procedure marked finished";
guarantees.md, Finishing: deleted "each in the documented order")."""

import asyncio
import contextlib
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from procstore import ProcedureId
from procstore.store import open_state_store
from procstore.testing import Fault, FaultyStore, kill_manager
from tests.support import manager_for

URL = "memory://break04/"


async def main() -> None:
    pid = ProcedureId.random()
    store = open_state_store(URL)
    message = b'{"type_name":"test::Child","data":"{}","parent_id":null,"step":0}'
    await store.put(f"procedure/{pid}/0000000000.step", message)
    await store.put(f"procedure/{pid}/0000000001.commit", b"")
    late = b'{"type_name":"test::Child","data":"{}","parent_id":null,"step":1,"error":"late"}'
    await store.put(f"procedure/{pid}/0000000001.rollback", late)
    # The process dies right after the deletion's first stage.
    crash = Fault("crash", kinds=frozenset({"batch_delete"}), key=f"procedure/{pid}/*", nth=0, when="after")
    faulty = FaultyStore(open_state_store(URL), faults=[crash])
    manager = manager_for(faulty, keep_failed=True)
    with contextlib.suppress(BaseException):
        await manager.start()  # recovery records the committed run, then deletes it: crash
    await kill_manager(manager)
    with contextlib.suppress(BaseException):
        await manager.stop()
    print("left by the crash:", await store.walk("procedure/"))
    async with manager_for(URL, keep_failed=True) as again:
        await asyncio.sleep(0.2)
        left = await again.store.store.walk("procedure/")
    assert left == [], f"a committed run is kept as a failed root: {left}"


asyncio.run(asyncio.wait_for(main(), 30))
print("held")
