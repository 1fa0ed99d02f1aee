"""`ProcedureStore`: steps, commit, rollback, deletion order and the latest-step loading rule."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from pathlib import Path
from unittest.mock import patch

import pytest
from hypothesis import given
from hypothesis import strategies as st

from procstore import ProcedureId
from procstore.store import ProcedureMessage
from procstore.store.keys import KeyType, latest_in_sorted
from procstore.store.local import LocalDirStore
from procstore.store.procedure_store import ProcedureStore
from procstore.testing import FaultyStore


def make_store(tmp_path: Path) -> tuple[ProcedureStore, FaultyStore]:
    recorder = FaultyStore(LocalDirStore(tmp_path))
    return ProcedureStore(recorder, "data/"), recorder


async def test_store_commit_and_load(tmp_path: Path) -> None:
    store, _ = make_store(tmp_path)
    a, b, c = ProcedureId.random(), ProcedureId.random(), ProcedureId.random()
    for step in range(3):
        await store.store_procedure(a, step, "T", f"a-{step}", None)
    await store.store_procedure(b, 0, "T", "b-0", None)
    await store.store_procedure(b, 1, "T", "b-1", None)
    await store.commit_procedure(b, 2)
    await store.store_procedure(c, 0, "T", "c-0", a)
    loaded = await store.load_messages()
    assert loaded.messages == {
        a: ProcedureMessage("T", "a-2", None, 2),
        c: ProcedureMessage("T", "c-0", a, 0),
    }
    assert loaded.finished_ids == [b]
    assert loaded.finished_messages[b] == ProcedureMessage("T", "b-1", None, 1)
    assert loaded.rollback_messages == {}
    assert loaded.problems == []
    assert (tmp_path / "data" / "procedure" / str(b) / "0000000002.commit").read_bytes() == b""


async def test_rollback_key_holds_the_error(tmp_path: Path) -> None:
    store, _ = make_store(tmp_path)
    pid = ProcedureId.random()
    await store.store_procedure(pid, 0, "T", "d", None)
    await store.rollback_procedure(pid, ProcedureMessage("T", "d", None, 1, "boom"))
    loaded = await store.load_messages()
    assert loaded.messages == {}
    assert loaded.rollback_messages == {pid: ProcedureMessage("T", "d", None, 1, "boom")}
    raw = (tmp_path / "data" / "procedure" / str(pid) / "0000000001.rollback").read_bytes()
    assert raw == b'{"type_name":"T","data":"d","parent_id":null,"step":1,"error":"boom"}'


async def test_delete_order_steps_then_commit_then_folder(tmp_path: Path) -> None:
    store, recorder = make_store(tmp_path)
    pid = ProcedureId.random()
    await store.store_procedure(pid, 0, "T", "d", None)
    await store.store_procedure(pid, 1, "T", "d", None)
    await store.commit_procedure(pid, 2)
    recorder.ops.clear()
    await store.delete_procedure(pid)
    folder = f"data/procedure/{pid}/"
    assert [(op.kind, op.key) for op in recorder.ops] == [
        ("batch_delete", f"{folder}0000000000.step,{folder}0000000001.step"),
        ("batch_delete", f"{folder}0000000002.commit"),
        ("delete", folder),
    ]
    assert not (tmp_path / "data" / "procedure" / str(pid)).exists()
    loaded = await store.load_messages()
    assert not loaded.messages and not loaded.finished_ids


async def test_corrupt_value_is_reported_with_its_key_and_skipped(tmp_path: Path) -> None:
    store, _ = make_store(tmp_path)
    good, torn, empty = ProcedureId.random(), ProcedureId.random(), ProcedureId.random()
    await store.store_procedure(good, 0, "T", "fine", None)
    await store.store_procedure(torn, 0, "T", "fine", None)
    torn_key = store.key(torn, 1, KeyType.STEP)
    (tmp_path / torn_key).write_bytes(b'{"type_name":"T","data":"trunc')
    empty_key = store.key(empty, 0, KeyType.STEP)
    (tmp_path / empty_key).parent.mkdir(parents=True)
    (tmp_path / empty_key).write_bytes(b"")
    (tmp_path / "data" / "procedure" / "stray-file").write_text("ignored")
    loaded = await store.load_messages()
    assert set(loaded.messages) == {good}
    assert {p.key for p in loaded.problems} == {torn_key, empty_key}
    problem = next(p for p in loaded.problems if p.procedure_id == torn)
    assert "not JSON" in problem.reason
    assert str(torn) in str(problem) and torn_key in str(problem) and "restart" in str(problem)
    # Nothing was deleted: the operator decides.
    assert (tmp_path / torn_key).exists()


async def test_create_procedure_is_create_only(tmp_path: Path) -> None:
    store, _ = make_store(tmp_path)
    pid = ProcedureId.random()
    assert await store.create_procedure(pid, "T", "d", None)
    assert await store.create_procedure(pid, "T", "d", None)  # our own earlier write: same bytes
    assert not await store.create_procedure(pid, "T", "other", None)
    assert (await store.load_messages()).messages[pid].data == "d"


async def test_message_step_follows_the_key(tmp_path: Path) -> None:
    store, _ = make_store(tmp_path)
    pid = ProcedureId.random()
    key = store.key(pid, 5, KeyType.STEP)
    (tmp_path / key).parent.mkdir(parents=True)
    (tmp_path / key).write_bytes(ProcedureMessage("T", "d", None, 3).encode())
    assert (await store.load_messages()).messages[pid].step == 5


async def test_a_torn_latest_key_far_above_the_rest_is_stepped_over_by_the_listed_steps(tmp_path: Path) -> None:
    """An empty latest `.step` billions of step numbers above the last real one: the load
    reads the `.step` keys listed below it, never each step number in between."""
    recorder = FaultyStore(LocalDirStore(tmp_path))
    store = ProcedureStore(recorder, "data/", skip_strays=True)
    pid = ProcedureId.random()
    await store.store_procedure(pid, 0, "T", "d-0", None)
    await store.store_procedure(pid, 1, "T", "d-1", None)
    await recorder.put(store.key(pid, 4_000_000_000, KeyType.STEP), b"")
    recorder.ops.clear()
    loaded = await asyncio.wait_for(store.load_messages(), timeout=10)
    assert loaded.messages == {pid: ProcedureMessage("T", "d-1", None, 4_000_000_000)}
    assert sum(op.kind == "get" for op in recorder.ops) <= 1


_IDS = [ProcedureId.parse(f"00000000-0000-4000-8000-00000000000{i}") for i in range(4)]
_ODD = [
    "data/procedure/x",
    "data/procedure/{id}/0000000001.other",
    "data/procedure/{id}/12.step",
    "data/procedure/{id}/sub/0000000001.step",
    "data/procedure/{id}/00000000001.step",
    "data/procedure/{id}/0000000001.step/x",
    "data/procedure/{id}/0000000003.step\ndata/procedure/{id}/0000000004.step",  # two keys' text in one
    "data/procedure/{id}/4294967296.step",  # above `MAX_STEP`
    "data/procedure/{id}/",
    "data/procedure/{id}/0000000001.STEP",
    "data/procedure/{id}/000000000\u0661.step",  # a digit, but not ASCII
    "data/procedure/{id}x/0000000001.step",
]
"""Keys under the prefix of other shapes: a listing with one is read the general way."""


@given(
    st.lists(st.tuples(st.sampled_from(_IDS), st.integers(0, 5), st.sampled_from(list(KeyType))), max_size=24),
    st.lists(st.tuples(st.sampled_from(_ODD), st.sampled_from(_IDS)), max_size=2),
    st.booleans(),
    st.booleans(),
)
def test_the_load_reads_a_sorted_listing_as_it_reads_any(
    parts: list[tuple[ProcedureId, int, KeyType]],
    odd: list[tuple[str, ProcedureId]],
    shuffled: bool,
    skip_strays: bool,
) -> None:
    """`latest_in_sorted` (a sorted listing of canonical keys) gives exactly what the general
    reading (`KeysByProcedure.group`, the latest-step rule) gives: the latest keys, the keys
    read and their texts, the strays; any other listing is left to the general reading."""
    store = ProcedureStore(LocalDirStore("/nonexistent"), "data/", skip_strays=skip_strays)
    keys = sorted({store.key(*part) for part in parts} | {text.format(id=pid) for text, pid in odd})
    if shuffled:
        keys.reverse()
    fast = store._latest_keys(keys)
    with_fast_path = latest_in_sorted(store.proc_path, keys) is not None
    assert with_fast_path == (not odd and not (shuffled and len(keys) > 1))
    with patch("procstore.store.procedure_store.latest_in_sorted", lambda *_a, **_k: None):
        general = store._latest_keys(keys)
    assert fast == general


async def _run_keys(store: ProcedureStore, pid: ProcedureId, later: list[tuple[int, int]]) -> None:
    """Run 1 ended (0.step, 1.step, 2.commit); then keys (step, run) above it."""
    for step in (0, 1):
        message = ProcedureMessage("T", "d", None, step).encode()
        await store.store.put_if_absent(store.key(pid, step, KeyType.STEP), message)
    await store.commit_procedure(pid, 2)
    for step, run in later:
        message = ProcedureMessage("T", "d", None, step, run=run).encode()
        await store.store.put_if_absent(store.key(pid, step, KeyType.STEP), message)


async def test_deleting_an_ended_run_leaves_a_later_run_of_the_id_whole(tmp_path: Path) -> None:
    """An end's deletion that lists the folder (a former leader's, late) finds a rewind's
    copy above the `.commit`: the folder is the new run's now (it may copy the earlier
    steps again), so nothing is deleted. A late key of the ended run itself goes; an
    operator's `procstore delete` takes everything."""
    store, _ = make_store(tmp_path)
    rewound, late, deleted = ProcedureId.random(), ProcedureId.random(), ProcedureId.random()
    await _run_keys(store, rewound, [(3, 2)])
    await _run_keys(store, late, [(3, 1)])
    await _run_keys(store, deleted, [(3, 2)])
    await store.delete_procedure(rewound)
    await store.delete_procedure(late)
    await store.delete_procedure(deleted, everything=True)
    assert len(await store.store.walk(f"data/procedure/{rewound}/")) == 4
    assert await store.store.walk(f"data/procedure/{late}/") == []
    assert await store.store.walk(f"data/procedure/{deleted}/") == []


@pytest.mark.parametrize("failing", [1, 2, 3])
async def test_a_deletion_cut_short_leaves_a_rewound_procedure_read_as_its_last_run_ended(
    tmp_path: Path, failing: int
) -> None:
    """Run 1 rolled back (0.step, 1.rollback, 2.commit); a rewind ran run 2 to its end
    (3.step, 4.commit). A deletion that stops at any stage must leave a folder that reads as
    run 2 ended (done), never as rolled back by run 1's `.rollback`."""

    store, recorder = make_store(tmp_path)
    pid = ProcedureId.random()
    await store.store_procedure(pid, 0, "T", "d", None)
    await store.rollback_procedure(pid, ProcedureMessage("T", "d", None, 1, "boom"))
    await store.commit_procedure(pid, 2)
    message = ProcedureMessage("T", "d", None, 3, run=2).encode()
    await store.store.put_if_absent(store.key(pid, 3, KeyType.STEP), message)
    await store.commit_procedure(pid, 4)
    await _delete_cut_short_reads_done(store, recorder, pid, failing)


async def _delete_cut_short_reads_done(
    store: ProcedureStore, recorder: FaultyStore, pid: ProcedureId, failing: int
) -> None:
    """Delete `pid`'s keys with its `failing`-th deletion request failing: what is left
    reads as finished (done), never as rolled back."""
    from procstore.testing import Fault, InjectedFailure

    recorder.plan.faults.append(Fault("error", kinds=frozenset({"delete", "batch_delete"}), nth=failing))
    with pytest.raises(InjectedFailure):
        await store.delete_procedure(pid)
    left = sorted(k.rsplit("/", 1)[1] for k in await store.store.walk(f"data/procedure/{pid}/"))
    loaded = await store.load_messages()
    assert not left or pid in loaded.finished_ids, left
    assert pid not in loaded.rolled_back_ids, left


async def _forced_rewind_of_a_rolling_back_run(store: ProcedureStore, pid: ProcedureId) -> None:
    """Run 1 was rolling back (0.step, 1.rollback) when a forced rewind ran run 2 to its end
    (2.step, 3.commit): one `.commit`, with run 1's `.rollback` below the message it ends."""
    await store.store_procedure(pid, 0, "T", "d", None)
    await store.rollback_procedure(pid, ProcedureMessage("T", "d", None, 1, "boom"))
    message = ProcedureMessage("T", "d", None, 2, run=2).encode()
    await store.store.put_if_absent(store.key(pid, 2, KeyType.STEP), message)
    await store.commit_procedure(pid, 3)


@pytest.mark.parametrize("failing", [1, 2])
async def test_a_deletion_cut_short_leaves_a_forced_rewind_of_a_rolling_back_procedure_read_as_done(
    tmp_path: Path, failing: int
) -> None:
    """Run 1 was rolling back (0.step, 1.rollback) when a forced rewind ran run 2 to its end
    (2.step, 3.commit): one `.commit`, with run 1's `.rollback` below the message it ends.
    A deletion that stops after any stage must leave a folder read as run 2 ended (done):
    left alone with the commit, the old `.rollback` would read as its end (and a failed
    root is kept for an operator with `keep_failed`)."""

    store, recorder = make_store(tmp_path)
    pid = ProcedureId.random()
    await _forced_rewind_of_a_rolling_back_run(store, pid)
    assert pid not in (await store.load_messages()).rolled_back_ids
    await _delete_cut_short_reads_done(store, recorder, pid, failing)


@pytest.mark.parametrize("late", [False, True])
async def test_a_bulk_delete_that_keeps_a_rollback_leaves_a_run_that_ended_done_read_as_done(late: bool) -> None:
    """S3's DeleteObjects answers 200 and keeps the keys it lists under `Errors`: the first
    stage of a deletion can be left in any part. A run that ended done (`.step` below the one
    `.commit`) beside a `.rollback` that goes in that stage (run 1's, below a forced rewind's
    run 2; or a former leader's landed late beside the commit) must still read as done when
    the bulk delete kept only that `.rollback`: the `.step` the commit ends goes after it."""
    from procstore.errors import StoreError
    from procstore.testing import MemoryStore

    class KeepsRollbacksInBulk(MemoryStore):
        async def batch_delete(self, keys: Sequence[str]) -> None:
            kept = [key for key in keys if key.endswith(".rollback")] if len(keys) > 1 else []
            await super().batch_delete([key for key in keys if key not in kept])
            if kept:
                raise StoreError(f"S3 kept {len(kept)} of {len(keys)} keys", key=kept[0])

    store = ProcedureStore(KeepsRollbacksInBulk(f"bulk-{ProcedureId.random()}"), "data/")
    pid = ProcedureId.random()
    if late:
        await store.store_procedure(pid, 0, "T", "d", None)
        await store.store_procedure(pid, 1, "T", "d", None)
        await store.commit_procedure(pid, 2)
        await store.rollback_procedure(pid, ProcedureMessage("T", "d", None, 2, "late"))
    else:
        await _forced_rewind_of_a_rolling_back_run(store, pid)
    assert pid not in (await store.load_messages()).rolled_back_ids
    with pytest.raises(StoreError):
        await store.delete_procedure(pid)
    left = sorted(k.rsplit("/", 1)[1] for k in await store.store.walk(f"data/procedure/{pid}/"))
    loaded = await store.load_messages()
    assert pid in loaded.finished_ids, left
    assert pid not in loaded.rolled_back_ids, left


@pytest.mark.parametrize("runs", [1, 2])
@pytest.mark.parametrize("failing", [0, 1, 2])
async def test_a_deletion_cut_short_never_reads_a_late_rollback_beside_the_commit_as_the_end(
    failing: int, runs: int
) -> None:
    """A run committed at step c, and a former leader's `.rollback` landed late beside the
    `.commit` (`c.rollback`): the commit ends the message below it, so the run is done. A
    deletion that stops at any stage must leave it read as done: left alone with the
    commit, the late `.rollback` would read as its end (and a failed root is kept for an
    operator with `keep_failed`). With `runs=2` the folder holds a rolled-back earlier run.
    In memory: a local directory moves a folder of many keys to its trash at once."""
    from procstore.testing import MemoryStore

    recorder = FaultyStore(MemoryStore(f"deletion-{ProcedureId.random()}"))
    store = ProcedureStore(recorder, "data/")
    pid = ProcedureId.random()
    await store.store_procedure(pid, 0, "T", "d", None)
    step = 1
    if runs == 2:
        await store.rollback_procedure(pid, ProcedureMessage("T", "d", None, 1, "boom"))
        await store.commit_procedure(pid, 2)
        message = ProcedureMessage("T", "d", None, 3, run=2).encode()
        await store.store.put_if_absent(store.key(pid, 3, KeyType.STEP), message)
        step = 4
    await store.commit_procedure(pid, step)
    await store.rollback_procedure(pid, ProcedureMessage("T", "d", None, step, "late", run=runs))
    assert pid not in (await store.load_messages()).rolled_back_ids
    await _delete_cut_short_reads_done(store, recorder, pid, failing)


async def test_a_rollback_and_a_commit_at_one_step_are_deleted_rollback_first(tmp_path: Path) -> None:
    """The `.commit` ranks over the `.rollback` at one step (`procstore.store.folder`), so it
    goes last: a crash between the two leaves the procedure finished, never rolling back."""
    store, recorder = make_store(tmp_path)
    pid = ProcedureId.random()
    await store.store_procedure(pid, 0, "T", "d", None)
    await store.rollback_procedure(pid, ProcedureMessage("T", "d", None, 1, "boom"))
    await store.commit_procedure(pid, 1)
    recorder.ops.clear()
    await store.delete_procedure(pid)
    folder = f"data/procedure/{pid}/"
    deleted = [key for op in recorder.ops if op.kind in ("batch_delete", "delete") for key in op.key.split(",")]
    assert deleted.index(f"{folder}0000000001.rollback") < deleted.index(f"{folder}0000000001.commit")


async def test_unknown_fields_are_forgotten_when_the_procedure_goes_and_never_reach_a_new_one(tmp_path: Path) -> None:
    """What another writer added to one procedure (GreptimeDB's `context`) is written back
    on its later keys, never on those of a later procedure submitted under the same id, and
    is not kept in memory once the procedure is deleted."""
    store, _ = make_store(tmp_path)
    pid = ProcedureId.random()
    greptime = ProcedureMessage.decode(b'{"type_name":"T","data":"d","parent_id":null,"step":0,"context":"alice"}')
    store.keep_unknown_fields(pid, greptime)
    await store.store_procedure(pid, 1, "T", "d", None)
    assert b"alice" in (await store.store.get(store.key(pid, 1, KeyType.STEP)) or b"")
    await store.delete_procedure(pid)
    assert pid not in store.unknown_fields
    store.keep_unknown_fields(pid, greptime)
    assert await store.create_submitted(pid, "T", "bob's")
    await store.store_procedure(pid, 1, "T", "bob's", None)
    assert b"alice" not in (await store.store.get(store.key(pid, 1, KeyType.STEP)) or b"")
