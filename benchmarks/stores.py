"""The stores benchmarks run on: a local directory (durable), memory://, S3 on a moto server."""

from __future__ import annotations

import contextlib
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any


@dataclass
class Target:
    kind: str
    """`local`, `memory` or `s3`: what the suites do differs by it."""
    base: str
    options: dict[str, Any] = field(default_factory=dict)
    key: str = ""
    """Which target of `targets()` it is (its kind unless said): sizes are chosen by it."""
    name: str = ""
    """How rows name it (its kind unless said): S3 is measured on moto alone and behind
    latency proxies."""

    @property
    def proxied(self) -> bool:
        """S3 behind a latency proxy: requests overlap as on S3."""
        return self.key != self.kind

    def __post_init__(self) -> None:
        self.key = self.key or self.kind
        self.name = self.name or self.kind

    def url(self) -> str:
        """A fresh, empty store under this target."""
        if self.kind == "memory":
            return f"memory://bench-{uuid.uuid4().hex}/"
        return f"{self.base}{uuid.uuid4().hex}/"


@contextmanager
def targets(kinds: list[str]) -> Iterator[list[Target]]:
    out = []
    with tempfile.TemporaryDirectory(prefix="procstore-bench-") as tmp, contextlib.ExitStack() as stack:
        for kind in kinds:
            if kind == "local":
                out.append(Target("local", f"{tmp}/"))
            elif kind == "memory":
                out.append(Target("memory", "memory://"))
            elif kind in S3_TARGETS:
                from procstore.testing.pytest_plugin import create_bucket, s3_storage_options

                endpoint = stack.enter_context(moto_server_process())
                delay = S3_TARGETS[kind]
                if delay:
                    endpoint = stack.enter_context(latency_proxy(endpoint, delay))
                bucket = f"s3://{create_bucket(endpoint)}/"
                out.append(Target("s3", bucket, s3_storage_options(endpoint), key=kind, name=S3_NAMES[kind]))
        yield out


S3_TARGETS: dict[str, tuple[str, ...]] = {
    "s3": (),
    "s3-15ms": ("--fixed-ms", "15"),
    "s3-lognormal": ("--lognormal-ms", "10", "40"),
}
"""The S3 targets: moto alone, and moto behind a latency proxy (its arguments)."""

S3_NAMES = {
    "s3": "s3 (moto alone: one request at a time)",
    "s3-15ms": "s3 via a 15 ms proxy",
    "s3-lognormal": "s3 via a 10-40 ms lognormal proxy",
}


@contextmanager
def latency_proxy(endpoint: str, delay: tuple[str, ...]) -> Iterator[str]:
    """`benchmarks.latency_proxy` in front of `endpoint`, in its own process. Yields its endpoint."""
    from procstore.testing.pytest_plugin import free_port

    port = free_port()
    to = endpoint.rsplit(":", 1)[1]
    command = [sys.executable, "-m", "benchmarks.latency_proxy", "--port", str(port), "--to", to, *delay]
    with _process(command, port) as url:
        yield url


@contextmanager
def moto_server_process() -> Iterator[str]:
    """A moto server in its own process on 127.0.0.1: in this one it would compete with the
    code under measurement for the GIL. Yields its endpoint."""
    from procstore.testing.pytest_plugin import free_port

    port = free_port()
    with _process([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)], port) as url:
        yield url


@contextmanager
def _process(command: list[str], port: int) -> Iterator[str]:
    """`command`, a server that listens on `port` of 127.0.0.1, until the block ends."""
    server = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
                break
            except OSError:
                if time.monotonic() > deadline or server.poll() is not None:
                    raise RuntimeError(f"{command[2]} did not start") from None
                time.sleep(0.1)
        yield f"http://127.0.0.1:{port}"
    finally:
        server.terminate()
        server.wait(10)


def innermost(store: Any) -> Any:
    """The store under every wrapper (telemetry, the lease's guard) of a manager's store."""
    while (inner := getattr(store, "inner", None)) is not None:
        store = inner
    return store


class RequestCounter:
    """Counts the HTTP requests an S3 store sends while in use (`async with`), by kind,
    from botocore's `before-send` event: every request and every retry, as the bucket sees them."""

    def __init__(self, store: Any) -> None:
        self.store = innermost(store)
        self.counts: dict[str, int] = {}
        self._client: Any = None

    def _count(self, request: Any, **_: Any) -> None:
        method, url = str(request.method), str(request.url)
        if method == "GET" and "list-type=" in url:
            kind = "LIST"
        elif method == "POST" and "delete" in url.rsplit("?", 1)[-1]:
            kind = "DeleteObjects"
        else:
            kind = method
        self.counts[kind] = self.counts.get(kind, 0) + 1

    async def __aenter__(self) -> RequestCounter:
        self._client = await self.store.fs.set_session()
        self._client.meta.events.register("before-send.s3", self._count, unique_id="procstore-bench-counter")
        return self

    async def __aexit__(self, *_: object) -> None:
        self._client.meta.events.unregister("before-send.s3", unique_id="procstore-bench-counter")
