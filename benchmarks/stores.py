"""The stores benchmarks run on: a local directory (durable), memory://, S3 on a moto server."""

from __future__ import annotations

import tempfile
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any


@dataclass
class Target:
    kind: str
    base: str
    options: dict[str, Any] = field(default_factory=dict)

    def url(self) -> str:
        """A fresh, empty store under this target."""
        if self.kind == "memory":
            return f"memory://bench-{uuid.uuid4().hex}/"
        return f"{self.base}{uuid.uuid4().hex}/"


@contextmanager
def targets(kinds: list[str]) -> Iterator[list[Target]]:
    server = None
    out = []
    with tempfile.TemporaryDirectory(prefix="procstore-bench-") as tmp:
        for kind in kinds:
            if kind == "local":
                out.append(Target("local", f"{tmp}/"))
            elif kind == "memory":
                out.append(Target("memory", "memory://"))
            elif kind == "s3":
                from moto.server import ThreadedMotoServer

                from procstore.testing.pytest_plugin import create_bucket, free_port, s3_storage_options

                port = free_port()
                server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
                server.start()
                endpoint = f"http://127.0.0.1:{port}"
                out.append(Target("s3", f"s3://{create_bucket(endpoint)}/", s3_storage_options(endpoint)))
        try:
            yield out
        finally:
            if server is not None:
                server.stop()
