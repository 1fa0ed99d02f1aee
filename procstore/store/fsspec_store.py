"""`FsspecStore`: a store on any fsspec filesystem (memory://, sftp, ...; S3 and GCS build on it).

Async filesystems (s3fs, gcsfs) are driven through their coroutine methods on the running
loop. Blocking ones run in a thread, except `memory://`, which never blocks and is called
inline. Listings bypass fsspec's listing cache, which otherwise hides keys written by
another client. `BucketStore` adds what every object store in a bucket shares; each
service's conditional writes and request hooks live in its own module (`s3.py`, `gcs.py`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Awaitable, Callable, Iterator, Sequence
from datetime import datetime
from typing import Any, TypeVar

from fsspec.spec import AbstractFileSystem

from procstore._aio import run_blocking
from procstore.errors import StoreError
from procstore.store.errors import store_errors, unavailable
from procstore.store.state_store import StateStore

T = TypeVar("T")

ListPage = tuple[list[tuple[str, float | None]], str | None, bool]
"""`BucketStore._list_page`'s answer: (object name, modified) pairs, the next token, truncated."""

_CREATE_ONLY_PROTOCOLS = frozenset({"s3", "s3a", "gs", "gcs", "memory"})
_DELETE_CHUNK = 1000
"""Keys per delete call (S3's DeleteObjects takes at most 1,000)."""


def chunks(paths: Sequence[str]) -> Iterator[Sequence[str]]:
    """`paths` in slices of at most `_DELETE_CHUNK`."""
    for i in range(0, len(paths), _DELETE_CHUNK):
        yield paths[i : i + _DELETE_CHUNK]


class FsspecStore(StateStore):
    """A `StateStore` over an fsspec filesystem, rooted at `root` (`bucket/prefix`)."""

    def __init__(self, fs: AbstractFileSystem, root: str, url: str) -> None:
        self.fs = fs
        self.root = root.rstrip("/")
        self.url = url if url.endswith("/") else url + "/"
        self.protocol: str = fs.protocol if isinstance(fs.protocol, str) else fs.protocol[0]
        self._async = bool(getattr(fs, "async_impl", False)) and bool(getattr(fs, "asynchronous", False))
        # memory:// never blocks; a wrapper may say the same of itself (`procstore_inline`).
        self._inline = self.protocol == "memory" or bool(getattr(fs, "procstore_inline", False))
        self.supports_create_only = self.protocol in _CREATE_ONLY_PROTOCOLS
        if self.protocol == "memory":
            # It lives in this process, so the in-process lock of the default is enough.
            self.supports_compare_and_swap = True

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

    async def walk(self, prefix: str) -> list[str]:
        return list(await self.walk_modified(prefix))

    async def walk_modified(self, prefix: str) -> dict[str, float | None]:
        """fsspec's `find` under `prefix`, fresh; empty if nothing is there."""
        with store_errors("listing", self.url, prefix):
            self.fs.invalidate_cache()
            try:
                found: dict[str, dict[str, Any]] = await self._call("find", self._full(prefix).rstrip("/"), detail=True)
            except FileNotFoundError:
                found = {}
        # s3fs answers an empty listing with `info(prefix)`, which names the folder itself
        # when keys appeared under it in between: a folder is not a key.
        return {
            self._key(path): modified_time(info)
            for path, info in sorted(found.items())
            if info.get("type") != "directory"
        }

    async def batch_delete(self, keys: Sequence[str]) -> None:
        if not keys:
            return
        with store_errors("deleting", self.url, keys[0]):
            paths = [self._full(k) for k in keys]
            for chunk in chunks(paths):
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
            await self._try_access()
        except Exception as e:
            raise unavailable(self.url, e.__cause__ or e) from e

    async def _try_access(self) -> None:
        """A cheap call that fails if the store cannot be used: listing its root.

        `ls`, not `find`: some filesystems' `find` (HTTP's) answers an unreachable server
        with an empty listing. A root that does not exist yet is fine (nothing stored).
        """
        with contextlib.suppress(FileNotFoundError):
            await self._call("ls", self._full("").rstrip("/") or self.root, detail=False)
        await self.walk("")


class BucketStore(FsspecStore):
    """A prefix of an object store's bucket, through an async filesystem (s3fs, gcsfs)."""

    round_trips = True
    list_page_size = 1000
    """Keys per page of a listing (the largest both S3 and GCS answer)."""

    async def walk_modified(self, prefix: str) -> dict[str, float | None]:
        return dict(sorted((await self._listed(prefix)).items()))

    async def _listed(self, prefix: str) -> dict[str, float | None]:
        """Every key under the folder `prefix`, with its last-modified time: the service's
        listing pages and nothing else. s3fs's and gcsfs's `find` answer an empty prefix
        with more requests (to tell a file or a folder of that name), and the watch of
        `requests/` lists an empty folder about once a second for a manager's life.

        A missing bucket raises, and so does a page that says more keys follow without
        saying how to ask for them: a listing cut short would read as "nothing more stored"
        (recovery leaving procedures unresumed, with no error)."""
        with store_errors("listing", self.url, prefix):
            root = self._full(prefix).partition("/")[2].rstrip("/")
            wanted = f"{root}/" if root else ""
            found: dict[str, float | None] = {}
            token: str | None = None
            asked: set[str] = set()
            while True:
                keys, token, truncated = await self._list_page(wanted, token)
                if token in asked:
                    raise StoreError(
                        f"listing {self.url}{prefix}: the server gave the same continuation token twice; "
                        "check the endpoint",
                        key=prefix,
                    )
                if token is not None:
                    asked.add(token)
                for name, modified in keys:
                    if not name.endswith("/"):  # a folder's placeholder object is not a key
                        found[self._key(f"{self.bucket}/{name}")] = modified
                if token is None:
                    if truncated:
                        raise StoreError(
                            f"listing {self.url}{prefix}: the server answered a truncated page without a "
                            f"continuation token after {len(found)} keys; check the endpoint (it must support "
                            "the service's current listing API)",
                            key=prefix,
                        )
                    return found

    async def _list_page(self, prefix: str, token: str | None) -> ListPage:
        """One page of the objects whose names start with `prefix`, from `token` (None: the
        first): their names and last-modified times, the next page's token (None: none),
        and whether the server said more follow."""
        raise NotImplementedError

    @property
    def bucket(self) -> str:
        return self.root.split("/", 1)[0]

    async def _try_access(self) -> None:
        # Listing the bucket (one request) tells a missing bucket or denied access apart
        # from an empty prefix; walking the prefix could take many.
        await self._call("ls", self.bucket)


def modified_time(info: dict[str, Any]) -> float | None:
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
