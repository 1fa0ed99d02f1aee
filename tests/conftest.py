"""Shared fixtures: real stores (memory://, a local directory, S3 on a moto server, GCS emulator)."""

from __future__ import annotations

import os

# gcsfs probes for hierarchical-namespace support over gRPC, which the emulator does not
# answer: every call would wait 60 s. Must be set before gcsfs is imported.
os.environ.setdefault("GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT", "false")

import shutil
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import settings

from procstore.testing.pytest_plugin import (
    create_bucket,
    free_port,
    gcs_storage_options,
    register_hypothesis_profiles,
    s3_storage_options,
    serving,
)
from tests.support import StoreTarget, store_targets

# Our own suite's choice (a user's project keeps its own): bounded examples under CI.
register_hypothesis_profiles()
if os.environ.get("CI"):
    settings.load_profile("procstore-ci")


@pytest.fixture(scope="session")
def moto_endpoint(procstore_moto_endpoint: str) -> str:
    """The plugin's moto S3 server on 127.0.0.1."""
    return procstore_moto_endpoint


def s3_options(endpoint: str) -> dict[str, Any]:
    return s3_storage_options(endpoint)


@pytest.fixture
def s3_bucket(moto_endpoint: str) -> str:
    """A fresh bucket on the moto server."""
    return create_bucket(moto_endpoint)


@pytest.fixture
def s3_target(moto_endpoint: str, s3_bucket: str) -> StoreTarget:
    return StoreTarget("s3", f"s3://{s3_bucket}/cp/", s3_options(moto_endpoint))


@pytest.fixture
def local_target(tmp_path: Path) -> StoreTarget:
    return StoreTarget("local", str(tmp_path / "store"))


@pytest.fixture
def memory_target() -> StoreTarget:
    return StoreTarget("memory", f"memory://procstore-test-{uuid.uuid4().hex}/")


class WrappedFS:
    """Registers `wrapped://`: fsspec's DirFileSystem over another filesystem, as fault
    injectors outside the project build theirs (object-storage-facts.md)."""

    registered = False

    @classmethod
    def register(cls) -> None:
        if cls.registered:
            return
        import fsspec
        from fsspec.implementations.dirfs import DirFileSystem

        class Wrapped(DirFileSystem):  # type: ignore[misc]
            protocol = "wrapped"

        fsspec.register_implementation("wrapped", Wrapped, clobber=True)
        cls.registered = True


@pytest.fixture
def wrapped_target(tmp_path: Path) -> StoreTarget:
    """A `wrapped://` URL over a local directory, reached only through fsspec."""
    import fsspec

    WrappedFS.register()
    return StoreTarget(
        "wrapped", "wrapped://store/", {"fs": fsspec.filesystem("file"), "path": str(tmp_path), "fo": str(tmp_path)}
    )


store_target = store_targets(
    "memory", "local", "s3", doc="The same test on memory://, a local directory and S3 (moto)."
)

# A test that reaches a server by any fixture carries that server's marker, so that
# `-m "not s3 and not gcs"` never starts one.
SERVER_FIXTURES = {
    "s3": {"s3_target", "s3_bucket", "moto_endpoint", "procstore_moto_endpoint"},
    "gcs": {"gcs_target", "gcs_endpoint", "plain_gcs_endpoint", "procstore_gcs_endpoint"},
}


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        names = set(getattr(item, "fixturenames", ()))
        for marker, fixtures in SERVER_FIXTURES.items():
            if names & fixtures:
                item.add_marker(getattr(pytest.mark, marker))


@pytest.fixture(scope="session")
def gcs_endpoint(procstore_gcs_endpoint: str) -> str:
    """The plugin's GCS emulator, which answers preconditions as GCS does (gcsfs over HTTP)."""
    return procstore_gcs_endpoint


@pytest.fixture(scope="session")
def plain_gcs_endpoint() -> Iterator[str]:
    """gcp-storage-emulator as it ships: it ignores every precondition."""
    exe = shutil.which("gcp-storage-emulator") or str(Path(sys.executable).parent / "gcp-storage-emulator")
    port = free_port()
    with serving([exe, "start", "--host", "127.0.0.1", "--port", str(port), "--in-memory"], port) as url:
        yield url


def gcs_bucket_target(endpoint: str) -> StoreTarget:
    """A fresh bucket on the emulator at `endpoint`."""
    import gcsfs

    bucket = f"procstore-{uuid.uuid4().hex[:12]}"
    options = gcs_storage_options(endpoint)
    gcsfs.GCSFileSystem(skip_instance_cache=True, **options).mkdir(bucket)
    return StoreTarget("gcs", f"gs://{bucket}/cp/", options)


@pytest.fixture
def gcs_target(gcs_endpoint: str) -> StoreTarget:
    return gcs_bucket_target(gcs_endpoint)
