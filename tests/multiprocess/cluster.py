"""Processes for the multi-process tests: recording S3 and GCS servers, manager workers, and
views of the bucket they share."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import boto3
from botocore.config import Config

from procstore.testing.pytest_plugin import free_port, gcs_storage_options, serving

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
    with serving(
        [sys.executable, "-m", "moto.server", "--host", "127.0.0.1", "--port", str(port)], port, startup=30
    ) as url:
        yield url


@contextmanager
def recording_gcs_server(record: Path) -> Iterator[str]:
    """`procstore.testing.gcs_server` (GCS's preconditions) in its own process; yields its endpoint."""
    port = free_port()
    command = [sys.executable, "-m", "procstore.testing.gcs_server", "--port", str(port), "--record", str(record)]
    with serving(command, port) as endpoint:
        yield endpoint


class Bucket(Protocol):
    """The bucket the workers share, as the test sees it from outside."""

    @property
    def backend(self) -> str:
        """The worker's `--backend`."""

    @property
    def name(self) -> str: ...

    def lease_holder(self) -> str | None:
        """The holder named in the stored lease, unless released or absent."""

    def procedure_keys_left(self) -> list[str]: ...


def _holder(body: bytes | None) -> str | None:
    """The holder a lease's bytes name; None if released, absent, or unreadable (a write cut
    off by a killed manager, which the managers take for a lease nobody holds)."""
    try:
        record = json.loads(body or b"")
    except ValueError:
        return None
    return None if record.get("released") else str(record["holder"]) or None


@dataclass(frozen=True)
class S3Bucket:
    client: Any
    name: str
    backend: str = "s3"

    @classmethod
    def create(cls, endpoint: str, *, versioned: bool = False) -> S3Bucket:
        client = s3_client(endpoint)
        name = f"procstore-{uuid.uuid4().hex[:12]}"
        client.create_bucket(Bucket=name)
        if versioned:
            client.put_bucket_versioning(Bucket=name, VersioningConfiguration={"Status": "Enabled"})
        return cls(client, name)

    def lease_holder(self) -> str | None:
        try:
            body = self.client.get_object(Bucket=self.name, Key="cp/lease/procedures.json")["Body"].read()
        except self.client.exceptions.NoSuchKey:
            return None
        return _holder(body)

    def procedure_keys_left(self) -> list[str]:
        found = self.client.list_objects_v2(Bucket=self.name, Prefix="cp/procedure/")
        return [o["Key"] for o in found.get("Contents", [])]


@dataclass(frozen=True)
class GcsBucket:
    fs: Any
    """A blocking `gcsfs.GCSFileSystem` on the emulator."""
    name: str
    backend: str = "gcs"

    @classmethod
    def create(cls, endpoint: str) -> GcsBucket:
        os.environ.setdefault("GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT", "false")
        import gcsfs

        fs = gcsfs.GCSFileSystem(skip_instance_cache=True, use_listings_cache=False, **gcs_storage_options(endpoint))
        name = f"procstore-{uuid.uuid4().hex[:12]}"
        fs.mkdir(name)
        return cls(fs, name)

    def lease_holder(self) -> str | None:
        try:
            return _holder(self.fs.cat_file(f"{self.name}/cp/lease/procedures.json"))
        except FileNotFoundError:
            return None

    def procedure_keys_left(self) -> list[str]:
        self.fs.invalidate_cache()
        try:
            return list(self.fs.find(f"{self.name}/cp/procedure/"))
        except FileNotFoundError:
            return []


def s3_client(endpoint: str) -> Any:
    return boto3.client(
        "s3",
        endpoint_url=endpoint,
        aws_access_key_id="testing",
        aws_secret_access_key="testing",
        region_name="us-east-1",
        # moto keeps an empty body, with the checksum the headers announced, for a PUT whose
        # sender was killed after them: read it as it is, as the managers do.
        config=Config(response_checksum_validation="when_required"),
    )


@dataclass
class Worker:
    """One manager process (`tests.multiprocess.worker`) and the events it printed."""

    name: str
    proc: subprocess.Popen[str]
    events: list[dict[str, Any]] = field(default_factory=list)

    log: Path | None = None

    @classmethod
    def start(cls, endpoint: str, bucket: Bucket, name: str, *extra: str, logs: Path | None = None) -> Worker:
        log = None if logs is None else logs / f"{name}.log"
        proc = subprocess.Popen(
            [
                *(sys.executable, "-m", "tests.multiprocess.worker", "--endpoint", endpoint),
                *("--bucket", bucket.name, "--backend", bucket.backend, "--name", name, *extra),
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
    """One line of a server's record (`procstore.testing.s3_server` or `gcs_server`)."""

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
    if_generation_match: str | None = None

    @property
    def wrote(self) -> bool:
        """A write the server carried out: an S3 PUT or a GCS upload (a POST), answered 200."""
        return self.method in ("PUT", "POST") and self.status == 200

    @property
    def create_only(self) -> bool:
        """Sent as a create-only write: `If-None-Match: *` on S3, `ifGenerationMatch=0` on GCS."""
        return self.if_none_match == "*" or self.if_generation_match == "0"

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
                obj.get("client"),
                obj.get("if_none_match"),
                obj.get("fault"),
                obj["size"],
                obj.get("if_generation_match"),
            )
        )
    return writes


def created(writes: list[Write]) -> Counter[str]:
    """How many times each procedure key was created (a PUT answered 200), empty or not.

    moto stores an empty object for a PUT whose sender was killed after the headers; recovery
    keeps it and resumes one step above, so even such a torn create is never repeated."""
    return Counter(w.key for w in writes if w.wrote and w.procedure_key)


def committed(writes: list[Write]) -> Counter[str]:
    """How many `.commit` keys were created for each procedure id."""
    out: Counter[str] = Counter()
    for w in writes:
        parsed = w.procedure_key
        if parsed is not None and parsed[2] == "commit" and w.wrote:
            out[parsed[0]] += 1
    return out


def stored_versions(client: Any, bucket: str) -> tuple[Counter[str], Counter[str]]:
    """From a versioned bucket: how many versions each procedure key has had (empty ones, a
    torn create's, included), and how many `.commit` versions each procedure id has had."""
    values: Counter[str] = Counter()
    commits: Counter[str] = Counter()
    for page in client.get_paginator("list_object_versions").paginate(Bucket=bucket, Prefix="cp/procedure/"):
        for version in page.get("Versions", []):
            match = _PROCEDURE_KEY.search("/" + version["Key"])
            if match is None:
                continue
            if match[3] == "commit":
                commits[match[1]] += 1
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
