"""`S3Store`: S3 through s3fs, with S3's conditional writes and a last-moment write guard.

- create-only: `If-None-Match: *` (s3fs's `mode="create"`); an existing key answers 412;
- compare-and-swap: the ETag of a GET is the version, and `If-Match: <etag>` the swap;
- each write request asks the write's `SEND_GUARD` again in botocore's `before-send` hook,
  right before it leaves the process (each of botocore's and s3fs's retries too);
- a batch delete is one DeleteObjects request per 1,000 keys;
- a read is one GetObject (a missing key answers 404), whatever s3fs's `cat_file` would add;
- a listing is one ListObjectsV2 per 1,000 keys, whatever s3fs's `find` would add.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from procstore.errors import StoreError
from procstore.store.errors import store_errors
from procstore.store.fsspec_store import BucketStore, ListPage, chunks, modified_time
from procstore.store.guarded import guard_request


class S3Store(BucketStore):
    supports_compare_and_swap = True

    async def get(self, key: str) -> bytes | None:
        """One GetObject. s3fs's `cat_file` first asks the size (a HeadObject, and for a
        missing key a ListObjectsV2 as well, to tell a folder apart): three requests where one
        does, on the runner's look for an operator request before every attempt above all."""
        found = await self.get_versioned(key)
        return None if found is None else found[0]

    async def get_versioned(self, key: str) -> tuple[bytes, str] | None:
        with store_errors("reading", self.url, key):
            bucket, name, _ = self.fs.split_path(self._full(key))
            try:
                response = await self.fs._call_s3("get_object", Bucket=bucket, Key=name)
            except FileNotFoundError as e:
                if _response(e).get("Error", {}).get("Code") in ("NoSuchKey", None):
                    return None
                raise  # NoSuchBucket, say: a failed read must never look like a missing key
            try:
                body: bytes = await response["Body"].read()
            finally:
                response["Body"].close()
            return body, str(response["ETag"])

    async def _list_page(self, prefix: str, token: str | None) -> ListPage:
        page: dict[str, Any] = {"Bucket": self.bucket, "Prefix": prefix, "MaxKeys": self.list_page_size}
        if token is not None:
            page["ContinuationToken"] = token
        out = await self.fs._call_s3("list_objects_v2", **page)
        keys = [(str(item["Key"]), modified_time(item)) for item in out.get("Contents") or []]
        if not out.get("IsTruncated"):
            return keys, None, False  # the last page, whatever else it carries
        return keys, (str(out["NextContinuationToken"]) if out.get("NextContinuationToken") else None), True

    async def put_if_version(self, key: str, value: bytes, version: str | None) -> bool:
        """`If-Match: <etag>` (`If-None-Match: *` for `None`): atomic for every writer."""
        if version is None:
            return await self.put_if_absent(key, value)
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

    async def batch_delete(self, keys: Sequence[str]) -> None:
        if not keys:
            return
        with store_errors("deleting", self.url, keys[0]):
            for chunk in chunks([self._full(k) for k in keys]):
                await self._delete_objects(chunk)

    async def _delete_objects(self, paths: Sequence[str]) -> None:
        """One DeleteObjects request, which raises unless every key is gone.

        S3 answers 200 and lists keys it could not delete under `Errors` (s3fs's own bulk
        delete ignores them): a deletion order that went on past such a key could delete a
        procedure's `.commit` while one of its steps remains.
        """
        bucket = self.bucket
        names = [self.fs.split_path(path)[1] for path in paths]
        out = await self.fs._call_s3(
            "delete_objects", Bucket=bucket, Delete={"Objects": [{"Key": name} for name in names], "Quiet": True}
        )
        errors = out.get("Errors") or []
        if errors:
            first = errors[0]
            key = str(first.get("Key", names[0]))
            raise StoreError(
                f"deleting s3://{bucket}/{key} failed: S3 kept {len(errors)} of {len(names)} keys "
                f"({first.get('Code')}: {first.get('Message')}); the deletion is retried in order",
                key=key,
            )

    async def _try_access(self) -> None:
        await super()._try_access()
        # Registering twice is a no-op.
        client = await self.fs.set_session()
        client.meta.events.register("before-send.s3", _check_send_guard, unique_id="procstore-send-guard")

    async def close(self) -> None:
        creator = getattr(self.fs, "_s3creator", None)
        if creator is not None:
            await creator.__aexit__(None, None, None)
            self.fs._s3 = None


def _response(exc: BaseException) -> dict[str, Any]:
    """The S3 response behind an error s3fs translated (empty if it kept none): its `Error`
    says the code (`NoSuchKey`, ...)."""
    response = getattr(exc.__cause__ or exc.__context__, "response", None)
    return response if isinstance(response, dict) else {}


def _precondition_failed(exc: BaseException) -> bool:
    """s3fs reports a failed If-Match as an OSError whose cause is a 412 ClientError."""
    response = _response(exc)
    error = response.get("Error", {})
    status = response.get("ResponseMetadata", {}).get("HTTPStatusCode")
    return bool(status == 412 or error.get("Code") in ("PreconditionFailed", "412"))


def _check_send_guard(request: Any, **_: Any) -> None:
    """botocore's `before-send` hook: runs right before each attempt leaves the process."""
    guard_request(request.method, str(request.url))
