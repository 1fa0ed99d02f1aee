"""The DBOS peer: the same 5-step workflow on SQLite, in its own process.

`python -m benchmarks.dbos_peer MODE N DB_PATH`, MODE one of:
- `run`: start N workflows at once, wait for all; prints one JSON line (`per_second`);
- `setup`: start N workflows that stop inside their third step, print `READY` when all are
  there, and wait to be killed (SIGKILL) by the recovery benchmark;
- `recover`: launch DBOS on that database (it resumes pending workflows) and wait until none
  is pending; prints one JSON line (`seconds`, `succeeded`).

DBOS keeps global state, so each measurement gets a fresh interpreter. Needs the `bench`
extra (dbos); the library never imports it.
"""

from __future__ import annotations

import json
import sys
import threading
import time
from typing import Any

STATE = json.dumps({"i": 0, "steps": 5, "gate": None, "block_at": 0, "pad": "x" * 50}, separators=(",", ":"))
"""The same ~100 bytes a `Loop` stores."""


def main() -> None:
    from dbos import DBOS, DBOSConfig

    mode, n, db = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    config: DBOSConfig = {"name": "procstore-bench", "system_database_url": f"sqlite:///{db}"}
    DBOS(config=config)
    stuck = threading.Event()  # never set: `setup`'s workflows wait here until the kill
    arrived = _Countdown(n)

    @DBOS.step()  # type: ignore[untyped-decorator,unused-ignore] # untyped when dbos is not installed
    def step(i: int, state: str) -> str:
        if mode == "setup" and i == 2:
            arrived.arrive()
            stuck.wait()
        return state

    @DBOS.workflow()  # type: ignore[untyped-decorator,unused-ignore]
    def five_steps(state: str) -> str:
        for i in range(5):
            state = step(i, state)
        return state

    started = time.perf_counter()  # `recover` counts the launch: that is when DBOS recovers
    DBOS.launch()
    if mode == "run":
        started = time.perf_counter()  # timed from launched, as procstore's from started
        handles = [DBOS.start_workflow(five_steps, STATE) for _ in range(n)]
        for handle in handles:
            handle.get_result()
        elapsed = time.perf_counter() - started
        _print({"n": n, "seconds": elapsed, "per_second": n / elapsed})
    elif mode == "setup":
        for _ in range(n):
            DBOS.start_workflow(five_steps, STATE)
        arrived.wait()
        print("READY", flush=True)
        time.sleep(3600)  # killed long before this
    else:
        while DBOS.list_workflows(status=["PENDING", "ENQUEUED"]):
            time.sleep(0.02)
        elapsed = time.perf_counter() - started
        _print({"n": n, "seconds": elapsed, "succeeded": len(DBOS.list_workflows(status="SUCCESS"))})
    DBOS.destroy()


class _Countdown:
    def __init__(self, n: int) -> None:
        self._left = n
        self._lock = threading.Lock()
        self._done = threading.Event()

    def arrive(self) -> None:
        with self._lock:
            self._left -= 1
            if self._left == 0:
                self._done.set()

    def wait(self) -> None:
        self._done.wait()


def _print(result: dict[str, Any]) -> None:
    print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
