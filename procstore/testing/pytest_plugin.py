"""procstore's pytest plugin (installed with the package, entry point `procstore`).

Fixtures:
- `procstore_moto_endpoint` (session): a moto S3 server on 127.0.0.1, reached over HTTP.
- `procstore_gcs_endpoint` (session): gcp-storage-emulator on 127.0.0.1 in its own process,
  answering GCS's preconditions (`procstore.testing.gcs_server`); reach it with
  `gcs_storage_options(endpoint)`.
- `procstore_store`: a `StoreUnderTest` parametrized over memory (procstore's `memory://`), a local directory and
  S3 on that moto server (a fresh bucket per test). Its `run_url(n)` gives run n of a crash
  explorer its own empty store.
- `procstore_explorer`: `procstore_explorer(scenario)` makes a `CrashExplorer` on that store.

Hypothesis is optional: the plugin never imports it, and never changes a hypothesis profile
unless asked. `--procstore-hypothesis-profile=procstore-ci` (bounded: 25 examples, 20 steps)
or `=procstore-long` (500 examples, 60 steps) registers procstore's profiles and loads one;
`register_hypothesis_profiles()` registers them for a conftest that loads its own.
"""

from __future__ import annotations

import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from procstore.testing.endpoints import gcs_storage_options as gcs_storage_options  # re-exported
from procstore.testing.endpoints import s3_storage_options as s3_storage_options  # re-exported
from procstore.testing.explorer import CrashExplorer, Scenario


def register_hypothesis_profiles() -> None:
    """Register `procstore-ci` and `procstore-long` with hypothesis (imported only here)."""
    from hypothesis import HealthCheck, settings

    settings.register_profile(
        "procstore-ci",
        max_examples=25,
        stateful_step_count=20,
        deadline=None,
        suppress_health_check=[HealthCheck.too_slow],
    )
    settings.register_profile("procstore-long", max_examples=500, stateful_step_count=60, deadline=None)


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--procstore-hypothesis-profile",
        default=None,
        help="load procstore's hypothesis profile: procstore-ci (bounded) or procstore-long",
    )


def pytest_configure(config: pytest.Config) -> None:
    profile = config.getoption("--procstore-hypothesis-profile", default=None)
    if profile:
        from hypothesis import settings

        register_hypothesis_profiles()
        settings.load_profile(profile)


@dataclass(frozen=True)
class StoreUnderTest:
    """A store URL with the storage options that reach it."""

    kind: str
    url: str
    storage_options: dict[str, Any] = field(default_factory=dict)
    base: str = ""

    def run_url(self, n: int) -> str:
        """An empty store for run `n` of an explorer: a new name, folder or prefix on every
        call, so that a second explorer in the same test never starts on the first's keys."""
        if self.kind == "memory":
            return f"memory://procstore-{uuid.uuid4().hex}/"
        return f"{self.base}run-{n}-{uuid.uuid4().hex[:8]}/"


def free_port() -> int:
    """A TCP port free on 127.0.0.1 now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


@pytest.fixture(scope="session")
def procstore_moto_endpoint() -> Iterator[str]:
    """A moto S3 server on 127.0.0.1 for the whole session (needs `moto[server]`)."""
    from procstore.testing.s3_server import ThreadedServer

    server = ThreadedServer(free_port())
    server.start()
    try:
        yield server.url
    finally:
        server.stop()


@contextmanager
def serving(command: Sequence[str], port: int, *, startup: float = 20.0) -> Iterator[str]:
    """Run a server process that listens on 127.0.0.1:`port`; yields its URL, stops it after."""
    proc = subprocess.Popen(list(command), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + startup
        while True:
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                    break
            except OSError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"{command[0]} {' '.join(command[1:])} did not start listening") from None
                time.sleep(0.05)
        yield f"http://127.0.0.1:{port}"
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()


@pytest.fixture(scope="session")
def procstore_gcs_endpoint() -> Iterator[str]:
    """gcp-storage-emulator answering GCS's preconditions, in its own process (needs `procstore[gcs]`
    and `gcp-storage-emulator`). Set `GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT=false` before gcsfs is imported."""
    port = free_port()
    with serving([sys.executable, "-m", "procstore.testing.gcs_server", "--port", str(port)], port) as url:
        yield url


def create_bucket(endpoint: str) -> str:
    import boto3

    name = f"procstore-{uuid.uuid4().hex[:12]}"
    client = boto3.client(
        "s3",
        endpoint_url=endpoint,
        aws_access_key_id="testing",
        aws_secret_access_key="testing",
        region_name="us-east-1",
    )
    client.create_bucket(Bucket=name)
    return name


@pytest.fixture(params=["memory", "local", "s3"])
def procstore_store(request: pytest.FixtureRequest, tmp_path: Path) -> StoreUnderTest:
    """The same test in memory (`memory://`), on a local directory and on S3 (a moto server on 127.0.0.1)."""
    kind = request.param
    if kind == "memory":
        url = f"memory://procstore-{uuid.uuid4().hex}/"
        return StoreUnderTest(kind, url, base=url)
    if kind == "local":
        return StoreUnderTest(kind, str(tmp_path / "store"), base=f"{tmp_path}/")
    endpoint = request.getfixturevalue("procstore_moto_endpoint")
    bucket = create_bucket(endpoint)
    return StoreUnderTest(kind, f"s3://{bucket}/cp/", s3_storage_options(endpoint), base=f"s3://{bucket}/")


@pytest.fixture
def procstore_explorer(procstore_store: StoreUnderTest) -> Callable[..., CrashExplorer]:
    """`procstore_explorer(scenario, **options)`: a `CrashExplorer` on the parametrized store."""

    def make(scenario: Scenario, **options: Any) -> CrashExplorer:
        return CrashExplorer(scenario, procstore_store.run_url, procstore_store.storage_options, **options)

    return make
