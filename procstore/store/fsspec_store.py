"""`FsspecStore`: a store on any fsspec filesystem (S3, GCS, memory, ...).

Async filesystems (s3fs, gcsfs) are driven through their coroutine methods on the running
loop. Blocking ones run in a thread, except `memory://`, which never blocks and is called
inline. Listings bypass fsspec's listing cache, which otherwise hides keys written by
another client.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from datetime import datetime
from typing import Any, TypeVar
from urllib.parse import quote

from fsspec.spec import AbstractFileSystem

from procstore.aio import run_blocking
from procstore.errors import StoreError
from procstore.store.errors import store_errors, unavailable
from procstore.store.guarded import SEND_GUARD
from procstore.store.state_store import StateStore

T = TypeVar("T")

_CREATE_ONLY_PROTOCOLS = frozenset({"s3", "s3a", "gs", "gcs", "memory"})
_BULK_DELETE_CHUNK = 1000


def _protocol(fs: AbstractFileSystem) -> str:
    proto = fs.protocol
    return proto if isinstance(proto, str) else proto[0]


class FsspecStore(StateStore):
    """A `StateStore` over an fsspec filesystem, rooted at `root` (`bucket/prefix`)."""

    def __init__(self, fs: AbstractFileSystem, root: str, url: str) -> None:
        self.fs = fs
        self.root = root.rstrip("/")
        self.url = url if url.endswith("/") else url + "/"
        self.protocol = _protocol(fs)
        self._async = bool(getattr(fs, "async_impl", False)) and bool(getattr(fs, "asynchronous", False))
        # memory:// never blocks; a wrapper may say the same of itself (`procstore_inline`).
        self._inline = self.protocol == "memory" or bool(getattr(fs, "procstore_inline", False))
        self.supports_create_only = self.protocol in _CREATE_ONLY_PROTOCOLS
        self._s3 = self._async and self.protocol in ("s3", "s3a")
        self._gcs = self._async and self.protocol in ("gs", "gcs")
        # memory:// lives in this process, so the in-process lock of the default is enough.
        self.supports_compare_and_swap = self._s3 or self._gcs or self.protocol == "memory"

    def _full(self, key: str) -> str:
        return f"{self.root}/{key}" if self.root else key

    def _key(self, path: str) -> str:
        # Filesystems disagree on a leading "/" (memory:// adds one, wrappers may drop it).
        path = path.lstrip("/")
        prefix = f"{self.root.lstrip('/')}/" if self.root.strip("/") else ""
        return path[len(prefix) :] if path.startswith(prefix) else path

    async def _call(self, name: str, *args: Any, **kwargs: Any) -> Any:
        """Call filesystem method `name`: its coroutine, inline, or in a thread."""
        if self._async:
            method: Callable[..., Awaitable[Any]] = getattr(self.fs, "_" + name)
            return await method(*args, **kwargs)
        sync_method: Callable[..., Any] = getattr(self.fs, name)
        if self._inline:
            return sync_method(*args, **kwargs)
        return await run_blocking(lambda: sync_method(*args, **kwargs))

    async def _install_send_guard(self) -> None:
        """Have botocore call the `SEND_GUARD` of the write in progress right before it sends
        each request that changes the bucket (registering twice is a no-op)."""
        client = await self.fs.set_session()
        client.meta.events.register("before-send.s3", _check_send_guard, unique_id="procstore-send-guard")

    async def _pipe(self, key: str, value: bytes, **kwargs: Any) -> None:
        path = self._full(key)
        try:
            await self._call("pipe_file", path, value, **kwargs)
        except FileNotFoundError:
            # A filesystem with real folders (local behind a wrapper, sftp...): make them.
            await self._call("makedirs", path.rsplit("/", 1)[0], exist_ok=True)
            await self._call("pipe_file", path, value, **kwargs)

    async def put(self, key: str, value: bytes) -> None:
        with store_errors("writing", self.url, key):
            await self._pipe(key, value)

    async def put_if_absent(self, key: str, value: bytes) -> bool:
        with store_errors("creating", self.url, key):
            if self.protocol == "memory":
                # fsspec's create mode asks `exists`, which scans every key on memory://; its
                # dict answers at once, and nothing runs between the check and the write
                # (memory:// is called inline, on the event loop).
                if self.fs._strip_protocol(self._full(key)) in self.fs.store:
                    return False
                await self._pipe(key, value)
                return True
            if self._gcs:
                return await self._gcs_upload(key, value, if_generation_match="0")
            try:
                await self._pipe(key, value, mode="create")
            except FileExistsError:
                return False
            return True

    async def get(self, key: str) -> bytes | None:
        with store_errors("reading", self.url, key):
            try:
                data: bytes = await self._call("cat_file", self._full(key))
            except FileNotFoundError:
                return None
            return data

    async def get_versioned(self, key: str) -> tuple[bytes, str] | None:
        if self._gcs:
            return await self._gcs_get_versioned(key)
        if not self._s3:
            return await super().get_versioned(key)
        with store_errors("reading", self.url, key):
            bucket, name, _ = self.fs.split_path(self._full(key))
            try:
                response = await self.fs._call_s3("get_object", Bucket=bucket, Key=name)
            except FileNotFoundError:
                return None
            try:
                body: bytes = await response["Body"].read()
            finally:
                response["Body"].close()
            return body, str(response["ETag"])

    async def put_if_version(self, key: str, value: bytes, version: str | None) -> bool:
        """Atomic for every writer on S3 (`If-Match: <etag>`; `If-None-Match: *` for `None`) and
        on GCS (`ifGenerationMatch=<generation>`; `0` for `None`)."""
        if self._gcs:
            with store_errors("writing", self.url, key):
                return await self._gcs_upload(key, value, if_generation_match=version or "0")
        if not self._s3 or version is None:
            return await super().put_if_version(key, value, version)
        with store_errors("writing", self.url, key):
            try:
                await self.fs._pipe_file(self._full(key), value, IfMatch=version)
            except FileNotFoundError:
                return False
            except OSError as e:
                if _precondition_failed(e):
                    return False
                raise
            return True

    async def _gcs_get_versioned(self, key: str) -> tuple[bytes, str] | None:
        """One media GET: GCS sends the object's generation with its bytes (`X-Goog-Generation`)."""
        with store_errors("reading", self.url, key):
            try:
                headers, body = await self.fs._call("GET", self.fs.url(self._full(key)))
            except FileNotFoundError:
                return None
        generation = headers.get("X-Goog-Generation")
        if generation is None:
            raise StoreError(
                f"reading {self.url}{key}: the server sent no X-Goog-Generation header, so compare-and-swap "
                "cannot be used on it (GCS sends one; the plain gcp-storage-emulator does not: test against "
                "procstore.testing.gcs_server)",
                key=key,
            )
        return bytes(body), str(generation)

    async def _gcs_upload(self, key: str, value: bytes, *, if_generation_match: str) -> bool:
        """A single-request upload that GCS applies only if the object's generation is
        `if_generation_match` (`"0"`: it does not exist); False if it refused (412)."""
        bucket, name, _ = self.fs.split_path(self._full(key))
        try:
            await self.fs._call(
                "POST",
                f"{self.fs._location}/upload/storage/v1/b/{quote(bucket, safe='')}/o",
                uploadType="media",
                name=name,
                ifGenerationMatch=if_generation_match,
                data=value,
                headers={"Content-Type": "application/octet-stream"},
                json_out=True,
            )
        except FileExistsError:  # gcsfs's name for 412 Precondition Failed
            return False
        return True

    async def walk(self, prefix: str) -> list[str]:
        return sorted(self._key(path) for path in await self._find(prefix, detail=False))

    async def walk_modified(self, prefix: str) -> dict[str, float | None]:
        found: dict[str, dict[str, Any]] = await self._find(prefix, detail=True)
        return {self._key(path): _modified(info) for path, info in sorted(found.items())}

    async def _find(self, prefix: str, *, detail: bool) -> Any:
        """fsspec's `find` under `prefix` (paths, or path -> info), fresh; empty if nothing is there."""
        with store_errors("listing", self.url, prefix):
            self.fs.invalidate_cache()
            try:
                found: dict[str, dict[str, Any]] = await self._call("find", self._full(prefix).rstrip("/"), detail=True)
            except FileNotFoundError:
                found = {}
        # s3fs answers an empty listing with `info(prefix)`, which names the folder itself
        # when keys appeared under it in between: a folder is not a key.
        files = {path: info for path, info in found.items() if info.get("type") != "directory"}
        return files if detail else list(files)

    async def batch_delete(self, keys: Sequence[str]) -> None:
        if not keys:
            return
        with store_errors("deleting", self.url, keys[0]):
            paths = [self._full(k) for k in keys]
            for i in range(0, len(paths), _BULK_DELETE_CHUNK):
                chunk = paths[i : i + _BULK_DELETE_CHUNK]
                if self._async and self.protocol in ("s3", "s3a"):
                    # One DeleteObjects request; `rm` would first expand the paths.
                    await self.fs._bulk_delete(chunk)
                    continue
                if self._inline:
                    # No thread hop to save, and `rm` checks each path with `exists`,
                    # which on memory:// scans every key.
                    await self._delete_each(chunk)
                    continue
                try:
                    await self._call("rm", chunk)
                except FileNotFoundError:
                    await self._delete_each(chunk)

    async def _delete_each(self, paths: Sequence[str]) -> None:
        for path in paths:
            try:
                await self._call("rm_file", path)
            except FileNotFoundError:
                continue

    async def delete(self, key: str) -> None:
        if key.endswith("/"):
            # Object stores have no folders: the prefix is gone with its last key. Only
            # memory:// keeps pseudo-folders, and those are harmless.
            return
        with store_errors("deleting", self.url, key):
            await self._delete_each([self._full(key)])

    async def check_access(self) -> None:
        try:
            self.fs.invalidate_cache()
            if self.protocol in ("s3", "s3a", "gs", "gcs"):
                bucket = self.root.split("/", 1)[0]
                await self._call("ls", bucket)
                if self._s3:
                    await self._install_send_guard()
            else:
                await self.walk("")
        except Exception as e:
            raise unavailable(self.url, e.__cause__ or e) from e

    async def close(self) -> None:
        if self.protocol in ("s3", "s3a") and self._async:
            creator = getattr(self.fs, "_s3creator", None)
            if creator is not None:
                await creator.__aexit__(None, None, None)
                self.fs._s3 = None
        elif self.protocol in ("gs", "gcs") and self._async:
            session = getattr(self.fs, "_session", None)
            if session is not None:
                await session.close()


def _precondition_failed(exc: BaseException) -> bool:
    """s3fs reports a failed If-Match as an OSError whose cause is a 412 ClientError."""
    cause = exc.__cause__ or exc.__context__
    response = getattr(cause, "response", None)
    if not isinstance(response, dict):
        return False
    error = response.get("Error", {})
    status = response.get("ResponseMetadata", {}).get("HTTPStatusCode")
    return bool(status == 412 or error.get("Code") in ("PreconditionFailed", "412"))


def _modified(info: dict[str, Any]) -> float | None:
    """The last-modified time in an fsspec `info` dict; each filesystem names it differently."""
    for field in ("LastModified", "updated", "mtime", "created"):  # s3, gcs, local, memory
        value = info.get(field)
        if isinstance(value, datetime):
            return value.timestamp()
        if isinstance(value, int | float):
            return float(value)
        if isinstance(value, str):
            try:
                return datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()
            except ValueError:
                continue
    return None


def _guard_request(method: str, url: str) -> None:
    """Call the `SEND_GUARD` of the write in progress if this request changes the bucket."""
    guard = SEND_GUARD.get()
    if guard is not None and method in ("PUT", "POST", "DELETE", "PATCH"):
        guard(url)


def _check_send_guard(request: Any, **_: Any) -> None:
    """botocore's `before-send` hook (S3): runs right before each attempt leaves the process."""
    _guard_request(request.method, str(request.url))


def send_guard_trace_config() -> Any:
    """An aiohttp `TraceConfig` for gcsfs's session (`session_kwargs={"trace_configs": [...]}`)
    that calls the write's `SEND_GUARD` right before each attempt is sent, gcsfs's own retries
    included: GCS's counterpart of botocore's `before-send` hook."""
    import aiohttp

    async def on_request_start(_session: Any, _ctx: Any, params: aiohttp.TraceRequestStartParams) -> None:
        _guard_request(params.method, str(params.url))

    trace = aiohttp.TraceConfig()
    trace.on_request_start.append(on_request_start)
    return trace
