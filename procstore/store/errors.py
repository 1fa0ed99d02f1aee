"""Turning backend exceptions into `StoreError`s that name the key and say what to do."""

from __future__ import annotations

from types import TracebackType

from procstore.errors import StoreError, StoreUnavailable, describe


class store_errors:
    """Re-raise any failure of the block as a `StoreError` that names `op`, the store and the key.

    A class, not a `@contextmanager` generator: every store request goes through one, and
    the generator's frame and wrapper cost several times what this does."""

    __slots__ = ("_key", "_op", "_url")

    def __init__(self, op: str, url: str, key: str | None = None) -> None:
        self._op = op
        self._url = url
        self._key = key

    def __enter__(self) -> None:
        return None

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None, tb: TracebackType | None) -> None:
        if error is None or isinstance(error, StoreError) or not isinstance(error, Exception):
            return  # nothing failed, already a StoreError, or not a failure (a cancel, an exit)
        key = self._key
        what = f"{self._op} {self._url}{key or ''}"
        if isinstance(error, PermissionError):
            hint = "check the credentials and the permissions on the store"
            raise StoreError(f"{what} was denied ({describe(error)}); {hint}", key=key) from error
        raise StoreError(f"{what} failed: {describe(error)}", key=key) from error


def unavailable(url: str, exc: BaseException) -> StoreUnavailable:
    """The error for a store that cannot be reached or listed at all."""
    if isinstance(exc, FileNotFoundError):
        hint = "the bucket or directory does not exist: create it or fix the URL"
    elif isinstance(exc, PermissionError):
        hint = "access was denied: check the credentials and the store's permissions"
    elif "credentials" in f"{type(exc).__name__} {exc}".lower():
        hint = (
            "no credentials were found: set them in the environment (AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY or "
            "AWS_PROFILE; GOOGLE_APPLICATION_CREDENTIALS), or pass them as storage options"
        )
    else:
        hint = "check the URL, the storage options and that the service is reachable"
    err = StoreUnavailable(f"cannot use the procedure store at {url}: {describe(exc)}; {hint}")
    err.__cause__ = exc
    return err
