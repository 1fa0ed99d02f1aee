"""Property: whatever a store holds under `procedure/`, `start()` survives it, reports what it
cannot load, deletes nothing it could not read, and still runs every readable procedure.

The generated stores mix good procedures with junk: random keys, truncated, empty and
non-UTF-8 values, JSON of the wrong shape, huge step numbers, parent cycles, orphans and
mixed terminal keys.
"""

from __future__ import annotations

import asyncio
import json
import uuid

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from procstore import ProcedureId
from procstore.store import open_state_store
from procstore.store.keys import KeyType, ParsedKey
from procstore.store.message import ProcedureMessage
from tests.procedures import World
from tests.support import manager_for

PREFIX = "procedure/"

ids = st.builds(ProcedureId.random)
junk_values = st.one_of(
    st.binary(max_size=40),
    st.just(b""),
    st.just(b"\xff\xfe\xfa"),
    st.just(b'{"type_name": "test::Steps", "data": "\xff\xfe", "parent_id": null, "step": 0}'),
    st.just(b'{"type_name": "test::Steps", "data": "{}", "parent_id": null, "st'),
    st.just(b'{"type_name": 5, "data": [], "parent_id": 7, "step": "x"}'),
    st.just(b'{"type_name": "test::Steps", "data": "{}", "parent_id": null, "step": 18446744073709551616}'),
    st.just(b"[]"),
    st.just(b"null"),
)
suffixes = st.sampled_from([KeyType.STEP, KeyType.COMMIT, KeyType.ROLLBACK])


def _message(type_name: str, data: str, parent: ProcedureId | None, step: int, error: str | None = None) -> bytes:
    return ProcedureMessage(type_name, data, parent, step, error).encode()


@st.composite
def junk_procedure(draw: st.DrawFn) -> dict[str, bytes]:
    """One procedure folder of arbitrary keys and values."""
    pid = draw(ids)
    keys: dict[str, bytes] = {}
    for _ in range(draw(st.integers(1, 3))):
        step = draw(st.one_of(st.integers(0, 4), st.just(10**19), st.just(2**32 - 1)))
        keys[str(ParsedKey(PREFIX, pid, step, draw(suffixes)))] = draw(junk_values)
    return keys


@st.composite
def linked_procedures(draw: st.DrawFn) -> dict[str, bytes]:
    """Readable unfinished procedures whose parents form a cycle, or name nobody."""
    members = draw(st.lists(ids, min_size=1, max_size=3))
    cyclic = draw(st.booleans())
    keys: dict[str, bytes] = {}
    for i, pid in enumerate(members):
        parent = members[(i + 1) % len(members)] if cyclic else ProcedureId.random()
        keys[str(ParsedKey(PREFIX, pid, 0, KeyType.STEP))] = _message("test::Steps", "{}", parent, 0)
    return keys


@st.composite
def stray_keys(draw: st.DrawFn) -> dict[str, bytes]:
    name = draw(st.sampled_from(["x", "tmp/.part", "0000000001.step", f"{uuid.uuid4()}", "UPPER/0000000000.step"]))
    return {f"{PREFIX}{name}": draw(junk_values)}


adversarial = st.lists(
    st.one_of(
        st.tuples(st.just("junk"), junk_procedure()),
        st.tuples(st.just("linked"), linked_procedures()),
        st.tuples(st.just("stray"), stray_keys()),
    ),
    max_size=5,
)


def _good(world: World, n: int) -> tuple[list[ProcedureId], dict[str, bytes]]:
    """`n` readable procedures, unfinished at step 0 or 1, that a manager must run to the end."""
    pids, keys = [], {}
    for i in range(n):
        pid = ProcedureId.random()
        data = json.dumps({"world": world.name, "steps": 2, "name": f"good{i}", "at": i % 2}, sort_keys=True)
        for step in range(i % 2 + 1):
            keys[str(ParsedKey(PREFIX, pid, step, KeyType.STEP))] = _message("test::Steps", data, None, step)
        pids.append(pid)
    return pids, keys


async def _check(parts: list[tuple[str, dict[str, bytes]]]) -> None:
    url = f"memory://adversarial-{uuid.uuid4().hex}/"
    world = World.new()
    good, good_keys = _good(world, 2)
    store = open_state_store(url)
    for _, keys in parts:
        for key, value in keys.items():
            await store.put(key, value)
    for key, value in good_keys.items():
        await store.put(key, value)

    manager = manager_for(url)
    async with manager:  # start() must not raise
        for pid in good:
            while (state := manager.procedure_state(pid)) is None or not state.is_ended():
                await asyncio.sleep(0.005)
            assert state.is_done(), state
        problem_ids = {p.procedure_id for p in manager.recovery_problems}
    remaining = set(await store.walk(PREFIX))
    for kind, keys in parts:
        gone = set(keys) - remaining
        if kind == "stray":
            assert not gone, f"a key that is not a procedure's was deleted: {gone}"
        elif kind == "linked":
            # Parent cycles and orphans: nothing resumes them, so each is reported and kept.
            assert not gone, f"kept procedures were deleted: {gone}"
            for key in keys:
                parsed = ParsedKey.parse(PREFIX, key)
                assert parsed is not None and parsed.procedure_id in problem_ids, f"{key} not reported"
        elif gone:
            # No junk value is a readable message: only a folder of bare `.commit` keys (a
            # finished procedure whose other keys went) may be deleted, and of it only those:
            # a key above the largest step is no procedure's, and is left alone.
            ours = [k for k in keys if ParsedKey.parse(PREFIX, k) is not None]
            assert all(k.endswith(".commit") for k in ours), f"deleted with unreadable values: {sorted(keys)}"
            assert gone <= set(ours), f"a key that is not a procedure's was deleted: {gone - set(ours)}"


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(adversarial)
def test_start_survives_any_store_and_loses_nothing(parts: list[tuple[str, dict[str, bytes]]]) -> None:
    asyncio.run(asyncio.wait_for(_check(parts), 20))


@pytest.mark.parametrize("suffix", [KeyType.STEP, KeyType.COMMIT, KeyType.ROLLBACK])
def test_invalid_utf8_inside_a_value_is_unreadable_not_fatal(suffix: KeyType) -> None:
    """msgspec raises UnicodeDecodeError (not its DecodeError) for bad UTF-8 in a string."""
    bad = b'{"type_name": "test::Steps", "data": "\xff\xfe", "parent_id": null, "step": 0}'
    key = str(ParsedKey(PREFIX, ProcedureId.random(), 0, suffix))
    asyncio.run(asyncio.wait_for(_check([("junk", {key: bad})]), 20))


@pytest.mark.parametrize("field", ["parent_id", "context"])
def test_a_value_nested_too_deeply_is_unreadable_not_fatal(field: str) -> None:
    """A value nested deeper than the decoder goes (about a thousand arrays, 4 KB) is one
    procedure's load problem: `start()` goes on and resumes the others."""
    deep = b"[" * 2000 + b"]" * 2000
    bad = b'{"type_name": "test::Steps", "data": "{}", "parent_id": null, "step": 0, "context": ' + deep + b"}"
    if field == "parent_id":
        bad = b'{"type_name": "test::Steps", "data": "{}", "parent_id": ' + deep + b', "step": 0}'
    key = str(ParsedKey(PREFIX, ProcedureId.random(), 0, KeyType.STEP))
    asyncio.run(asyncio.wait_for(_check([("junk", {key: bad})]), 20))
