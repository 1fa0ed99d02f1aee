"""`open_state_store`: from a URL or a local path to the right `StateStore`."""

from __future__ import annotations

import os
import warnings
from typing import Any

import fsspec
from fsspec.implementations.local import LocalFileSystem

from procstore.errors import StoreUnavailable
from procstore.store.errors import unavailable
from procstore.store.fsspec_store import FsspecStore
from procstore.store.gcs import GcsStore, send_guard_trace_config
from procstore.store.local import LocalDirStore
from procstore.store.memory import MemoryStore
from procstore.store.s3 import S3Store
from procstore.store.state_store import StateStore

_EXTRAS = {"s3": "s3", "s3a": "s3", "gs": "gcs", "gcs": "gcs"}
_ASYNC_PROTOCOLS = frozenset({"s3", "s3a", "gs", "gcs"})


def open_state_store(url: str | os.PathLike[str], storage_options: dict[str, Any] | None = None) -> StateStore:
    """Build the store for `url` without touching the network or the disk.

    A plain path or `file://` URL gives a `LocalDirStore` (durable writes); `memory://name/`
    a `MemoryStore` (procstore's own, for tests; `mem://name/` too, deprecated, with a
    `DeprecationWarning`); anything else goes through fsspec with
    `storage_options`. Must be called inside the event loop that
    will use the store, because async filesystems bind to it.

    Raises `StoreUnavailable` for an unknown protocol, a backend that is not installed, or a
    filesystem that connects as it is built (ftp://, sftp://...) and cannot.
    """
    text = os.fspath(url)
    protocol = text.split("://", 1)[0].lower() if "://" in text else "file"
    options = dict(storage_options or {})
    if protocol == "file":
        path = text[len("file://") :] if text.startswith("file://") else text
        return LocalDirStore(os.path.expanduser(path))
    if protocol == "mem":
        warnings.warn(
            "the mem:// scheme is deprecated and goes in the next release: use memory://, the same store",
            DeprecationWarning,
            stacklevel=2,
        )
    if protocol in ("memory", "mem"):
        return MemoryStore.from_url(text)
    if protocol in ("s3", "s3a"):
        # botocore would refuse to return an object whose stored checksum does not match (a
        # create cut off by a killed writer, on a test server): recovery wants the bytes, and
        # validates every message itself.
        config = dict(options.get("config_kwargs") or {})
        config.setdefault("response_checksum_validation", "when_required")
        options["config_kwargs"] = config
    if protocol in ("gs", "gcs"):
        # A lease's write guard, checked again right before each request leaves (see guarded.py).
        session = dict(options.get("session_kwargs") or {})
        session["trace_configs"] = [*session.get("trace_configs", ()), send_guard_trace_config()]
        options["session_kwargs"] = session
    if protocol in _ASYNC_PROTOCOLS:
        options.setdefault("asynchronous", True)
        options.setdefault("skip_instance_cache", True)
        options.setdefault("use_listings_cache", False)
    try:
        fs, path = fsspec.core.url_to_fs(text, **options)
    except ImportError as e:
        extra = _EXTRAS.get(protocol)
        hint = f"pip install 'procstore[{extra}]'" if extra else f"install the fsspec backend for {protocol!r}"
        raise StoreUnavailable(f"cannot open {text}: {e}; {hint}") from e
    except (ValueError, TypeError) as e:
        raise StoreUnavailable(
            f"cannot open {text}: {e}; expected a local path, file://, s3://, gs://, memory:// "
            "or another fsspec URL, with valid storage_options"
        ) from e
    except Exception as e:  # a filesystem that connects as it is built (ftp, sftp, smb...): unreachable
        raise unavailable(text, e) from e
    if isinstance(fs, LocalFileSystem):
        return LocalDirStore(path)
    if getattr(fs, "asynchronous", False):  # storage_options may have asked for a blocking client
        if protocol in ("s3", "s3a"):
            return S3Store(fs, path, text)
        if protocol in ("gs", "gcs"):
            return GcsStore(fs, path, text)
    return FsspecStore(fs, path, text)
