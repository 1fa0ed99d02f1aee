"""`ParsedKey` and `ProcedureId`: the test vectors of store-format.md, and round trips."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from procstore import ProcedureId
from procstore.store.keys import KeyType, ParsedKey

PREFIX = "data/procedure/"
PID = ProcedureId.parse("9f805a1f-05f7-490c-9f91-bd56e3cc54c1")


@pytest.mark.parametrize(
    ("key_type", "expected"),
    [
        (KeyType.STEP, f"data/procedure/{PID}/0000000002.step"),
        (KeyType.COMMIT, f"data/procedure/{PID}/0000000002.commit"),
        (KeyType.ROLLBACK, f"data/procedure/{PID}/0000000002.rollback"),
    ],
)
def test_format_and_parse_vectors(key_type: KeyType, expected: str) -> None:
    key = ParsedKey(PREFIX, PID, 2, key_type)
    assert str(key) == expected
    assert ParsedKey.parse(PREFIX, expected) == key


@pytest.mark.parametrize(
    "key",
    [
        "",
        "invalidprefix",
        "procedu/0000000003.step",
        "procedure-0000000003.step",
        f"{PREFIX}{PID}",
        f"{PREFIX}{PID}/0000000003",
        f"{PREFIX}{PID}/0000000003.",
        f"{PREFIX}{PID}/0000000003.other",
        "12345/0000000003.step",
        f"{PREFIX}{PID}-0000000003.commit",
        # Beyond the spec's vectors: things procstore itself could leave around.
        f"{PREFIX}{PID}/.tmp-0123abcd",
        f"{PREFIX}{PID}/0000000003.step.tmp",
        f"{PREFIX}{PID}/+000000003.step",
        f"{PREFIX}{str(PID).upper()}/0000000003.step",
        f"{PREFIX}not-a-uuid/0000000003.step",
    ],
)
def test_invalid_keys_parse_to_nothing(key: str) -> None:
    assert ParsedKey.parse(PREFIX, key) is None


@given(
    uuid=st.uuids(),
    step=st.integers(min_value=0, max_value=2**32 - 1),
    key_type=st.sampled_from(list(KeyType)),
    root=st.sampled_from(["", "data/", "a/b/c/"]),
)
def test_round_trip(uuid: object, step: int, key_type: KeyType, root: str) -> None:
    prefix = f"{root}procedure/"
    key = ParsedKey(prefix, ProcedureId.parse(str(uuid)), step, key_type)
    assert ParsedKey.parse(prefix, str(key)) == key


def test_keys_sort_by_step() -> None:
    keys = [str(ParsedKey(PREFIX, PID, s, KeyType.STEP)) for s in (10, 2, 1)]
    assert sorted(keys) == [str(ParsedKey(PREFIX, PID, s, KeyType.STEP)) for s in (1, 2, 10)]


def test_procedure_id_forms() -> None:
    pid = ProcedureId.random()
    assert ProcedureId.parse(str(pid)) == pid
    assert str(pid) == str(pid).lower() and len(str(pid)) == 36
    assert ProcedureId.parse(str(pid).upper()) == pid
    assert ProcedureId.parse_canonical(str(pid).upper()) is None
    assert len({pid, ProcedureId.parse(str(pid))}) == 1
    with pytest.raises(ValueError, match="not a procedure id"):
        ProcedureId.parse("nope")
