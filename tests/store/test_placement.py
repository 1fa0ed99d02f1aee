"""The local store marks `procedure/` to place each procedure's folder apart (ext2/3/4's
`TOPDIR`) on ext4 without a journal, a hint that never fails a write and never marks a
folder but a `procedure/` inside the store.

No test is skipped on a filesystem without the attribute: each says what must happen there."""

from __future__ import annotations

import errno
import fcntl
import os
import struct
import sys
from pathlib import Path

import pytest

from procstore.store import local, placement
from procstore.store.local import LocalDirStore

KEY = "procedure/3f1c2e0a-6a0e-4c1b-9d4e-0d6f0c1b2a3e/0000000000.step"
EXT = {"ext2", "ext3", "ext4"}


def _filesystem(path: Path) -> str:
    """The type of the filesystem holding `path`, from /proc/self/mountinfo ("" if unknown)."""
    try:
        lines = Path("/proc/self/mountinfo").read_text().splitlines()
    except OSError:
        return ""
    real, found, kind = os.path.realpath(path), "", ""
    for line in lines:
        fields, _, after = line.partition(" - ")
        mount = fields.split()[4].replace("\\040", " ")
        if (real == mount or real.startswith(mount.rstrip("/") + "/")) and len(mount) >= len(found):
            found, kind = mount, after.split()[0]
    return kind


def _markable(path: Path) -> bool:
    return sys.platform == "linux" and _filesystem(path) in EXT and placement._GET_FLAGS is not None


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


def test_spread_subfolders_sets_the_attribute_and_keeps_the_others(tmp_path: Path) -> None:
    folder = tmp_path / "procedure"
    folder.mkdir()
    before = _flags(folder)
    assert placement.spread_subfolders(str(folder)) == _markable(tmp_path)
    if _markable(tmp_path):
        assert before is not None and not before & placement._TOPDIR_FL
        assert _flags(folder) == before | placement._TOPDIR_FL
        assert placement.spread_subfolders(str(folder))  # again: already marked, still True
        assert _flags(folder) == before | placement._TOPDIR_FL
    else:
        assert _flags(folder) == before


def test_spread_subfolders_never_raises_and_follows_no_symlink(tmp_path: Path) -> None:
    target = tmp_path / "elsewhere"
    target.mkdir()
    (tmp_path / "link").symlink_to(target)
    assert not placement.spread_subfolders(str(tmp_path / "link"))
    assert not _marked(target)
    assert not placement.spread_subfolders(str(tmp_path / "missing"))
    (tmp_path / "file").write_bytes(b"")
    assert not placement.spread_subfolders(str(tmp_path / "file"))


@pytest.fixture
def marks(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The folders the store asks to mark, on a filesystem taken to gain from it."""
    asked: list[str] = []

    def spread(path: str) -> bool:
        asked.append(os.path.normpath(path))
        return True

    monkeypatch.setattr(local, "gains_from_spreading", lambda path: True)
    monkeypatch.setattr(local, "spread_subfolders", spread)
    return asked


async def test_the_store_marks_the_procedures_folder_and_nothing_else(tmp_path: Path, marks: list[str]) -> None:
    root = tmp_path / "store"
    store = LocalDirStore(root)
    await store.check_access()
    assert await store.put_if_absent(KEY, b"v")
    assert await store.put_if_absent(f"cp/{KEY}", b"v")  # a manager's `parent_path`
    assert await store.put_if_absent(KEY.replace("0000000000", "0000000001"), b"v")  # known now: not asked again
    for key in ["requests/resume/x.json", "a/b/c/d/key", "user1/doc/v", "x/../procedure/y/v"]:
        await store.put(key, b"v")
    assert sorted(marks) == [str(root / "cp" / "procedure"), str(root / "procedure")]  # each once


async def test_a_key_below_a_missing_root_marks_no_folder_of_the_user(tmp_path: Path, marks: list[str]) -> None:
    user = tmp_path / "home"
    user.mkdir()
    store = LocalDirStore(user / "store")  # not made yet: the first write makes it
    await store.put("top-level-key", b"v")
    await store.put("../procedure/y/v", b"v")  # outside the store: written, as before, never marked
    assert await store.put_if_absent(KEY, b"v")
    assert marks == [str(user / "store" / "procedure")]


async def test_with_a_journal_nothing_is_marked(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    asked: list[str] = []
    monkeypatch.setattr(local, "gains_from_spreading", lambda path: False)
    monkeypatch.setattr(local, "spread_subfolders", asked.append)
    store = LocalDirStore(tmp_path / "store")
    await store.check_access()
    assert await store.put_if_absent(KEY, b"v")
    assert asked == []


async def test_the_store_marks_for_real_where_it_gains(tmp_path: Path) -> None:
    store = LocalDirStore(tmp_path / "store")
    await store.check_access()
    assert await store.put_if_absent(KEY, b"v")
    gains = placement.gains_from_spreading(str(tmp_path))
    assert _marked(tmp_path / "store" / "procedure") == gains
    assert not _marked(tmp_path / "store")


def test_gains_from_spreading_only_on_ext4_without_a_journal(tmp_path: Path) -> None:
    assert not placement.gains_from_spreading(str(tmp_path / "missing"))
    if Path("/dev/shm").is_dir():
        assert not placement.gains_from_spreading("/dev/shm")  # tmpfs
    if _filesystem(tmp_path) not in EXT:
        assert not placement.gains_from_spreading(str(tmp_path))


async def test_a_refused_mark_loses_no_write(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(*_: object) -> bytes:
        raise OSError(errno.EOPNOTSUPP, "not supported")

    monkeypatch.setattr(fcntl, "ioctl", refuse)
    monkeypatch.setattr(local, "gains_from_spreading", lambda path: True)
    store = LocalDirStore(tmp_path / "store")
    await store.check_access()
    assert await store.put_if_absent(KEY, b"v")
    assert await store.get(KEY) == b"v"
    assert await store.walk("procedure/") == [KEY]
