"""`ParsedKey` and `ProcedureId`: the key layout of docs/stores.md, and round trips."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from procstore import ProcedureId
from procstore.store.keys import KeysByProcedure, KeyType, ParsedKey, procedure_dir, procedure_of_dir

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


def _canonical_by_uuid(text: str) -> bool:
    """The definition: `text` is what `str(uuid.UUID(text))` gives back."""
    import uuid as uuid_module

    try:
        return str(uuid_module.UUID(text)) == text
    except ValueError:
        return False


@given(
    text=st.one_of(
        st.uuids().map(str),
        st.uuids().map(lambda u: str(u).upper()),
        st.uuids().map(lambda u: u.hex),
        st.uuids().map(lambda u: "{" + str(u) + "}"),
        st.text(alphabet="0123456789abcdefABCDEF-{}x ", min_size=30, max_size=40),
    )
)
def test_parse_canonical_accepts_exactly_the_canonical_form(text: str) -> None:
    parsed = ProcedureId.parse_canonical(text)
    assert (parsed is not None) == _canonical_by_uuid(text)
    if parsed is not None:
        assert parsed == ProcedureId.parse(text) and hash(parsed) == hash(ProcedureId.parse(text))
        assert str(parsed.uuid) == text


@given(
    keys=st.lists(
        st.one_of(
            st.builds(
                lambda u, s, t: f"{PREFIX}{u}/{s:010d}.{t.value}",
                st.sampled_from([str(PID), "9f805a1f-05f7-490c-9f91-bd56e3cc54c2", "NOT-A-UUID"]),
                st.integers(0, 20),
                st.sampled_from(list(KeyType)),
            ),
            st.sampled_from([f"{PREFIX}{PID}/.tmp-1", f"{PREFIX}x/{PID}/0000000001.step", "other/key", f"{PREFIX}a"]),
        )
    )
)
def test_grouping_agrees_with_parse(keys: list[str]) -> None:
    grouped = KeysByProcedure.group(PREFIX, keys)
    parsed = [(k, ParsedKey.parse(PREFIX, k)) for k in keys]
    assert grouped.others == [k for k, p in parsed if p is None]
    expected: dict[ProcedureId, list[tuple[int, KeyType]]] = {}
    for _, p in parsed:
        if p is not None:
            expected.setdefault(p.procedure_id, []).append((p.step, p.key_type))
    assert grouped.steps == expected


_FRAGMENTS = st.sampled_from(
    [
        str(PID),
        str(PID).upper(),
        str(PID)[:-1],
        str(PID) + "0",
        PID.uuid.hex,
        "\u0663" + str(PID)[1:],  # an Arabic-Indic digit: a digit to `str.isdigit`, not to the key pattern
        *"/.\nx",
        "",
        "step",
        "commit",
        "rollback",
        ".step",
        "0000000001",
        "1",
        "\u00b2",
        "\u0661",
        "\u212a",
        PREFIX,
    ]
)


@given(
    prefix=st.sampled_from(["", PREFIX, f"{PID}/"]),
    tails=st.lists(st.lists(_FRAGMENTS, max_size=7).map("".join), max_size=8),
    raw=st.lists(st.text(max_size=60), max_size=3),
)
def test_grouping_agrees_with_parse_on_adversarial_keys(prefix: str, tails: list[str], raw: list[str]) -> None:
    """The fast path's verdict is `ParsedKey.parse`'s for keys built from the pieces that
    could fool it: ids of the wrong length or case, unicode digits, nested folders, suffix
    variants, keys equal to or inside the prefix."""
    keys = [prefix + tail for tail in tails] + raw
    grouped = KeysByProcedure.group(prefix, keys)
    expected: dict[ProcedureId, list[tuple[int, KeyType]]] = {}
    others: list[str] = []
    for key in keys:
        if (p := ParsedKey.parse(prefix, key)) is None:
            others.append(key)
        else:
            expected.setdefault(p.procedure_id, []).append((p.step, p.key_type))
    assert (grouped.steps, grouped.others) == (expected, others)
    assert list(grouped.steps) == list(expected)  # the same order too


@pytest.mark.parametrize("id_text", [str(PID), "not-a-procedure-id-but-36-chars-long"])
def test_a_step_number_too_long_for_int_is_no_key_and_no_error(id_text: str) -> None:
    """`int()` refuses more than 4,300 digits: such a key is not one of ours, as any other
    name that is not, never an error that would stop every start."""
    key = f"{PREFIX}{id_text}/{'1' * 5000}.step"
    ordinary = f"{PREFIX}{PID}/0000000001.step"
    assert ParsedKey.parse(PREFIX, key) is None
    for keys in ([key], [ordinary, key], [key, ordinary]):
        grouped = KeysByProcedure.group(PREFIX, keys)
        assert grouped.others == [key]
        assert grouped.steps == ({PID: [(1, KeyType.STEP)]} if ordinary in keys else {})


def test_a_procedure_folder_round_trips_to_its_id() -> None:
    pid = ProcedureId.random()
    for prefix in ("procedure/", "region-a/procedure/"):
        assert procedure_of_dir(prefix, procedure_dir(prefix, pid)) == pid
        for other in (f"{prefix}{pid}/junk/", f"{prefix}not-an-id/", f"other/{pid}/", prefix):
            assert procedure_of_dir(prefix, other) is None
