"""One manager process of the multi-process tests: `python -m tests.multiprocess.worker`.

It runs a `ProcedureManager` with a lease on a bucket of an S3 server (moto), or with
`--backend gcs` of a GCS emulator (`procstore.testing.gcs_server`), reports on
stdout when it leads or stops leading, and, with `--submit N`, submits N `Work`
procedures (ids derived from `--seed`) as soon as it leads. It runs until killed.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import sys
import uuid
from typing import Any, ClassVar

# gcsfs would wait 60 s per call on a gRPC probe the emulator does not answer.
os.environ.setdefault("GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT", "false")

from procstore import (
    Context,
    DuplicateProcedure,
    Lease,
    LeaseExpired,
    LockKey,
    NotLeader,
    Procedure,
    ProcedureId,
    ProcedureManager,
    ProcedureWithId,
    Status,
    StoreError,
    StringKey,
)
from procstore.testing.pytest_plugin import gcs_storage_options
from tests.multiprocess.cluster import s3_client


class Work(Procedure):
    """`steps` persisted steps of `sleep` seconds each, holding the lock of its slot.

    With `children` > 0 (`--children`), it first runs that many child `Work`s (no children of
    their own, no lock) as subprocedures, with ids derived from its own (`child_ids`).

    With `--side-effects`, the last step first writes `effects/{i}/{random}` to the bucket
    (a call to another system, which procstore does not fence), after `ctx.check_lease()`
    with `--check-lease`.
    """

    type_name = "multiprocess::Work"
    side_effects: ClassVar[tuple[Any, str] | None] = None
    """(a boto3 client, the bucket) with `--side-effects`."""
    check_lease: ClassVar[bool] = False

    def __init__(self, data: dict[str, Any]) -> None:
        self.data = data

    async def execute(self, ctx: Context) -> Status:
        if self.data.get("children"):
            status = self._join_children(ctx)
            if status is not None:
                return status
        await asyncio.sleep(self.data["sleep"])
        self.data["at"] += 1
        if self.data["at"] >= self.data["steps"]:
            if self.side_effects is not None:
                if self.check_lease:
                    ctx.check_lease()
                client, bucket = self.side_effects
                key = f"effects/{self.data['i']}/{uuid.uuid4().hex}"
                await asyncio.to_thread(client.put_object, Bucket=bucket, Key=key, Body=str(ctx.fencing_token).encode())
            return Status.done(self.data["i"])
        return Status.executing(persist=True)

    def _join_children(self, ctx: Context) -> Status | None:
        """Suspend on the children not yet known (all of them at first, then those whose first
        write a crash cut off); None once every one has finished."""
        kids = child_ids(ctx.procedure_id, self.data["children"])
        unknown = [k for k in kids if ctx.provider.procedure_state(k) is None]
        if self.data.get("spawned") and not unknown:
            failed = [str(k) for k in kids if not (s := ctx.provider.procedure_state(k)) or not s.is_done()]
            if failed:
                raise RuntimeError(f"children failed: {failed}")
            return None
        self.data["spawned"] = True
        pending = set(unknown or kids)
        child = {**self.data, "children": 0, "spawned": False, "slots": 0}
        return Status.suspended(
            [
                ProcedureWithId(k, Work({**child, "i": f"{self.data['i']}.{n}"}))
                for n, k in enumerate(kids)
                if k in pending
            ]
        )

    def dump(self) -> str:
        return json.dumps(self.data, sort_keys=True)

    @classmethod
    def load(cls, data: str) -> Work:
        return cls(json.loads(data))

    def lock_key(self) -> LockKey:
        if not self.data["slots"]:
            return LockKey([])
        return LockKey([StringKey.exclusive(f"slot/{self.data['i'] % self.data['slots']}")])


def procedure_ids(seed: str, n: int) -> list[ProcedureId]:
    return [ProcedureId.parse(str(uuid.uuid5(uuid.NAMESPACE_URL, f"{seed}/{i}"))) for i in range(n)]


def child_ids(parent: ProcedureId, n: int) -> list[ProcedureId]:
    """The same ids on every run of the parent's step: a re-run finds the children it stored."""
    return [ProcedureId.parse(str(uuid.uuid5(uuid.NAMESPACE_URL, f"{parent}/child/{k}"))) for k in range(n)]


def say(event: str, **fields: Any) -> None:
    print(json.dumps({"event": event, **fields}), flush=True)


async def run(args: argparse.Namespace) -> None:
    options = {
        "key": "testing",
        "secret": "testing",
        "endpoint_url": args.endpoint,
        "config_kwargs": {
            "user_agent_extra": f"procstore-client/{args.name}",
            "read_timeout": args.read_timeout,
            "connect_timeout": args.read_timeout,
            "retries": {"max_attempts": args.botocore_attempts, "mode": "standard"},
        },
    }
    url = f"s3://{args.bucket}/cp/"
    if args.backend == "gcs":
        url, options = f"gs://{args.bucket}/cp/", gcs_storage_options(args.endpoint)
    manager = ProcedureManager(
        url,
        options,
        lease=Lease(ttl=args.ttl, holder=args.name),
        max_running_procedures=10_000,
        retry_delay=0.05,
        max_retry_delay=1.0,
        max_retry_times=8,
    )
    if args.side_effects:
        Work.side_effects, Work.check_lease = (s3_client(args.endpoint), args.bucket), args.check_lease
    manager.register(Work)
    await manager.start()
    say("started", leader=manager.is_leader)
    if args.submit:
        await manager.wait_until_leading()
        ids = procedure_ids(args.seed, args.submit)
        for i, pid in enumerate(ids):
            data = {"i": i, "at": 0, "steps": args.steps, "sleep": args.sleep, "slots": args.slots}
            data["children"] = args.children
            maybe_stored = False
            while True:
                try:
                    await manager.submit(ProcedureWithId(pid, Work(data)))
                    break
                except (NotLeader, LeaseExpired):  # nothing was stored: submit again once leading
                    await manager.wait_until_leading()
                except DuplicateProcedure:
                    if not maybe_stored:
                        raise
                    break  # an earlier attempt landed: it runs
                except StoreError as e:  # still failing after the retries: the outcome is unknown
                    say("submit-failed", error=str(e))
                    maybe_stored = True
                    await manager.wait_until_leading()
        say("submitted", n=len(ids))
    leading = None
    reported = -1
    while True:
        if manager.is_leader != leading:
            leading = manager.is_leader
            say("leading" if leading else "standing-by", leader=manager.leader)
        if manager.retry_budget.retries != reported:
            reported = manager.retry_budget.retries
            say("retries", retries=reported, waited=manager.retry_budget.waited)
        await asyncio.sleep(0.05)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--endpoint", required=True)
    parser.add_argument("--bucket", required=True)
    parser.add_argument("--backend", choices=("s3", "gcs"), default="s3")
    parser.add_argument("--name", required=True)
    parser.add_argument("--ttl", type=float, default=2.0)
    parser.add_argument("--submit", type=int, default=0)
    parser.add_argument("--seed", default="procs")
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--sleep", type=float, default=0.2)
    parser.add_argument("--slots", type=int, default=25)
    parser.add_argument("--children", type=int, default=0, help="each procedure first runs this many children")
    parser.add_argument("--read-timeout", type=float, default=2.0)
    parser.add_argument("--botocore-attempts", type=int, default=3, help="1: procstore retries every failure itself")
    parser.add_argument("--side-effects", action="store_true", help="the last step writes effects/{i}/... first")
    parser.add_argument("--check-lease", action="store_true", help="and calls ctx.check_lease() before")
    args = parser.parse_args()
    logging.basicConfig(
        level=logging.WARNING, stream=sys.stderr, format=f"%(asctime)s {args.name} %(name)s %(levelname)s %(message)s"
    )
    for name in ("procstore.lease", "procstore.recovery"):
        logging.getLogger(name).setLevel(logging.INFO)
    asyncio.run(run(args))


if __name__ == "__main__":
    main()
