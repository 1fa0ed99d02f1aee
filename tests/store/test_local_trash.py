"""The local store's deletion by trash: a procedure folder holding exactly the keys to delete
leaves every listing with one rename (and one fsync), and is emptied after the answer."""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import threading
from pathlib import Path
from typing import Any

import pytest

from procstore.store.local import TRASH, TRASH_FROM_KEYS, LocalDirStore
from tests.procedures import World
from tests.runtime.helpers import steps
from tests.support import StoreTarget, manager_for

STEPS = [f"procedure/a/{i:010d}.step" for i in range(TRASH_FROM_KEYS)]
COMMIT = f"procedure/a/{TRASH_FROM_KEYS:010d}.commit"


async def _stored(tmp_path: Path, *extra: str) -> LocalDirStore:
    store = LocalDirStore(tmp_path)
    await store.check_access()
    for key in [*STEPS, COMMIT, "procedure/b/0000000000.step"]:
        await store.put(key, b"v")
    for name in extra:
        (tmp_path / "procedure" / "a" / name).write_bytes(b"")
    return store


async def _emptied(trash: Path) -> bool:
    for _ in range(500):
        if not os.listdir(trash):
            return True
        await asyncio.sleep(0.01)
    return False


async def test_a_folder_of_exactly_its_keys_goes_to_the_trash_whole(tmp_path: Path) -> None:
    store = await _stored(tmp_path)
    await store.delete_in_order(STEPS, [COMMIT], "procedure/a/")
    assert not (tmp_path / "procedure" / "a").exists()
    # Never listed, even from the root, while it waits to be emptied.
    assert await store.walk("") == ["procedure/b/0000000000.step"]
    assert await _emptied(tmp_path / TRASH)


async def test_a_folder_of_few_keys_is_deleted_key_by_key(tmp_path: Path) -> None:
    """Under `TRASH_FROM_KEYS` keys, the unlinks cost less than the move and its emptying."""
    store = await _stored(tmp_path)
    few = STEPS[: TRASH_FROM_KEYS - 2]
    for key in STEPS[TRASH_FROM_KEYS - 2 :]:
        (tmp_path / key).unlink()
    await store.delete_in_order(few, [COMMIT], "procedure/a/")
    assert await store.walk("procedure/") == ["procedure/b/0000000000.step"]
    assert not (tmp_path / "procedure" / "a").exists()
    assert not (tmp_path / TRASH).exists()


async def test_a_folder_holding_anything_else_is_deleted_key_by_key(tmp_path: Path) -> None:
    """A temp file of a write under way (a paused former leader's), or anything procstore did
    not name: only the keys go, in their order, and the rest stays where it was."""
    store = await _stored(tmp_path, ".tmp-inflight", "notes.txt")
    await store.delete_in_order(STEPS, [COMMIT], "procedure/a/")
    assert sorted(os.listdir(tmp_path / "procedure" / "a")) == [".tmp-inflight", "notes.txt"]
    assert not (tmp_path / TRASH).exists()


async def test_a_trash_left_by_a_killed_process_is_emptied_at_the_next_check(tmp_path: Path) -> None:
    store = await _stored(tmp_path)
    left = tmp_path / TRASH / f"a-{'f' * 32}"  # as named by the move
    left.mkdir(parents=True)
    (left / "0000000000.step").write_bytes(b"v")
    assert await store.walk("") == [*STEPS, COMMIT, "procedure/b/0000000000.step"]
    await store.check_access()
    assert await _emptied(tmp_path / TRASH)
    assert (tmp_path / TRASH).is_dir()  # kept: another process may be moving a folder into it


async def test_a_trash_that_cannot_be_made_falls_back_to_deleting_in_order(tmp_path: Path) -> None:
    store = await _stored(tmp_path)
    (tmp_path / TRASH).write_bytes(b"a file where the trash folder would go")
    await store.delete_in_order(STEPS, [COMMIT], "procedure/a/")
    assert await store.walk("procedure/") == ["procedure/b/0000000000.step"]
    assert not (tmp_path / "procedure" / "a").exists()


async def _trash_emptied_of(path: Path) -> bool:
    for _ in range(500):
        if not path.exists():  # noqa: ASYNC240
            return True
        await asyncio.sleep(0.01)
    return False


async def test_emptying_the_trash_removes_only_what_procstore_moved_there(tmp_path: Path) -> None:
    """A `.trash` the user made (or the keys of a manager whose parent_path is `.trash`):
    a check removes only folders named as procstore names what it moves there."""
    store = LocalDirStore(tmp_path)
    await store.put(".trash/procedure/5b0c3f6e-2d4a-4c8e-9f1a-7e6d5c4b3a21/0000000000.step", b"v")
    (tmp_path / TRASH / "my-notes").mkdir()
    (tmp_path / TRASH / "my-notes" / "todo.md").write_text("mine")
    moved = tmp_path / TRASH / f"a-{'0' * 32}"
    moved.mkdir()
    await store.check_access()
    assert await _trash_emptied_of(moved)
    assert (tmp_path / TRASH / "my-notes" / "todo.md").exists()
    assert await store.walk(".trash/procedure/") == [
        ".trash/procedure/5b0c3f6e-2d4a-4c8e-9f1a-7e6d5c4b3a21/0000000000.step"
    ]


async def test_a_trash_that_is_a_symlink_is_never_used_nor_emptied(tmp_path: Path) -> None:
    elsewhere = tmp_path / "elsewhere"
    (elsewhere / f"photos-{'0' * 32}").mkdir(parents=True)
    (elsewhere / f"photos-{'0' * 32}" / "a.jpg").write_bytes(b"x")
    root = tmp_path / "store"
    store = await _stored(root)
    (root / TRASH).symlink_to(elsewhere)
    await store.check_access()
    await store.delete_in_order(STEPS, [COMMIT], "procedure/a/")
    assert not (root / "procedure" / "a").exists()
    await asyncio.sleep(0.2)
    assert sorted(p.name for p in elsewhere.iterdir()) == [f"photos-{'0' * 32}"]
    assert (elsewhere / f"photos-{'0' * 32}" / "a.jpg").exists()


async def test_walks_skip_only_what_was_moved_into_the_trash(tmp_path: Path) -> None:
    """Keys under other dot folders (a parent_path of `.greptime/`, say) are listed by every
    prefix above them, as before the trash and as on every other backend."""
    store = await _stored(tmp_path)
    await store.put(".greptime/procedure/x/0000000000.step", b"v")
    await store.put("procedure/.b/c", b"v")
    (tmp_path / TRASH / f"a-{'0' * 32}").mkdir(parents=True)
    (tmp_path / TRASH / f"a-{'0' * 32}" / "0000000000.step").write_bytes(b"v")
    everything = await store.walk("")
    assert ".greptime/procedure/x/0000000000.step" in everything
    assert "procedure/.b/c" in await store.walk("procedure/")
    assert not [key for key in everything if key.startswith(TRASH)]


def _slow_rmtree(monkeypatch: pytest.MonkeyPatch, gate: threading.Event) -> None:
    """Every `shutil.rmtree` (the trash's emptying) waits for `gate` first."""
    real = shutil.rmtree

    def rmtree(path: str | os.PathLike[str], *args: Any, **kwargs: Any) -> None:
        gate.wait(5)
        real(path, *args, **kwargs)

    monkeypatch.setattr(shutil, "rmtree", rmtree)


async def test_close_waits_until_the_trash_is_emptied(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Nothing in the store's folder changes once it is closed (a manager's stop() closes
    the store it opened): a caller may then copy or remove the folder."""
    store = await _stored(tmp_path)
    gate = threading.Event()
    _slow_rmtree(monkeypatch, gate)
    await store.delete_in_order(STEPS, [COMMIT], "procedure/a/")
    threading.Timer(0.2, gate.set).start()
    await store.close()
    assert list((tmp_path / TRASH).iterdir()) == []


async def test_a_manager_leaves_nothing_changing_once_stopped(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    gate = threading.Event()
    _slow_rmtree(monkeypatch, gate)
    world = World.new()
    async with manager_for(StoreTarget("local", str(tmp_path))) as manager:
        await (await manager.submit(steps(world, TRASH_FROM_KEYS))).wait()
        threading.Timer(0.2, gate.set).start()
    assert list((tmp_path / TRASH).iterdir()) == []


def test_a_forked_child_does_not_wait_for_its_parents_cleanups(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    gate = threading.Event()
    _slow_rmtree(monkeypatch, gate)
    store = asyncio.run(_stored(tmp_path))
    asyncio.run(store.delete_in_order(STEPS, [COMMIT], "procedure/a/"))  # its cleanup waits at the gate
    pid = os.fork()
    if pid == 0:  # the child: no thread will ever finish the parent's cleanup
        signal.signal(signal.SIGALRM, signal.SIG_DFL)
        signal.alarm(3)  # a close() that waits for it forever ends the child by SIGALRM
        try:
            asyncio.run(store.close())
            os._exit(0)
        except BaseException:
            os._exit(1)
    _, status = os.waitpid(pid, 0)
    gate.set()
    asyncio.run(store.close())
    assert os.waitstatus_to_exitcode(status) == 0
