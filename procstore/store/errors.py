"""Turning backend exceptions into `StoreError`s that name the key and say what to do."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from procstore.errors import StoreError, StoreUnavailable, describe


@contextmanager
def store_errors(op: str, url: str, key: str | None = None) -> Iterator[None]:
    """Re-raise any failure of the block as a `StoreError` that names `op`, the store and the key."""
    try:
        yield
    except StoreError:
        raise
    except PermissionError as e:
        where = f"{url}{key or ''}"
        raise StoreError(
            f"{op} {where} was denied ({describe(e)}); check the credentials and the permissions on the store",
            key=key,
        ) from e
    except Exception as e:
        where = f"{url}{key or ''}"
        raise StoreError(f"{op} {where} failed: {describe(e)}", key=key) from e


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
