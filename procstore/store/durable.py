"""Durable file operations of the local store: a crash leaves a file whole or absent, and
a folder made, renamed or emptied is so on disk before the call returns."""

from __future__ import annotations

import ctypes
import errno
import os
from collections.abc import Callable
from pathlib import Path


def fsync_dir(path: str | Path) -> None:
    """fsync a folder: the names made, renamed or removed in it are on disk."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _load_renameat2() -> Callable[[str | Path, str | Path], int] | None:
    """glibc's `renameat2`, if there is one: a rename that fails if the target exists."""
    try:
        function = ctypes.CDLL(None, use_errno=True).renameat2
    except (AttributeError, OSError):
        return None
    function.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
    function.restype = ctypes.c_int
    return lambda src, dst: int(function(_AT_FDCWD, os.fsencode(src), _AT_FDCWD, os.fsencode(dst), _RENAME_NOREPLACE))


_AT_FDCWD = -100
_RENAME_NOREPLACE = 1
_renameat2 = _load_renameat2()


def create_exclusively(temp: str | Path, target: str | Path) -> bool:
    """Move `temp` to `target` only if `target` does not exist (`FileExistsError` if it does);
    returns whether `temp` is still there.

    The OS picks exactly one winner among concurrent writers. `renameat2(RENAME_NOREPLACE)`
    does it in one step; where the kernel or filesystem lacks it, a hard link does (and the
    temp file is then unlinked by the caller: one more metadata write).
    """
    global _renameat2
    if _renameat2 is not None:
        if _renameat2(temp, target) == 0:
            return False
        err = ctypes.get_errno()
        if err == errno.EEXIST:
            raise FileExistsError(errno.EEXIST, "exists", str(target))
        if err not in (errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP):
            raise OSError(err, os.strerror(err), str(target))
        _renameat2 = None  # this filesystem cannot: use links from now on
    os.link(temp, target)
    return True


def make_dirs(path: Path) -> None:
    """Create `path` and its missing parents, fsyncing each parent so the folders survive a crash."""
    missing: list[Path] = []
    probe = path
    while not probe.exists():
        missing.append(probe)
        probe = probe.parent
    for folder in reversed(missing):
        try:
            folder.mkdir()
        except FileExistsError:
            continue
        fsync_dir(folder.parent)


def write_all(fd: int, value: bytes) -> None:
    """`os.write` until every byte of `value` is written."""
    view = memoryview(value)
    while view:
        written = os.write(fd, view)
        view = view[written:]
