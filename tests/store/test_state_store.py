"""The key-value backends, against real stores: memory://, a local directory, S3 (moto), GCS (emulator)."""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path
from typing import Any

import pytest

from procstore import ListingIncomplete, StoreError, StoreUnavailable
from procstore.store import open_state_store
from procstore.store.fsspec_store import BucketStore, FsspecStore
from procstore.store.gcs import GcsStore
from procstore.store.local import LocalDirStore
from procstore.store.memory import MemoryStore
from procstore.store.s3 import S3Store
from procstore.store.state_store import StateStore
from tests.conftest import s3_options
from tests.support import StoreTarget, store_targets

any_target = store_targets("memory", "local", "s3", "gcs", "wrapped")


async def test_put_get_walk_delete(any_target: StoreTarget) -> None:
    store = open_state_store(any_target.url, any_target.storage_options)
    try:
        await store.check_access()
        assert await store.get("procedure/a/0000000000.step") is None
        await store.put("procedure/a/0000000000.step", b"zero")
        await store.put("procedure/a/0000000001.step", b"one")
        await store.put("procedure/b/0000000000.commit", b"")
        await store.put("other/x", b"x")
        assert await store.get("procedure/a/0000000001.step") == b"one"
        assert await store.get("procedure/b/0000000000.commit") == b""
        assert await store.walk("procedure/") == [
            "procedure/a/0000000000.step",
            "procedure/a/0000000001.step",
            "procedure/b/0000000000.commit",
        ]
        assert await store.walk("procedure/a/") == ["procedure/a/0000000000.step", "procedure/a/0000000001.step"]
        assert await store.walk("nothing/") == []
        values = await store.get_many(["procedure/a/0000000000.step", "procedure/zz/0000000000.step"])
        assert values == [b"zero", None]

        await store.put("procedure/a/0000000001.step", b"replaced")
        assert await store.get("procedure/a/0000000001.step") == b"replaced"

        await store.batch_delete(["procedure/a/0000000000.step", "procedure/a/0000000001.step", "missing/k"])
        await store.delete("procedure/a/")
        await store.delete("procedure/b/0000000000.commit")
        await store.delete("procedure/b/0000000000.commit")  # deleting twice is fine
        assert await store.walk("procedure/") == []
        assert await store.walk("") == ["other/x"]
    finally:
        await store.close()


async def test_delete_in_order_removes_keys_and_folder(any_target: StoreTarget) -> None:
    store = open_state_store(any_target.url, any_target.storage_options)
    try:
        await store.check_access()
        steps = [f"procedure/a/{i:010d}.step" for i in range(3)]
        for key in [*steps, "procedure/a/0000000003.commit", "procedure/b/0000000000.step"]:
            await store.put(key, b"v")
        await store.delete_in_order(steps, ["procedure/a/0000000003.commit", "procedure/a/missing"], "procedure/a/")
        assert await store.walk("procedure/") == ["procedure/b/0000000000.step"]
        if isinstance(store, LocalDirStore):
            assert not (store.root / "procedure" / "a").exists()
    finally:
        await store.close()


async def test_walk_modified_lists_keys_with_their_times(any_target: StoreTarget) -> None:
    store = open_state_store(any_target.url, any_target.storage_options)
    try:
        await store.check_access()
        for key in ("procedure/a/0000000000.step", "procedure/a/0000000001.commit", "other/x"):
            await store.put(key, b"v")
        found = await store.walk_modified("procedure/")
        assert list(found) == await store.walk("procedure/")
        first, second = found.values()
        # Seconds since the epoch (not ms or ns: 2020 to 2096), in the order of the writes.
        assert first is not None and second is not None and 1.6e9 < first <= second < 4e9, found
    finally:
        await store.close()


async def test_put_if_absent_creates_once(any_target: StoreTarget) -> None:
    store = open_state_store(any_target.url, any_target.storage_options)
    try:
        # Atomic where the store says so; fsspec's local create behind a wrapper is
        # check-then-write, and says it is not (lease mode refuses such a store).
        assert store.supports_create_only == (any_target.kind != "wrapped")
        assert await store.put_if_absent("procedure/p/0000000000.step", b"first")
        assert not await store.put_if_absent("procedure/p/0000000000.step", b"second")
        assert await store.get("procedure/p/0000000000.step") == b"first"
    finally:
        await store.close()


async def test_listing_sees_keys_written_by_another_client(s3_target: StoreTarget) -> None:
    """fsspec caches listings forever; a recovery scan must see what other writers added."""
    mine = open_state_store(s3_target.url, s3_target.storage_options)
    other = open_state_store(s3_target.url, s3_target.storage_options)
    try:
        await mine.put("procedure/a/0000000000.step", b"a")
        assert await mine.walk("procedure/") == ["procedure/a/0000000000.step"]
        await other.put("procedure/b/0000000000.step", b"b")
        assert await mine.walk("procedure/") == ["procedure/a/0000000000.step", "procedure/b/0000000000.step"]
        await other.batch_delete(["procedure/a/0000000000.step"])
        assert await mine.walk("procedure/") == ["procedure/b/0000000000.step"]
    finally:
        await mine.close()
        await other.close()


bucket_target = store_targets("s3", "gcs")


def count_requests(store: BucketStore, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The requests `store` sends from now on, "list" for a page of a listing."""
    sent: list[str] = []
    name = "_call_s3" if isinstance(store, S3Store) else "_call"
    real = getattr(store.fs, name)

    async def counted(method: str, *args: object, **kwargs: object) -> object:
        listing = method == "list_objects_v2" or (method == "GET" and args[:1] == ("b/{}/o",))
        sent.append("list" if listing else method)
        return await real(method, *args, **kwargs)

    monkeypatch.setattr(store.fs, name, counted)
    return sent


async def test_a_bucket_listing_is_the_services_pages_and_nothing_else(
    bucket_target: StoreTarget, monkeypatch: pytest.MonkeyPatch
) -> None:
    """s3fs's and gcsfs's `find` answer an empty prefix with more requests (a HeadObject and
    a second listing on S3; a second listing on GCS), and on S3 the answer could name a
    folder if a key appeared in between. A walk is listing pages only, keys with any
    character come back as written, and a folder's placeholder object is not a key."""
    store = open_state_store(bucket_target.url, bucket_target.storage_options)
    assert isinstance(store, BucketStore)
    try:
        await store.check_access()
        odd = ["requests/a b+c%20d.json", "requests/ü/é.json", "requests/x&y=z?.json"]
        for key in [*odd, "requests/resume/1.json", "requests2/no.json", "requests/folder/"]:
            await store.put(key, b"v")
        sent = count_requests(store, monkeypatch)
        monkeypatch.setattr(store, "list_page_size", 2)
        expected = sorted([*odd, "requests/resume/1.json"])
        assert await store.walk("requests/") == expected
        # Four keys and the placeholder, two a page (the GCS emulator answers in one page).
        assert sent == ["list"] * (3 if isinstance(store, S3Store) else 1), sent
        assert list(await store.walk_modified("requests/")) == expected
        assert all(isinstance(t, float) for t in (await store.walk_modified("requests/")).values())
        sent.clear()
        assert await store.walk("nothing/") == []
        assert sent == ["list"]
    finally:
        await store.close()


async def test_a_gcs_listing_follows_its_page_tokens(gcs_target: StoreTarget, monkeypatch: pytest.MonkeyPatch) -> None:
    """The emulator answers in one page whatever the size asked; GCS pages by `nextPageToken`."""
    store = open_state_store(gcs_target.url, gcs_target.storage_options)
    assert isinstance(store, GcsStore)
    pages = {
        None: {"items": [{"name": "cp/procedure/a/0000000000.step", "updated": "2026-01-02T03:04:05.5Z"}],
               "nextPageToken": "t1"},
        "t1": {"items": [{"name": "cp/procedure/b/0000000000.step"}]},
    }  # fmt: skip
    asked: list[tuple[object, object]] = []

    async def paged(method: str, path: str, *args: object, **kwargs: object) -> object:
        asked.append((kwargs.get("prefix"), kwargs.get("pageToken")))
        return pages[kwargs.get("pageToken")]  # type: ignore[index]

    monkeypatch.setattr(store.fs, "_call", paged)
    try:
        assert await store.walk_modified("procedure/") == {
            "procedure/a/0000000000.step": 1767323045.5,
            "procedure/b/0000000000.step": None,
        }
        assert asked == [("cp/procedure/", None), ("cp/procedure/", "t1")]
    finally:
        await store.close()


async def test_an_s3_listing_cut_short_raises(s3_target: StoreTarget, monkeypatch: pytest.MonkeyPatch) -> None:
    """A page that says more keys follow but gives no token to ask for them (a server that
    only speaks ListObjects v1, a proxy) is an error, never the whole listing: recovery
    would silently leave the procedures of the later pages unresumed."""
    store = open_state_store(s3_target.url, s3_target.storage_options)
    assert isinstance(store, S3Store)
    try:
        for i in range(3):
            await store.put(f"procedure/a/{i:010d}.step", b"v")
        real_call = store.fs._call_s3

        async def no_token(method: str, *args: object, **kwargs: object) -> object:
            out = await real_call(method, *args, **kwargs)
            if method == "list_objects_v2":
                out.pop("NextContinuationToken", None)
            return out

        monkeypatch.setattr(store.fs, "_call_s3", no_token)
        monkeypatch.setattr(store, "list_page_size", 2)
        with pytest.raises(StoreError, match="truncated page without a continuation token after 2 keys"):
            await store.walk("procedure/")
    finally:
        await store.close()


@pytest.mark.parametrize("answer", ["a token on the last page", "the same token again"])
async def test_an_s3_listing_ends_at_the_last_page_and_never_loops(
    s3_target: StoreTarget, monkeypatch: pytest.MonkeyPatch, answer: str
) -> None:
    store = open_state_store(s3_target.url, s3_target.storage_options)
    assert isinstance(store, S3Store)
    sent: list[object] = []

    async def pages(method: str, **kwargs: object) -> object:
        sent.append(kwargs.get("ContinuationToken"))
        last = answer == "a token on the last page"
        return {
            "Contents": [{"Key": "cp/procedure/a/0000000000.step"}],
            "IsTruncated": not last,
            "NextContinuationToken": "t",
        }

    monkeypatch.setattr(store.fs, "_call_s3", pages)
    try:
        if answer == "a token on the last page":
            assert await store.walk("procedure/") == ["procedure/a/0000000000.step"]
            assert sent == [None]
        else:
            with pytest.raises(StoreError, match="the same continuation token twice"):
                await store.walk("procedure/")
            assert sent == [None, "t"]
    finally:
        await store.close()


async def test_a_bucket_listing_of_a_missing_bucket_raises(bucket_target: StoreTarget) -> None:
    """Never an empty answer: that would read as "nothing stored" (recovery, a deletion's check)."""
    scheme, rest = bucket_target.url.split("://", 1)
    store = open_state_store(f"{scheme}://procstore-no-such-bucket-{rest}", bucket_target.storage_options)
    try:
        with pytest.raises(StoreError, match="listing"):
            await store.walk("procedure/")
    finally:
        await store.close()


async def test_local_writes_leave_no_temp_files_and_are_atomic(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    store = LocalDirStore(tmp_path)
    await store.put("procedure/p/0000000000.step", b"good")

    def failing_replace(src: str, dst: str) -> None:
        raise OSError(5, "simulated I/O error during rename")

    monkeypatch.setattr(os, "replace", failing_replace)
    with pytest.raises(StoreError, match="0000000000.step"):
        await store.put("procedure/p/0000000000.step", b"new value that never lands")
    monkeypatch.undo()
    assert await store.get("procedure/p/0000000000.step") == b"good"
    assert sorted(p.name for p in (tmp_path / "procedure" / "p").iterdir()) == ["0000000000.step"]


async def test_local_temp_files_are_invisible_and_swept(tmp_path: Path) -> None:
    store = LocalDirStore(tmp_path)
    await store.put("procedure/p/0000000000.step", b"x")
    stale = tmp_path / "procedure" / "p" / ".tmp-deadbeef"
    stale.write_bytes(b"half a wri")
    os.utime(stale, (0, 0))
    assert await store.walk("procedure/") == ["procedure/p/0000000000.step"]
    assert await store.remove_stale_temps("procedure/") == 1
    assert not stale.exists()


async def test_local_denied_write_names_the_key(tmp_path: Path) -> None:
    if os.geteuid() == 0:
        # root ignores directory permissions; simulate the denial at the OS call instead.
        store: StateStore = LocalDirStore(tmp_path / "ro")
        (tmp_path / "ro").write_text("a file where the directory should be")
        with pytest.raises(StoreError, match="procedure/p/0000000000.step"):
            await store.put("procedure/p/0000000000.step", b"x")
        return
    (tmp_path / "ro").mkdir(mode=0o500)
    store = LocalDirStore(tmp_path / "ro")
    with pytest.raises(StoreError, match="denied"):
        await store.put("procedure/p/0000000000.step", b"x")


async def test_missing_bucket_is_unavailable(moto_endpoint: str) -> None:
    store = open_state_store("s3://no-such-bucket-here/cp/", s3_options(moto_endpoint))
    try:
        with pytest.raises(StoreUnavailable, match="no-such-bucket-here.*does not exist"):
            await store.check_access()
    finally:
        await store.close()


def test_unknown_protocol_is_unavailable() -> None:
    with pytest.raises(StoreUnavailable, match="nope://x/"):
        open_state_store("nope://x/")


async def test_local_root_is_created(tmp_path: Path) -> None:
    store = open_state_store(f"file://{tmp_path}/a/b")
    await store.check_access()
    assert (tmp_path / "a" / "b").is_dir()


async def test_local_root_that_is_a_file_is_unavailable(tmp_path: Path) -> None:
    (tmp_path / "f").write_text("x")
    with pytest.raises(StoreUnavailable, match="f/"):
        await open_state_store(tmp_path / "f").check_access()


async def test_compare_and_swap(any_target: StoreTarget) -> None:
    store = open_state_store(any_target.url, any_target.storage_options)
    try:
        assert await store.get_versioned("current") is None
        assert not await store.put_if_version("current", b"v0", "no-such-version")
        assert await store.put_if_version("current", b"v1", None)
        assert not await store.put_if_version("current", b"v1-again", None)
        value, version = await store.get_versioned("current") or (b"", "")
        assert value == b"v1"
        assert await store.put_if_version("current", b"v2", version)
        assert not await store.put_if_version("current", b"v3", version)  # stale: someone moved it
        value, version2 = await store.get_versioned("current") or (b"", "")
        assert value == b"v2" and version2 != version
        assert await store.walk("") == ["current"]  # no lock or temp files show
    finally:
        await store.close()


async def test_compare_and_swap_has_one_winner(any_target: StoreTarget) -> None:
    store = open_state_store(any_target.url, any_target.storage_options)
    try:
        await store.put("counter", b"0")
        _, version = await store.get_versioned("counter") or (b"", "")
        results = await asyncio.gather(
            *(store.put_if_version("counter", f"{i + 1}".encode(), version) for i in range(8))
        )
        assert results.count(True) == 1
        assert await store.get("counter") == f"{results.index(True) + 1}".encode()
    finally:
        await store.close()


@pytest.mark.parametrize("with_renameat2", [True, False])
async def test_local_create_only_has_one_winner(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, with_renameat2: bool
) -> None:
    import procstore.store.durable as durable

    if not with_renameat2:
        monkeypatch.setattr(durable, "_renameat2", None)  # the hard-link fallback
    store = LocalDirStore(tmp_path)
    results = await asyncio.gather(*(store.put_if_absent("procedure/a/0000000000.step", b"v%d" % i) for i in range(8)))
    assert results.count(True) == 1
    assert await store.get("procedure/a/0000000000.step") == b"v%d" % results.index(True)
    assert [p.name for p in (tmp_path / "procedure" / "a").iterdir()] == ["0000000000.step"]  # no temp left


async def test_each_url_opens_the_backend_that_knows_its_conditional_writes(
    s3_target: StoreTarget, gcs_target: StoreTarget, tmp_path: Path
) -> None:
    cases = [
        (s3_target.url, s3_target.storage_options, S3Store),
        (gcs_target.url, gcs_target.storage_options, GcsStore),
        (str(tmp_path), None, LocalDirStore),
        ("memory://procstore-kinds/", None, MemoryStore),
        # A blocking client asked for in the options: the generic store, no S3 specifics.
        (s3_target.url, {**s3_target.storage_options, "asynchronous": False}, FsspecStore),
    ]
    for url, options, kind in cases:
        store = open_state_store(url, options)
        assert type(store) is kind, (url, options)
        await store.close()


async def test_a_local_read_that_is_denied_is_an_error_not_a_missing_key(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A runner's look for an operator request must not read "no request" when the look
    itself failed (a folder without search permission, an I/O error)."""

    store = LocalDirStore(str(tmp_path))
    await store.put("requests/x.json", b"{}")
    real = os.lstat

    def denied(path: str, *args: object, **kwargs: object) -> os.stat_result:
        if str(path).endswith("requests/x.json"):
            raise PermissionError(13, "Permission denied", path)
        return real(path)

    monkeypatch.setattr(os, "lstat", denied)
    with pytest.raises(StoreError, match="requests/x.json"):
        await store.get("requests/x.json")
    assert await store.get("requests/missing.json") is None


async def test_a_local_listing_that_cannot_be_read_is_an_error_not_an_empty_store(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`os.walk` skips what it cannot list: recovery would have resumed nothing, or left a
    parent out and deleted its committed child, with no error. The folder asked for raises
    naming it (anything there that is not a folder too); a folder below it that cannot be
    read raises `ListingIncomplete`, which carries the rest; one deleted meanwhile is nothing."""
    store = LocalDirStore(str(tmp_path))
    for key in ("procedure/a/0000000000.step", "procedure/b/0000000000.step", "procedure/c/0000000000.step"):
        await store.put(key, b"x")
    real = os.scandir
    denied: set[str] = set()
    vanished: set[str] = set()

    def scandir(path: str) -> Any:
        if path in denied:
            raise PermissionError(13, "Permission denied", path)
        if path in vanished:
            raise FileNotFoundError(2, "No such file or directory", path)
        return real(path)

    monkeypatch.setattr(os, "scandir", scandir)
    denied.add(str(tmp_path / "procedure"))
    with pytest.raises(StoreError, match="listing .*procedure/.*Permission denied") as raised:
        await store.walk("procedure/")
    assert not isinstance(raised.value, ListingIncomplete)
    with pytest.raises(ListingIncomplete) as incomplete:
        await store.walk("")
    assert incomplete.value.unlisted == {
        "procedure/": "PermissionError: [Errno 13] Permission denied: " + repr(str(tmp_path / "procedure"))
    }
    denied.clear()
    denied.add(str(tmp_path / "procedure" / "b"))
    vanished.add(str(tmp_path / "procedure" / "c"))
    with pytest.raises(ListingIncomplete, match="procedure/b/.*fix their permissions") as incomplete:
        await store.walk("procedure/")
    assert list(incomplete.value.listed) == ["procedure/a/0000000000.step"]
    assert list(incomplete.value.unlisted) == ["procedure/b/"]
    with pytest.raises(ListingIncomplete) as incomplete:
        await store.walk_modified("procedure/")
    assert isinstance(incomplete.value.listed["procedure/a/0000000000.step"], float)
    vanished.add(str(tmp_path / "procedure"))  # deleted between the look and the listing
    assert await store.walk("procedure/") == []


@pytest.mark.parametrize("what", ["file", "dangling link", "link loop"])
async def test_a_local_listing_of_something_that_is_not_a_folder_raises(tmp_path: Path, what: str) -> None:
    """An unmounted disk's dangling link at `procedure/` must not list as an empty store."""
    store = LocalDirStore(str(tmp_path))
    await store.check_access()
    target = tmp_path / "procedure"
    if what == "file":
        target.write_bytes(b"")
    elif what == "dangling link":
        target.symlink_to(tmp_path / "unmounted")
    else:
        target.symlink_to(target)
    with pytest.raises(StoreError, match="listing .*procedure/.*not a folder"):
        await store.walk("procedure/")
    assert await store.walk("nothing/") == []


async def test_an_s3_read_in_a_missing_bucket_is_an_error_not_a_missing_key(moto_endpoint: str) -> None:
    store = open_state_store("s3://no-such-bucket-for-procstore/cp/", s3_options(moto_endpoint))
    try:
        with pytest.raises(StoreError, match="requests/x.json"):
            await store.get("requests/x.json")
    finally:
        await store.close()


def test_a_child_forked_while_a_compare_and_swap_holds_its_lock_can_swap_too(tmp_path: Path) -> None:
    """flock locks belong to the open file, which a forked child shares: the child closes
    its copies, or its own compare-and-swap on the key would wait for ever."""
    import threading

    from procstore.store.local import _lock_file

    key = "lease/procedures.json"
    asyncio.run(LocalDirStore(str(tmp_path)).put(key, b"v0"))
    held, release = threading.Event(), threading.Event()

    def hold() -> None:
        import fcntl

        with _lock_file(tmp_path / "lease" / ".lock-procedures.json") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            held.set()
            release.wait(30)

    holder = threading.Thread(target=hold)
    holder.start()
    held.wait(10)
    pid = os.fork()
    if pid == 0:  # the child: the parent's thread never releases here
        code = 1
        try:
            store = LocalDirStore(str(tmp_path))

            async def swap() -> bool:
                current = await store.get(key)
                assert current is not None
                from procstore.store.state_store import content_version

                return await asyncio.wait_for(store.put_if_version(key, b"child", content_version(current)), 5)

            code = 0 if asyncio.run(swap()) else 2
        finally:
            os._exit(code)
    time.sleep(0.2)
    release.set()  # the parent's holder lets go soon after the fork, as a real swap does
    holder.join(10)
    deadline = time.monotonic() + 20
    while (done := os.waitpid(pid, os.WNOHANG))[0] == 0 and time.monotonic() < deadline:
        time.sleep(0.05)
    if done[0] == 0:
        os.kill(pid, 9)
        os.waitpid(pid, 0)
        raise AssertionError("the child's compare-and-swap waited for a lock nobody would release")
    assert os.waitstatus_to_exitcode(done[1]) == 0


async def test_a_folder_left_out_is_warned_about_once_while_it_stays_so(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """The watch lists `requests/` every second: one warning per folder, and a new one if the
    folder comes back unreadable after it was read again (a second episode, not silence)."""
    from procstore.store.state_store import walk_readable

    store = LocalDirStore(str(tmp_path))
    await store.put("requests/resume/x.json", b"{}")
    await store.put("requests/y.json", b"{}")
    real, denied = os.scandir, {str(tmp_path / "requests" / "resume")}

    def scandir(path: str) -> Any:
        if path in denied:
            raise PermissionError(13, "Permission denied", path)
        return real(path)

    monkeypatch.setattr(os, "scandir", scandir)

    def warned() -> int:
        return sum("cannot list" in r.getMessage() and "requests/resume/" in r.getMessage() for r in caplog.records)

    for _ in range(3):
        assert await walk_readable(store, "requests/") == ["requests/y.json"]
    assert warned() == 1
    denied.clear()
    assert await walk_readable(store, "requests/") == ["requests/resume/x.json", "requests/y.json"]
    denied.add(str(tmp_path / "requests" / "resume"))
    assert await walk_readable(store, "requests/") == ["requests/y.json"]
    assert warned() == 2
