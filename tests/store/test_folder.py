"""`procstore.store.folder`: the one reading of a procedure's keys, and the fast
constructor recovery uses, checked against it."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from procstore import ProcedureId
from procstore._client.inventory import endings
from procstore.store.folder import ProcedureKeys, StoredStatus, latest_first
from procstore.store.keys import KeyType, ParsedKey, key_text, latest_in_sorted

_PREFIX = "data/procedure/"
_IDS = [ProcedureId.parse(f"00000000-0000-4000-8000-00000000000{i}") for i in range(4)]
_FOLDER = st.lists(st.tuples(st.integers(0, 5), st.sampled_from(list(KeyType))), min_size=1, max_size=10, unique=True)


@given(_FOLDER, st.randoms())
def test_the_reading_of_a_folder_does_not_depend_on_the_order_of_its_keys(
    found: list[tuple[int, KeyType]], random: object
) -> None:
    shuffled = list(found)
    random.shuffle(shuffled)  # type: ignore[attr-defined]
    assert ProcedureKeys.of(found) == ProcedureKeys.of(shuffled)
    folder = ProcedureKeys.of(found)
    assert folder.latest == max(found, key=latest_first)
    assert folder.lowest == min(step for step, _ in found)


def test_at_one_step_a_commit_ranks_over_a_rollback_over_a_step() -> None:
    both = [(3, KeyType.STEP), (3, KeyType.ROLLBACK)]
    assert ProcedureKeys.of(both).status is StoredStatus.ROLLING_BACK
    assert ProcedureKeys.of(reversed(both)).status is StoredStatus.ROLLING_BACK
    ended = [(3, KeyType.COMMIT), (3, KeyType.STEP), (3, KeyType.ROLLBACK)]
    assert ProcedureKeys.of(ended).latest == (3, KeyType.COMMIT)
    assert ProcedureKeys.of(ended).status is StoredStatus.FAILED


def test_a_commit_ends_the_message_below_its_step_not_one_beside_it() -> None:
    """A `.rollback` beside a `.commit` is a former leader's write that landed late (ledger
    seed 14188): the commit ends the message below it. Only with none below is the one
    beside it read."""
    late = [(0, KeyType.STEP), (1, KeyType.COMMIT), (1, KeyType.ROLLBACK)]
    assert ProcedureKeys.of(late).newest_message == (0, KeyType.STEP)
    assert ProcedureKeys.of(late).status is StoredStatus.COMMITTED
    failed = [(0, KeyType.STEP), (1, KeyType.ROLLBACK), (2, KeyType.COMMIT), (2, KeyType.STEP)]
    assert ProcedureKeys.of(failed).status is StoredStatus.FAILED
    keys = [ParsedKey(_PREFIX, _IDS[0], step, kind) for step, kind in sorted(late, key=latest_first)]
    assert endings([(key, None, None, None) for key in keys]) == [None, None, StoredStatus.COMMITTED]


@given(st.dictionaries(st.sampled_from(_IDS), _FOLDER, min_size=1), st.booleans())
def test_the_fast_reading_of_a_sorted_listing_is_the_folder_reading(
    folders: dict[ProcedureId, list[tuple[int, KeyType]]], lowest: bool
) -> None:
    """`latest_in_sorted` reads a whole sorted listing at once; for every folder its answer
    is `ProcedureKeys.of`'s: the latest key, the message below a latest commit, the lowest step."""
    keys = sorted(key_text(_PREFIX, pid, step, kind) for pid, found in folders.items() for step, kind in found)
    fast = latest_in_sorted(_PREFIX, keys, lowest=lowest)
    assert fast is not None
    assert len(fast) == len(folders)
    for pid, latest, latest_key, below, below_key, low in fast:
        folder = ProcedureKeys.of(folders[pid])
        assert latest == folder.latest
        assert latest_key == key_text(_PREFIX, pid, *folder.latest)
        assert below == folder.below_commit
        assert below_key == (None if below is None else key_text(_PREFIX, pid, *below))
        assert low == (folder.lowest if lowest else 0)


def test_the_fast_reading_of_folders_each_ending_alone_at_its_step() -> None:
    """Recovery's usual listing (every folder's last key alone at its step, none a commit) is
    read without a walk per folder: the same answers, the lowest step too."""
    folders = {
        _IDS[0]: [(0, KeyType.STEP), (1, KeyType.STEP), (2, KeyType.STEP)],
        _IDS[1]: [(3, KeyType.STEP), (4, KeyType.ROLLBACK)],
        _IDS[2]: [(0, KeyType.COMMIT), (1, KeyType.STEP)],
    }
    keys = sorted(key_text(_PREFIX, pid, step, kind) for pid, found in folders.items() for step, kind in found)
    for lowest in (True, False):
        fast = latest_in_sorted(_PREFIX, keys, lowest=lowest)
        assert fast is not None
        assert [(pid, latest, low) for pid, latest, _, _, _, low in fast] == [
            (pid, ProcedureKeys.of(found).latest, ProcedureKeys.of(found).lowest if lowest else 0)
            for pid, found in folders.items()
        ]
