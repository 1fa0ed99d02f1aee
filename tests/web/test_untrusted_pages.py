"""`procstore serve` over stores shaped to make its pages large: every page bounded in
total, its JSON twin whole."""

from __future__ import annotations

import json
from pathlib import Path

from starlette.testclient import TestClient

from procstore._web.app import OVERVIEW_SHOWN, PAGE_FIELD_TEXT, TYPES_SHOWN, create_app

PID = "66666666-6666-4666-8666-666666666666"


def _put_step(root: Path, pid: str, step: int, data: str, type_name: str = "t") -> int:
    value = json.dumps({"type_name": type_name, "data": data, "parent_id": None, "step": step}).encode()
    folder = root / "procedure" / pid
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"{step:010d}.step").write_bytes(value)
    return len(value)


def test_the_json_twin_has_a_steps_data_whole(tmp_path: Path) -> None:
    _put_step(tmp_path, PID, 0, json.dumps({"items": list(range(100)), "text": "y" * 5_000}))
    with TestClient(create_app(str(tmp_path))) as client:
        page = client.get(f"/p/{PID}").text
        fields = {f["name"]: f["value"] for f in client.get(f"/api/procedures/{PID}").json()["steps"][0]["fields"]}
    assert "y" * 5_000 not in page and "80 more elements" in page  # the page is cut
    assert fields["items[99]"] == "99" and fields["text"] == json.dumps("y" * 5_000)


def test_a_procedures_page_is_bounded_in_total_not_only_per_field(tmp_path: Path) -> None:
    """200 fields, each named by a 2,000-character path, in each of 30 steps: 4 KB stored a
    step, 400 KB of page a step were each field shown."""
    data = json.dumps({"k" * 2_000: {f"f{i}": 0 for i in range(200)}})
    stored = sum(_put_step(tmp_path, PID, step, data) for step in range(30))
    with TestClient(create_app(str(tmp_path))) as client:
        page = client.get(f"/p/{PID}")
        twin = client.get(f"/api/procedures/{PID}").json()
    assert page.status_code == 200 and "fields not shown" in page.text
    assert len(page.content) < 2 * PAGE_FIELD_TEXT + 100 * stored // 30
    # The twin: every step whole, as stored (its fields' names would be 100 times its size).
    assert all(json.loads(s["raw"]) == json.loads(data) for s in twin["steps"])


def test_the_overview_lists_a_bounded_number_and_says_how_many_more(tmp_path: Path) -> None:
    total = OVERVIEW_SHOWN + 30
    for n in range(total):
        _put_step(tmp_path, f"77777777-7777-4777-8777-{n:012d}", 0, "{}")
    with TestClient(create_app(str(tmp_path))) as client:
        page = client.get("/").text
        twin = client.get("/api/procedures").json()
    assert page.count('href="p/') <= OVERVIEW_SHOWN and "30 more not shown" in page
    assert len(twin["procedures"]) == total


def test_a_procedures_timeline_shows_no_more_retries_than_a_manager_publishes(tmp_path: Path) -> None:
    """An activity holding 100,000 retries (a manager publishes its last ten) made a page of
    megabytes: one timeline row each."""
    _put_step(tmp_path, PID, 0, "{}")
    retries = [{"at": f"2026-01-01T00:00:{i % 60:02d}Z", "attempt": i, "error": "e" * 50} for i in range(100_000)]
    activity = {"run": 1, "doing": "backing off", "since": "2026-01-01T00:00:00Z", "step": 0, "retries": retries}
    (tmp_path / "activity").mkdir()
    (tmp_path / "activity" / f"{PID}.json").write_text(json.dumps(activity))
    with TestClient(create_app(str(tmp_path))) as client:
        page = client.get(f"/p/{PID}")
    assert page.status_code == 200 and page.text.count("failed, retried") == 10
    assert len(page.content) < 100_000


def test_a_long_key_over_many_fields_makes_a_page_and_a_twin_linear_in_it(tmp_path: Path) -> None:
    """One key of 20,000 characters holding 8,000 fields (about 120 KB stored): the twin
    named each field by its whole path, 160 MB of JSON, quadratic in the value's size (and
    the page built them all before keeping 200). The twin has the value whole all the same."""
    import tracemalloc

    data = json.dumps({"k" * 20_000: {str(i): i for i in range(8_000)}})
    stored = _put_step(tmp_path, PID, 0, data)
    with TestClient(create_app(str(tmp_path))) as client:
        tracemalloc.start()
        try:
            page = client.get(f"/p/{PID}")
            twin = client.get(f"/api/procedures/{PID}")
            peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
    assert page.status_code == 200 and twin.status_code == 200
    assert len(twin.content) < 20 * stored, f"a twin of {len(twin.content):,} bytes for {stored:,} stored"
    assert peak < 60 * stored, f"{peak:,} bytes at the peak for {stored:,} stored"
    (step,) = twin.json()["steps"]
    assert json.loads(step["raw"]) == json.loads(data)  # whole, as stored


def test_two_paths_that_read_alike_are_two_fields(tmp_path: Path) -> None:
    """`{"a.b": 1, "a": {"b": 2}}`: both fields are named `a.b`; the second replaced the first."""
    _put_step(tmp_path, PID, 0, json.dumps({"a.b": 1, "a": {"b": 2}}))
    with TestClient(create_app(str(tmp_path))) as client:
        (step,) = client.get(f"/api/procedures/{PID}").json()["steps"]
        page = client.get(f"/p/{PID}").text
    assert {f["name"]: f["value"] for f in step["fields"]} == {"a.b": "1", "a.b (2)": "2"}
    assert "a.b (2)" in page


def test_a_field_named_by_a_long_path_says_how_much_of_it_is_not_shown(tmp_path: Path) -> None:
    """`k…k.0`, 3,002 characters: its first 1,960 and `… 1042 more characters` (the name
    was cut twice, and said how many the second cut left out)."""
    _put_step(tmp_path, PID, 0, json.dumps({"k" * 3_000: {"0": 0}}))
    with TestClient(create_app(str(tmp_path))) as client:
        page = client.get(f"/p/{PID}").text
    assert "k" * 1_960 + "… 1042 more characters" in page


def test_the_overview_offers_a_bounded_number_of_types_and_says_how_many_more(tmp_path: Path) -> None:
    """One procedure per type, each of a type of its own: the type filter listed every type,
    a page as long as the store, fetched again at every refresh, however few rows it shows."""
    total = TYPES_SHOWN + 50
    for n in range(total):
        _put_step(tmp_path, f"77777777-7777-4777-8777-{n:012d}", 0, "{}", type_name=f"app::Type{n:04d}")
    _put_step(tmp_path, PID, 0, "{}", type_name="app::Type0000")  # the most common: offered
    with TestClient(create_app(str(tmp_path))) as client:
        page = client.get("/").text
        chosen = client.get("/", params={"type": f"app::Type{total - 1:04d}"}).text
        twin = client.get("/api/procedures").json()
    assert page.count("<option") <= TYPES_SHOWN + 20 and "app::Type0000" in page
    assert "51 more types" not in page and "50 more types" in page
    assert f"<option selected>app::Type{total - 1:04d}</option>" in chosen  # the chosen one is offered
    assert len(twin["types"]) == total
