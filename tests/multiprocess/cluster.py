"""Processes for the multi-process tests: a recording moto server and manager workers."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import boto3

from procstore.testing.pytest_plugin import free_port

ROOT = Path(__file__).resolve().parents[2]
_PROCEDURE_KEY = re.compile(r"/cp/procedure/([0-9a-f-]{36})/(\d+)\.(step|commit|rollback)$")


@contextmanager
def recording_s3_server(record: Path, fault_rate: float = 0.0, seed: int = 0) -> Iterator[str]:
    """`procstore.testing.s3_server` in its own process; yields its endpoint."""
    port = free_port()
    proc = subprocess.Popen(
        [
            *(sys.executable, "-m", "procstore.testing.s3_server", "--port", str(port), "--record", str(record)),
            *("--fault-rate", str(fault_rate), "--seed", str(seed), "--hold-seconds", "2.5"),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        if not line.startswith("ready"):
            raise RuntimeError(f"the S3 server did not start: {line!r}")
        yield f"http://127.0.0.1:{port}"
    finally:
        proc.terminate()
        proc.wait(timeout=10)


@contextmanager
def moto_s3_server() -> Iterator[str]:
    """moto's own server (`python -m moto.server`) in its own process; yields its endpoint."""
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "moto.server", "--host", "127.0.0.1", "--port", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    endpoint = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                s3_client(endpoint).list_buckets()
                break
            except Exception:
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"moto's server did not start on {endpoint}") from None
                time.sleep(0.1)
        yield endpoint
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def s3_client(endpoint: str) -> Any:
    return boto3.client(
        "s3",
        endpoint_url=endpoint,
        aws_access_key_id="testing",
        aws_secret_access_key="testing",
        region_name="us-east-1",
    )


@dataclass
class Worker:
    """One manager process (`tests.multiprocess.worker`) and the events it printed."""

    name: str
    proc: subprocess.Popen[str]
    events: list[dict[str, Any]] = field(default_factory=list)

    log: Path | None = None

    @classmethod
    def start(cls, endpoint: str, bucket: str, name: str, *extra: str, logs: Path | None = None) -> Worker:
        log = None if logs is None else logs / f"{name}.log"
        proc = subprocess.Popen(
            [
                *(sys.executable, "-m", "tests.multiprocess.worker", "--endpoint", endpoint, "--bucket", bucket),
                *("--name", name, *extra),
            ],
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=open(log or os.devnull, "w"),  # noqa: SIM115 - the child holds it
            text=True,
        )
        worker = cls(name, proc, log=log)
        threading.Thread(target=worker._read, daemon=True).start()
        return worker

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            if line.startswith("{"):
                self.events.append(json.loads(line))

    def saw(self, event: str) -> bool:
        return any(e["event"] == event for e in self.events)

    def wait_for(self, event: str, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        while not self.saw(event):
            if self.proc.poll() is not None:
                raise RuntimeError(
                    f"worker {self.name} exited with {self.proc.returncode} before {event!r}:\n{self.log_tail()}"
                )
            if time.monotonic() > deadline:
                raise TimeoutError(f"worker {self.name} did not report {event!r} in {timeout}s: {self.events}")
            time.sleep(0.05)

    def log_tail(self, lines: int = 15) -> str:
        """The last lines the worker wrote to its log (stderr), for failure messages."""
        if self.log is None or not self.log.exists():
            return "(no log kept)"
        return "\n".join(self.log.read_text().splitlines()[-lines:])

    def signal(self, sig: signal.Signals) -> None:
        self.proc.send_signal(sig)

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(timeout=10)


@dataclass(frozen=True)
class Write:
    """One line of the server's record."""

    t: float
    wall: float
    method: str
    key: str
    status: int
    client: str | None
    if_none_match: str | None
    fault: str | None
    size: int
    """Bytes of the request body the server received (0: a create cut off by a killed client)."""

    @property
    def procedure_key(self) -> tuple[str, int, str] | None:
        match = _PROCEDURE_KEY.search("/" + self.key)
        return None if match is None else (match[1], int(match[2]), match[3])


def read_record(path: Path) -> list[Write]:
    writes = []
    for line in path.read_text().splitlines():
        obj = json.loads(line)
        writes.append(
            Write(
                obj["t"],
                obj["wall"],
                obj["method"],
                obj["key"],
                obj["status"],
                obj["client"],
                obj["if_none_match"],
                obj["fault"],
                obj["size"],
            )
        )
    return writes


def created(writes: list[Write]) -> Counter[str]:
    """How many times each procedure key was created with a value (a PUT answered 200).

    moto stores an empty object for a PUT whose sender was killed after the headers; recovery
    deletes it and the key is written again, so such a torn create is not counted."""
    return Counter(w.key for w in writes if w.method == "PUT" and w.status == 200 and w.size and w.procedure_key)


def committed(writes: list[Write]) -> Counter[str]:
    """How many `.commit` keys were created for each procedure id."""
    out: Counter[str] = Counter()
    for w in writes:
        parsed = w.procedure_key
        if parsed is not None and parsed[2] == "commit" and w.method == "PUT" and w.status == 200:
            out[parsed[0]] += 1
    return out


def lease_holder(client: Any, bucket: str) -> str | None:
    try:
        body = client.get_object(Bucket=bucket, Key="cp/lease/procedures.json")["Body"].read()
    except client.exceptions.NoSuchKey:
        return None
    record = json.loads(body)
    return None if record.get("released") else str(record["holder"])


def procedure_keys_left(client: Any, bucket: str) -> list[str]:
    found = client.list_objects_v2(Bucket=bucket, Prefix="cp/procedure/")
    return [o["Key"] for o in found.get("Contents", [])]


def stored_versions(client: Any, bucket: str) -> tuple[Counter[str], Counter[str]]:
    """From a versioned bucket: how many versions each procedure key has had with a value
    (a torn, empty create does not count; commits are empty by format and count always),
    and how many `.commit` versions each procedure id has had."""
    values: Counter[str] = Counter()
    commits: Counter[str] = Counter()
    for page in client.get_paginator("list_object_versions").paginate(Bucket=bucket, Prefix="cp/procedure/"):
        for version in page.get("Versions", []):
            match = _PROCEDURE_KEY.search("/" + version["Key"])
            if match is None:
                continue
            if match[3] == "commit":
                commits[match[1]] += 1
            if match[3] == "commit" or version["Size"] > 0:
                values[version["Key"]] += 1
    return values, commits


def side_effects(client: Any, bucket: str) -> Counter[str]:
    """How many times each procedure (by its number) wrote its last step's side effect
    (`worker.py --side-effects`)."""
    out: Counter[str] = Counter()
    for page in client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix="effects/"):
        for obj in page.get("Contents", []):
            out[obj["Key"].split("/")[1]] += 1
    return out
