"""The DBOS peer: N concurrent 5-step workflows on SQLite, in its own process.

Run as `python -m benchmarks.dbos_peer N DB_PATH`; prints one JSON line. DBOS keeps global
state, so each measurement gets a fresh interpreter. Needs the `bench` extra (dbos); the
library never imports it.
"""

from __future__ import annotations

import json
import sys
import time


def main() -> None:
    from dbos import DBOS, DBOSConfig

    n, db = int(sys.argv[1]), sys.argv[2]
    config: DBOSConfig = {"name": "procstore-bench", "system_database_url": f"sqlite:///{db}"}
    DBOS(config=config)

    @DBOS.step()  # type: ignore[untyped-decorator,unused-ignore] # untyped when dbos is not installed
    def step(i: int, state: str) -> str:
        return state

    @DBOS.workflow()  # type: ignore[untyped-decorator,unused-ignore]
    def five_steps(state: str) -> str:
        for i in range(5):
            state = step(i, state)
        return state

    DBOS.launch()
    state = json.dumps({"i": 0, "steps": 5, "gate": None, "pad": "x" * 40})  # the same ~100 bytes
    started = time.perf_counter()
    handles = [DBOS.start_workflow(five_steps, state) for _ in range(n)]
    for handle in handles:
        handle.get_result()
    elapsed = time.perf_counter() - started
    DBOS.destroy()
    print(json.dumps({"n": n, "seconds": elapsed, "per_second": n / elapsed}))


if __name__ == "__main__":
    main()
