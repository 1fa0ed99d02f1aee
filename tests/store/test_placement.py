"""The local store marks `procedure/` to place each procedure's folder apart (ext2/3/4's
`TOPDIR`) on ext4 without a journal, a hint that never fails a write and never marks a
folder but a `procedure/` inside the store."""

from __future__ import annotations

import errno
import fcntl
import os
import struct
from pathlib import Path

import pytest

from procstore.store import local, placement
from procstore.store.local import LocalDirStore

KEY = "procedure/3f1c2e0a-6a0e-4c1b-9d4e-0d6f0c1b2a3e/0000000000.step"


def _flags(path: Path) -> int | None:
    """The folder's attribute flags, or None where the filesystem has none."""
    if placement._GET_FLAGS is None:
        return None
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        (flags,) = struct.unpack("i", fcntl.ioctl(fd, placement._GET_FLAGS, bytes(4)))
        return int(flags)
    except OSError:
        return None
    finally:
        os.close(fd)


def _marked(path: Path) -> bool:
    return bool((_flags(path) or 0) & placement._TOPDIR_FL)


@pytest.fixture
def markable(tmp_path: Path) -> Path:
    probe = tmp_path / "probe"
    probe.mkdir()
    if not placement.spread_subfolders(str(probe)):
        pytest.skip("this filesystem has no TOPDIR attribute (not ext2/3/4, or not Linux)")
    return tmp_path


@pytest.fixture
def gains(markable: Path) -> Path:
    if not placement.gains_from_spreading(str(markable)):
        pytest.skip("not ext4 without a journal: the store marks nothing here")
    return markable


def test_spread_subfolders_sets_the_attribute_and_keeps_the_others(markable: Path) -> None:
    folder = markable / "procedure"
    folder.mkdir()
    before = _flags(folder)
    assert before is not None and not before & placement._TOPDIR_FL
    assert placement.spread_subfolders(str(folder))
    assert _flags(folder) == before | placement._TOPDIR_FL
    assert placement.spread_subfolders(str(folder))  # again: already marked, still True
    assert _flags(folder) == before | placement._TOPDIR_FL


def test_spread_subfolders_never_raises_and_follows_no_symlink(markable: Path) -> None:
    target = markable / "elsewhere"
    target.mkdir()
    (markable / "link").symlink_to(target)
    assert not placement.spread_subfolders(str(markable / "link"))
    assert not _marked(target)
    assert not placement.spread_subfolders(str(markable / "missing"))
    (markable / "file").write_bytes(b"")
    assert not placement.spread_subfolders(str(markable / "file"))


async def test_the_store_marks_the_procedures_folder_and_nothing_else(gains: Path) -> None:
    root = gains / "store"
    store = LocalDirStore(root)
    await store.check_access()
    assert await store.put_if_absent(KEY, b"v")
    assert await store.put_if_absent(f"cp/{KEY}", b"v")  # a manager's `parent_path`
    assert _marked(root / "procedure")
    assert _marked(root / "cp" / "procedure")
    for key in ["requests/resume/x.json", "a/b/c/d/key", "user1/doc/v", "x/../procedure/y/v"]:
        await store.put(key, b"v")
    marked = [p for p in [root, *root.rglob("*")] if p.is_dir() and _marked(p)]
    assert sorted(marked) == [root / "cp" / "procedure", root / "procedure"]


async def test_a_key_below_a_missing_root_marks_no_folder_of_the_user(gains: Path) -> None:
    user = gains / "home"
    user.mkdir()
    store = LocalDirStore(user / "store")  # not made yet: the first write makes it
    await store.put("top-level-key", b"v")
    await store.put("../procedure/y/v", b"v")  # outside the store: written, as before, never marked
    assert await store.put_if_absent(KEY, b"v")
    assert not _marked(user)
    assert not _marked(user / "procedure")
    assert not _marked(user / "store")
    assert _marked(user / "store" / "procedure")


async def test_with_a_journal_nothing_is_marked(markable: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(local, "gains_from_spreading", lambda path: False)
    store = LocalDirStore(markable / "store")
    await store.check_access()
    assert await store.put_if_absent(KEY, b"v")
    assert not _marked(markable / "store" / "procedure")


def test_gains_from_spreading_only_on_ext4_without_a_journal(tmp_path: Path) -> None:
    assert not placement.gains_from_spreading(str(tmp_path / "missing"))
    if Path("/dev/shm").is_dir():
        assert not placement.gains_from_spreading("/dev/shm")  # tmpfs


async def test_a_refused_mark_loses_no_write(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(*_: object) -> bytes:
        raise OSError(errno.EOPNOTSUPP, "not supported")

    monkeypatch.setattr(fcntl, "ioctl", refuse)
    store = LocalDirStore(tmp_path / "store")
    await store.check_access()
    assert await store.put_if_absent(KEY, b"v")
    assert await store.get(KEY) == b"v"
    assert await store.walk("procedure/") == [KEY]
