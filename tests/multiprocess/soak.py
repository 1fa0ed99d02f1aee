"""The multi-process scenarios at larger sizes than CI's, run by hand:

    python -m tests.multiprocess.soak children --seeds 101,102,103
    python -m tests.multiprocess.soak leader --seeds 201,202
    python -m tests.multiprocess.soak gcs --seeds 301

`leader`: 200 procedures on S3 (moto), the leader killed or paused, long pauses included.
`children`: 60 procedures with 3 subprocedures each on S3, any manager killed or paused.
`gcs`: 50 procedures with 2 subprocedures each on the GCS emulator, any manager.
Each run ends with the same checks as the tests (every procedure committed once, no key
created twice, every key created create-only) and prints one line: the seed, OK or FAILED
and why, the procedures, the disruptions, the torn creates in the record, the time, and
the folder that keeps the record and the workers' logs. Each run takes one to two minutes.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from collections.abc import Callable
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

from tests.multiprocess.cluster import (
    Bucket,
    GcsBucket,
    S3Bucket,
    committed,
    read_record,
    recording_gcs_server,
    recording_s3_server,
)
from tests.multiprocess.test_many_managers import TTL, check_record, disrupt_leaders

Server = Callable[[Path], AbstractContextManager[str]]

SCENARIOS: dict[str, tuple[Server, Callable[[str], Bucket], dict[str, Any]]] = {
    "leader": (
        recording_s3_server,
        S3Bucket.create,
        {"n": 200, "pause_share": 0.5, "disruptions": 10, "long_pause": TTL * 6},
    ),
    "children": (
        recording_s3_server,
        S3Bucket.create,
        {"n": 60, "pause_share": 0.4, "children": 3, "slots": 6, "victims": "any", "disruptions": 10},
    ),
    "gcs": (
        recording_gcs_server,
        GcsBucket.create,
        {"n": 50, "pause_share": 0.4, "children": 2, "slots": 6, "victims": "any", "disruptions": 8},
    ),
}


def run(scenario: str, seed: int) -> str:
    """One run; its line."""
    server, make_bucket, options = SCENARIOS[scenario]
    folder = Path(tempfile.mkdtemp(prefix=f"procstore-soak-{scenario}-{seed}-"))
    record = folder / "writes.jsonl"
    started = time.monotonic()
    try:
        with server(record) as endpoint:
            ids, actions = disrupt_leaders(
                endpoint,
                make_bucket(endpoint),
                folder,
                lambda: len(committed(read_record(record))),
                seed=seed,
                timeout=150,
                **options,
            )
        check_record(record, ids)
    except Exception as e:  # one line per run; the folder keeps the evidence
        return f"{scenario} seed {seed} FAILED {type(e).__name__}: {e} ({folder})"
    keys = [w.procedure_key for w in read_record(record) if w.wrote and w.size == 0]
    torn = sum(1 for key in keys if key is not None and key[2] != "commit")  # a commit is empty by format
    took = time.monotonic() - started
    done = f"{len(ids)} procedures, {dict(actions)}, torn creates {torn}, {took:.0f} s"
    return f"{scenario} seed {seed} OK: {done} ({folder})"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("scenario", choices=sorted(SCENARIOS))
    parser.add_argument("--seeds", default="1", help="comma-separated")
    args = parser.parse_args()
    for seed in (int(s) for s in args.seeds.split(",")):
        print(run(args.scenario, seed), flush=True)


if __name__ == "__main__":
    main()
