"""`LocalDirStore`: a store in a local directory, with durable, atomic writes.

fsspec's local `pipe_file` truncates the target and writes in place, so a crash can leave
an empty or half-written step file. Here every write goes to a temp file in the same
directory, is fsynced, renamed (or hard-linked, for create-only) over the key, and the
directory is fsynced: after a crash a key holds either its whole value or nothing.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import re
import shutil
import stat
import threading
import time
import uuid
from collections.abc import Callable, Coroutine, Iterator, Sequence
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any, BinaryIO, TypeVar

from procstore._aio import run_blocking
from procstore.errors import ListingIncomplete, describe
from procstore.ids import ProcedureId
from procstore.store.durable import create_exclusively, fsync_dir, make_dirs, write_all
from procstore.store.errors import store_errors, unavailable
from procstore.store.io_threads import Cleanups, IoThreads
from procstore.store.keys import PROC_PATH
from procstore.store.placement import gains_from_spreading, spread_subfolders
from procstore.store.state_store import StateStore, content_version

TEMP_PREFIX = ".tmp-"
"""Temp files start with this; they never parse as procedure keys."""
LOCK_PREFIX = ".lock-"
"""Lock files of compare-and-swap writes. Walks skip every name starting with a dot."""
TRASH = ".trash"
"""The folder, at the store's root, that a deleted procedure folder is moved into whole (out of
every listing at once), to be emptied once its deletion has been answered."""

TRASH_FROM_KEYS = 16
"""The fewest keys a folder goes to the trash with; fewer are unlinked in order. The move
saves an unlink per key of waiting (70 µs each, measured) but adds a listing, a rename
and, later, the same unlinks: with every folder moved, 1,000 concurrent 5-step procedures
ran 10 to 35% slower than with none (A/B of alternating processes); with this floor, alike."""

_TRASHED = re.compile(r".+-[0-9a-f]{32}")
"""The name of a folder procstore moved into the trash (`{name}-{uuid hex}`): the only
entries of the trash it ever removes (a `.trash` may also hold what a user put there)."""

_STALE_TEMP_SECONDS = 3600.0
_TEMP_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL
_PROCEDURES = f"/{PROC_PATH.rstrip('/')}"
"""How the path of a folder holding one folder per procedure ends (`_make_folder`)."""
T = TypeVar("T")


@dataclass(slots=True)
class Leftovers:
    """What `LocalDirStore.leftovers` found that walks never list (paths from the store's root)."""

    old_temps: list[str] = field(default_factory=list)
    """Temp files of writes cut short, older than the cutoff: removed (unless a dry run)."""
    young_temps: list[str] = field(default_factory=list)
    """Newer temp files: a write in progress, or one cut short lately. Left alone."""
    stray_locks: list[str] = field(default_factory=list)
    """Lock files of compare-and-swap writes whose key is gone: harmless, left alone (one
    may be in use: deleting it could let two writers lock the same key)."""
    old_empty_folders: list[str] = field(default_factory=list)
    """Empty procedure folders (named by an id), older than the cutoff: removed (unless a dry run)."""
    young_empty_folders: list[str] = field(default_factory=list)
    """Newer empty procedure folders: a first write may be under way. Left alone."""


IO_THREADS = 16
"""Threads every local store's file work runs in. A durable write spends its time in fsync,
which a disk serves several at once: on the benchmark machine (2 cores, ext4) the rate of
durable writes grows up to 8 to 16 concurrent fsyncs. The event loop's default pool has
min(32, CPUs + 4) threads, 6 on 2 cores: 1,000 concurrent 5-step procedures ran at a median
57/s there, 92/s with these 16 (interleaved runs, a loaded machine); more threads only add
turns at the GIL."""

io_threads = IoThreads(IO_THREADS, "procstore-local-io")
"""The process's threads for local file work."""


_lock_files: set[int] = set()
"""Descriptors of the lock files open now. A flock belongs to the open file, which a forked
child shares: the child closes its copies (`_after_fork_in_child`), or they would hold
their locks for good, with no thread left there to release them."""
_lock_files_guard = threading.Lock()
"""Held while a lock file is opened or closed, and across a fork, so that the set is exact."""


@contextlib.contextmanager
def _lock_file(path: Path) -> Iterator[BinaryIO]:
    with _lock_files_guard:
        lock = open(path, "a+b")  # noqa: SIM115 (closed below, under the guard)
        _lock_files.add(lock.fileno())
    try:
        yield lock
    finally:
        with _lock_files_guard:
            _lock_files.discard(lock.fileno())
            lock.close()


def _after_fork_in_child() -> None:
    """The parent's threads do not exist here, so make new ones; close the lock files."""
    global _lock_files_guard
    io_threads.after_fork_in_child()
    for fd in _lock_files:
        with contextlib.suppress(OSError):
            os.close(fd)
    _lock_files.clear()
    _lock_files_guard = threading.Lock()


os.register_at_fork(
    before=lambda: _lock_files_guard.acquire(),
    after_in_parent=lambda: _lock_files_guard.release(),
    after_in_child=_after_fork_in_child,
)


class LocalDirStore(StateStore):
    """A `StateStore` rooted at a local directory. All file work runs in a thread of `io_threads`."""

    def __init__(self, root: str | os.PathLike[str]) -> None:
        self.root = Path(root).absolute()
        self.url = f"{self.root}/"
        self._root_text = str(self.root)
        self._cleanups = Cleanups()
        self._root_normal = f"{os.path.normpath(self._root_text)}/"
        """The root, `..` resolved, ending in `/`: what a folder inside it starts with."""
        self._spreading: set[str] = set()
        """The `procedure/` folders this store has made sure of (and marked, where that helps)."""

    def _in_thread(self, op: str, key: str, fn: Callable[..., T], *args: object) -> Coroutine[Any, Any, T]:
        """`fn(*args)` in a worker thread, any failure raised as a `StoreError` naming `op`
        and `key` (made in the thread). The operations below return this coroutine rather
        than being coroutines themselves: one frame fewer per request on the event loop."""
        return io_threads.run(_errors_named, op, self.url, key, fn, args)

    def _path(self, key: str) -> Path:
        return self.root / key

    def _write(self, key: str, value: bytes, create_only: bool) -> bool:
        # Plain strings and no look before the leap: each system call here is also a turn
        # at the GIL among the pool's threads (a missing folder is made when the temp file
        # cannot be opened; a renamed temp file is not unlinked again).
        target = f"{self._root_text}/{key}"
        folder = target.rpartition("/")[0]
        temp = f"{folder}/{TEMP_PREFIX}{uuid.uuid4().hex}"
        try:
            fd = os.open(temp, _TEMP_FLAGS, 0o644)
        except FileNotFoundError:
            self._make_folder(folder)
            fd = os.open(temp, _TEMP_FLAGS, 0o644)
        temp_left = True
        try:
            try:
                write_all(fd, value)
                os.fsync(fd)
            finally:
                os.close(fd)
            if create_only:
                temp_left = create_exclusively(temp, target)
            else:
                os.replace(temp, target)
                temp_left = False
        except FileExistsError:
            return False
        finally:
            if temp_left:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(temp)
        fsync_dir(folder)
        return True

    def _make_folder(self, folder: str) -> None:
        """`make_dirs`; for a procedure's folder, its parent (`procedure/` inside the root) is
        made first and, once per store, marked to place its subfolders apart where that
        helps (see `placement`). No other folder is ever marked: not the root, the user's."""
        parent = os.path.normpath(folder.rpartition("/")[0])
        if parent not in self._spreading and parent.startswith(self._root_normal) and parent.endswith(_PROCEDURES):
            make_dirs(Path(parent))
            if gains_from_spreading(parent):
                spread_subfolders(parent)
            self._spreading.add(parent)
        make_dirs(Path(folder))

    async def put(self, key: str, value: bytes) -> None:
        await self._in_thread("writing", key, self._write, key, value, False)

    supports_compare_and_swap = True

    def _compare_and_swap(self, key: str, value: bytes, version: str) -> bool:
        target = self._path(key)
        if not target.parent.is_dir():
            return False
        # flock on a sibling file: atomic against every process on this machine.
        with _lock_file(target.parent / f"{LOCK_PREFIX}{target.name}") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            current = self._read(key)
            if current is None or content_version(current) != version:
                return False
            return self._write(key, value, False)

    async def put_if_version(self, key: str, value: bytes, version: str | None) -> bool:
        if version is None:
            return await self.put_if_absent(key, value)
        return await self._in_thread("writing", key, self._compare_and_swap, key, value, version)

    def put_if_absent(self, key: str, value: bytes) -> Coroutine[Any, Any, bool]:
        return self._in_thread("creating", key, self._write, key, value, True)

    def _read(self, key: str) -> bytes | None:
        """The file's bytes; an error for anything but a regular file. Opened without waiting:
        a FIFO (or a link to one) as a value would block every view of the store until a
        writer came, and a device (`/dev/zero`) would be read until memory ran out."""
        path = f"{self._root_text}/{key}"
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
        except (FileNotFoundError, NotADirectoryError):
            return None
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            os.close(fd)
            if stat.S_ISDIR(mode):
                raise IsADirectoryError(errno.EISDIR, "a folder, not a value", path)
            raise OSError(errno.EINVAL, "not a regular file (a FIFO, socket or device): not read", path)
        with open(fd, "rb") as file:
            return file.read()

    async def get(self, key: str) -> bytes | None:
        with store_errors("reading", self.url, key):
            # A key that is not there (a runner's look for an operator request before every
            # attempt, say) is answered by one `stat`, without a thread hop that would cost
            # more than the look; a key that is there is read in a thread, as any read.
            # Only "no such file" means missing: a denied or failed stat (which
            # `os.path.lexists` would also answer False) is an error, never a missing key.
            try:
                os.lstat(f"{self._root_text}/{key}")
            except (FileNotFoundError, NotADirectoryError):
                return None
            return await io_threads.run(self._read, key)

    def _read_many(self, keys: Sequence[str]) -> list[bytes | Exception | None]:
        out: list[bytes | Exception | None] = []
        for key in keys:
            try:
                out.append(self._read(key))
            except Exception as e:  # one unreadable file must not hide the others
                out.append(e)
        return out

    async def get_many(self, keys: Sequence[str]) -> list[bytes | Exception | None]:
        # One thread hop for the whole batch: per-key hops dominate when recovering thousands.
        # Each key's error is in the list; none is raised (no key to name).
        return await io_threads.run(self._read_many, keys)

    def _walk(self, prefix: str) -> list[str]:
        """Every key under the folder `prefix`, sorted.

        The folder asked for is listed or the walk raises: an empty answer would read as
        "nothing stored" (recovery resuming nothing, with no error). Nothing there at all
        is an empty folder. A folder below it that vanished was deleted during the walk;
        any other that cannot be read makes it raise `ListingIncomplete`, which carries
        every key it could list. So does a symbolic link to a folder inside one of the
        store's own folders (a procedure's folder, say; and the folder asked for, if it is
        one): never walked through, since a deletion through it would delete outside the
        store, nor skipped in silence. The store's own folders (`procedure/`, ...) may be
        links, placed for a whole folder; hidden folders are not the store's."""
        base_text = str(self._path(prefix))
        if not os.path.isdir(base_text):
            if os.path.lexists(base_text):  # a file, a dangling link, a loop: not a folder to list
                raise NotADirectoryError(errno.ENOTDIR, "not a folder", base_text)
            if not self.root.is_dir():
                raise FileNotFoundError(f"no such directory: {self.root}")
            return []
        keys: list[str] = []
        root_text = self._root_text
        trash_text = f"{root_text}/{TRASH}"
        unlisted: dict[str, str] = {}
        if _linked_inside_a_folder(root_text, base_text):
            raise ListingIncomplete(
                f"listing {self.url}{prefix}: {_LINKED}", key=prefix, listed={}, unlisted={prefix: _LINKED}
            )

        def failed(error: OSError) -> None:  # `os.walk` skips what it cannot list unless told
            if isinstance(error, FileNotFoundError):
                return  # deleted during the walk
            folder = str(error.filename)
            if os.path.normpath(folder) == os.path.normpath(base_text):
                raise error
            rel = os.path.relpath(folder, root_text).replace(os.sep, "/")
            unlisted[f"{rel}/"] = describe(error)

        # Links are pruned here, one lstat per folder, as `os.walk` itself would do without
        # `followlinks`; unlike it, this names them.
        for dirpath, dirs, files in os.walk(base_text, onerror=failed, followlinks=True):
            if dirpath == trash_text:  # what was moved there; any other folder is listed
                dirs[:] = [name for name in dirs if not _TRASHED.fullmatch(name)]
            rel = dirpath[len(root_text) + 1 :].replace(os.sep, "/")
            linked = [name for name in dirs if dirpath != root_text and os.path.islink(os.path.join(dirpath, name))]
            if linked:
                dirs[:] = [name for name in dirs if name not in linked]
                unlisted.update((f"{rel}/{name}/", _LINKED) for name in linked if not name.startswith("."))
            for name in files:
                if not name.startswith("."):
                    keys.append(f"{rel}/{name}" if rel else name)
        keys.sort()
        if unlisted:
            folders = ", ".join(f"{self.url}{folder} ({why})" for folder, why in sorted(unlisted.items())[:3])
            raise ListingIncomplete(
                f"listing {self.url}{prefix}: {len(unlisted)} folder(s) in it cannot be read: {folders}; "
                "fix their permissions, or replace a link with the folder it points to (nothing in them was read "
                "or deleted)",
                key=prefix,
                listed=dict.fromkeys(keys),
                unlisted=unlisted,
            )
        return keys

    def _walk_modified(self, prefix: str) -> dict[str, float | None]:
        try:
            return self._modified(self._walk(prefix))
        except ListingIncomplete as e:
            e.listed = self._modified(list(e.listed))
            raise

    def _modified(self, keys: list[str]) -> dict[str, float | None]:
        out: dict[str, float | None] = {}
        for key in keys:
            try:
                out[key] = self._path(key).stat().st_mtime
            except FileNotFoundError:
                continue  # deleted since the listing
            except OSError:
                # A link to itself, say: the key's read fails too, and that is that key's
                # problem, never the whole listing's.
                out[key] = None
        return out

    def walk_modified(self, prefix: str) -> Coroutine[Any, Any, dict[str, float | None]]:
        return self._in_thread("listing", prefix, self._walk_modified, prefix)

    def walk(self, prefix: str) -> Coroutine[Any, Any, list[str]]:
        return self._in_thread("listing", prefix, self._walk, prefix)

    def _delete_files(self, keys: Sequence[str], durable: bool = True) -> None:
        folders = set()
        for key in keys:
            path = self._path(key)
            try:
                path.unlink()
            except FileNotFoundError:
                continue
            folders.add(path.parent)
        if durable:
            for folder in folders:
                fsync_dir(folder)

    async def batch_delete(self, keys: Sequence[str]) -> None:
        if not keys:
            return
        await self._in_thread("deleting", keys[0], self._delete_files, keys)

    def _delete_one(self, key: str) -> None:
        if key.endswith("/"):
            self._remove_folder(key)
        else:
            self._delete_files([key])

    def _remove_folder(self, key: str) -> None:
        # Not fsynced: walks list files only, so an empty folder back after a crash is invisible.
        with contextlib.suppress(OSError):  # already gone, or not empty: something else lives there
            self._path(key.rstrip("/")).rmdir()

    def delete(self, key: str) -> Coroutine[Any, Any, None]:
        return self._in_thread("deleting", key, self._delete_one, key)

    def _delete_in_order(self, first: Sequence[str], then: Sequence[str], folder: str) -> Callable[[], None] | None:
        if (trashed := self._move_to_trash([*first, *then], folder)) is not None:
            return self._cleanups.wrap(partial(shutil.rmtree, trashed, ignore_errors=True))
        self._delete_files(first)
        # A `.rollback` below a `.commit` must be durably gone before the `.commit` goes.
        for key in then[:-1]:
            self._delete_files([key])
        self._delete_files(then[-1:], durable=False)
        self._remove_folder(folder)
        return None

    def _move_to_trash(self, keys: Sequence[str], folder: str) -> Path | None:
        """Move `folder` into the trash if it holds exactly `keys` (nothing else, not even a
        temp file of a write under way), then fsync its parent; where it went, or None.

        One rename takes every key out of every listing at once, so no order among them is
        needed, and the wait is one rename and one fsync instead of an unlink per key (70
        µs each on the benchmark machine's ext4, a tenth of a 100-step procedure's time).
        """
        folder = folder.rstrip("/")
        if len(keys) < TRASH_FROM_KEYS or any(key.rpartition("/")[0] != folder for key in keys):
            return None
        names = {key.rpartition("/")[2] for key in keys}
        path = self._path(folder)
        try:
            if set(os.listdir(path)) != names:
                return None  # something else lives there: delete only the keys, in order
            trash = self.root / TRASH
            trash.mkdir(exist_ok=True)
            if trash.is_symlink():
                return None  # not ours to fill: it leads out of the store
            moved = trash / f"{path.name}-{uuid.uuid4().hex}"
            os.rename(path, moved)
        except OSError:
            return None  # the folder, or the trash, cannot be used: delete key by key
        fsync_dir(path.parent)
        return moved

    async def delete_in_order(self, first: Sequence[str], then: Sequence[str], folder: str) -> None:
        """One thread hop. A folder of exactly these keys, `TRASH_FROM_KEYS` or more: a move
        into the trash and one fsync, the folder emptied by the thread after answering.
        Otherwise the keys deleted in order, with one folder fsync: the one that orders
        `first` before `then`."""
        with store_errors("deleting", self.url, (first or then or [folder])[0]):
            await io_threads.run_then_clean_up(self._delete_in_order, first, then, folder)

    def _check(self) -> Callable[[], None] | None:
        if not self.root.exists():
            make_dirs(self.root)
        if not self.root.is_dir():
            raise NotADirectoryError(f"not a directory: {self.root}")
        if not os.access(self.root, os.W_OK):
            raise PermissionError(f"directory is not writable: {self.root}")
        # Folders a killed process moved into the trash and did not empty: emptied after answering.
        return self._cleanups.wrap(self._empty_trash) if (self.root / TRASH).is_dir() else None

    def _empty_trash(self) -> None:
        """Remove what the trash holds (not the trash itself: another process may be moving a
        folder into it). Nothing there is listed or read, so it may go at any time."""
        trash = self.root / TRASH
        with contextlib.suppress(OSError):
            if trash.is_symlink():
                return  # never ours: nothing was moved through it
            for entry in os.scandir(trash):
                if _TRASHED.fullmatch(entry.name) and entry.is_dir(follow_symlinks=False):
                    shutil.rmtree(entry.path, ignore_errors=True)

    async def close(self) -> None:
        """Wait for the trash's emptying that deletions and checks left to the workers."""
        await run_blocking(self._cleanups.wait)

    async def check_access(self) -> None:
        """Create the root directory if needed; raise `StoreUnavailable` if it is unusable."""
        try:
            await io_threads.run_then_clean_up(self._check)
        except OSError as e:
            raise unavailable(self.url, e) from e

    def _leftovers(self, folders: Sequence[str], procedures: str | None, older_than: float, remove: bool) -> Leftovers:
        """`leftovers`; with `procedures` None, temp files and lock files only."""
        cutoff = time.time() - older_than
        found = Leftovers()
        base = None if procedures is None else self._path(procedures)
        # Folder ages before their temp files go: removing one makes its folder look new.
        ages = {d: d.stat().st_mtime for d in base.iterdir() if d.is_dir()} if base and base.is_dir() else {}
        for folder in folders:
            for dirpath, _dirs, files in os.walk(self._path(folder)):
                here = Path(dirpath)
                for name in sorted(files):
                    path, key = here / name, (here / name).relative_to(self.root).as_posix()
                    if name.startswith(TEMP_PREFIX):
                        with contextlib.suppress(FileNotFoundError):
                            old = path.stat().st_mtime < cutoff
                            if old and remove:
                                path.unlink()
                            (found.old_temps if old else found.young_temps).append(key)
                    elif name.startswith(LOCK_PREFIX) and not (here / name[len(LOCK_PREFIX) :]).exists():
                        found.stray_locks.append(key)
        for directory, modified in sorted(ages.items()):
            if ProcedureId.parse_canonical(directory.name) is not None and directory.is_dir() and _is_empty(directory):
                key = f"{directory.relative_to(self.root).as_posix()}/"
                (found.old_empty_folders if modified < cutoff else found.young_empty_folders).append(key)
                if modified < cutoff and remove:
                    self._remove_folder(key)
        return found

    async def leftovers(
        self, folders: Sequence[str], procedures: str, older_than: float = _STALE_TEMP_SECONDS, remove: bool = True
    ) -> Leftovers:
        """Files and folders under `folders` that walks skip, for `procstore gc`: temp files and
        empty procedure folders (under `procedures`) older than `older_than` seconds are
        removed if `remove`; newer ones, and lock files whose key is gone, are only reported."""
        with store_errors("cleaning up", self.url, procedures):
            return await run_blocking(self._leftovers, folders, procedures, older_than, remove)

    async def remove_stale_temps(self, prefix: str, older_than: float = _STALE_TEMP_SECONDS) -> int:
        """Delete temp files a crashed writer left under `prefix`; returns how many.

        Only files older than `older_than` seconds go, so a live writer's temp is never taken.
        """
        leftovers = await self._in_thread(
            "cleaning temp files in", prefix, self._leftovers, [prefix], None, older_than, True
        )
        return len(leftovers.old_temps)


_LINKED = (
    "a symbolic link to a folder: procstore never walks through links (a deletion through one would delete "
    "outside the store); move the folder it points to here in its place"
)


def _linked_inside_a_folder(root: str, folder: str) -> bool:
    """Whether `folder`, or a folder between it and the store's own folder above it, is a
    symbolic link."""
    parts = os.path.relpath(folder, root).split(os.sep)
    return any(os.path.islink(os.path.join(root, *parts[:depth])) for depth in range(2, len(parts) + 1))


def _is_empty(folder: Path) -> bool:
    """Whether `folder` holds nothing; False if it cannot be read (then it is left alone)."""
    try:
        return not any(folder.iterdir())
    except OSError:
        return False


def _errors_named(op: str, url: str, key: str, fn: Callable[..., T], args: tuple[object, ...]) -> T:
    with store_errors(op, url, key):
        return fn(*args)
