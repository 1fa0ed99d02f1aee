"""`GcsStore`: Google Cloud Storage through gcsfs, with GCS's conditional writes.

- create-only: a single-request upload with `ifGenerationMatch=0`; an existing object
  answers 412 (which gcsfs raises as `FileExistsError`);
- compare-and-swap: a media GET returns the object's generation in `X-Goog-Generation`,
  which is the version; the swap is an upload with `ifGenerationMatch=<generation>`;
- a listing is one objects.list request per 1,000 keys, whatever gcsfs's `find` would add;
- each write request asks the write's `SEND_GUARD` again right before it is sent, through
  an aiohttp trace hook on gcsfs's session (`send_guard_trace_config`), gcsfs's own retries
  included.

The GCS emulator as it ships ignores preconditions and sends no generation header; test
against `procstore.testing.gcs_server`, which adds both as GCS has them.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import quote

from procstore.errors import StoreError
from procstore.store.errors import store_errors
from procstore.store.fsspec_store import BucketStore, ListPage, modified_time
from procstore.store.guarded import guard_request


class GcsStore(BucketStore):
    supports_compare_and_swap = True

    async def put_if_absent(self, key: str, value: bytes) -> bool:
        with store_errors("creating", self.url, key):
            return await self._upload(key, value, if_generation_match="0")

    async def get_versioned(self, key: str) -> tuple[bytes, str] | None:
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

    async def put_if_version(self, key: str, value: bytes, version: str | None) -> bool:
        """`ifGenerationMatch=<generation>` (`0` for `None`): atomic for every writer."""
        with store_errors("writing", self.url, key):
            return await self._upload(key, value, if_generation_match=version or "0")

    async def _upload(self, key: str, value: bytes, *, if_generation_match: str) -> bool:
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

    async def _list_page(self, prefix: str, token: str | None) -> ListPage:
        page = await self.fs._call(
            "GET",
            "b/{}/o",
            self.bucket,
            json_out=True,
            prefix=prefix,
            maxResults=self.list_page_size,
            pageToken=token,
        )
        keys = [(str(item["name"]), modified_time(item)) for item in page.get("items") or []]
        token = page.get("nextPageToken") or None
        return keys, token, False  # GCS says more follow by the token alone

    async def close(self) -> None:
        session = getattr(self.fs, "_session", None)
        if session is not None:
            await session.close()


def send_guard_trace_config() -> Any:
    """An aiohttp `TraceConfig` for gcsfs's session (`session_kwargs={"trace_configs": [...]}`)
    that calls the write's `SEND_GUARD` right before each attempt is sent: GCS's counterpart
    of botocore's `before-send` hook."""
    import aiohttp

    async def on_request_start(_session: Any, _ctx: Any, params: aiohttp.TraceRequestStartParams) -> None:
        guard_request(params.method, str(params.url))

    trace = aiohttp.TraceConfig()
    trace.on_request_start.append(on_request_start)
    return trace
