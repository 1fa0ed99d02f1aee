"""`procstore serve` over a store written by an attacker (`procstore.testing.hostile`):
links only to its own pages, no script from the store runs, headers that forbid it."""

from __future__ import annotations

import asyncio
import json
import re
import shutil
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote

import httpx
import pytest
import uvicorn
from starlette.testclient import TestClient

from procstore._web.app import create_app
from procstore.ids import ProcedureId
from procstore.store import open_state_store
from procstore.testing.hostile import SCRIPT_URL, HostileStore, write_hostile_store
from procstore.testing.pytest_plugin import free_port
from tests.support import put_now as put

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
_CANONICAL = "[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}"
OWN_HREF = re.compile(rf"(\.\./)?(p/{_CANONICAL}|history|static/[a-z]+\.(js|css)|\./|\?.*)?")


@pytest.fixture
def hostile(tmp_path: Path) -> tuple[str, HostileStore]:
    url = str(tmp_path / "store")
    Path(url).mkdir()

    async def write() -> HostileStore:
        store = open_state_store(url)
        try:
            return await write_hostile_store(store)
        finally:
            await store.close()

    return url, asyncio.run(write())


def _pages(written: HostileStore) -> list[str]:
    ids = [str(pid) for pid in written.procedures]
    ended = [f"/p/{quote(hid, safe='')}" for hid in written.history_ids]
    return ["/", "/history", *(f"/p/{pid}" for pid in ids), *ended]


def test_every_link_is_to_a_page_of_the_app_built_from_a_procedure_id(hostile: tuple[str, HostileStore]) -> None:
    url, written = hostile
    with TestClient(create_app(url)) as client:
        ended = client.get(f"/p/{SCRIPT_URL}")
        assert ended.status_code == 200 and "its keys are gone" in ended.text  # the record is shown, as text
        for path in _pages(written):
            page = client.get(path)
            assert page.status_code in (200, 404), (path, page.status_code)
            for href in re.findall(r'(?:href|src|action)="([^"]*)"', page.text):
                assert OWN_HREF.fullmatch(href), (path, href)
            assert not re.search(r"<script(?![^>]*\bsrc=)", page.text), path  # no inline script


def test_every_answer_forbids_script_from_elsewhere_framing_and_sniffing(hostile: tuple[str, HostileStore]) -> None:
    url, _ = hostile
    with TestClient(create_app(url, allowed_hosts=["testserver"])) as client:
        answers = [client.get(p) for p in ("/", "/api/procedures", "/static/live.js", "/p/ffffffff", "/static/x")]
        answers.append(client.get("/", headers={"Host": "attacker.example"}))
        assert [a.status_code for a in answers] == [200, 200, 200, 404, 404, 400]
        for answer in answers:
            policy = answer.headers["content-security-policy"]
            assert "script-src 'self'" in policy and "frame-ancestors 'none'" in policy
            assert "unsafe-inline" not in policy and "default-src 'none'" in policy
            assert answer.headers["x-frame-options"] == "DENY"
            assert answer.headers["x-content-type-options"] == "nosniff"


def test_a_key_name_that_is_not_utf8_is_shown_escaped(hostile: tuple[str, HostileStore]) -> None:
    url, _ = hostile
    with TestClient(create_app(url)) as client:
        page, api = client.get("/"), client.get("/api/procedures")
        assert page.status_code == 200 and api.status_code == 200
        assert "procedure/bad\\xff.txt" in page.text
        assert "procedure/bad\\xff.txt" in api.json()["other_keys"]


def test_control_characters_and_bidi_overrides_in_stored_text_are_shown_escaped(
    hostile: tuple[str, HostileStore],
) -> None:
    # As the terminal shows them: U+202E would show the rest of a line reversed.
    url, written = hostile
    raw = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u200e\u200f\u202a-\u202e\u2066-\u2069]")
    with TestClient(create_app(url)) as client:
        for path in _pages(written):
            page = client.get(path)
            assert page.status_code == 200, path
            assert raw.search(page.text) is None, (path, raw.search(page.text))
        pages = " ".join(client.get(path).text for path in _pages(written))
    assert "\\u202eright-to-left override" in pages and "\\x1b]0;pwned" in pages


def test_a_large_value_makes_a_bounded_page(hostile: tuple[str, HostileStore]) -> None:
    url, written = hostile
    with TestClient(create_app(url)) as client:
        page = client.get(f"/p/{written.large}")
        assert page.status_code == 200 and len(page.content) < 200_000, len(page.content)
        assert "more" in page.text


@pytest.fixture
def served(hostile: tuple[str, HostileStore]) -> Iterator[tuple[str, HostileStore]]:
    url, written = hostile
    port = free_port()
    config = uvicorn.Config(create_app(url, refresh=0.3), host="127.0.0.1", port=port, log_level="warning")
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    base = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            httpx.get(base + "/api/procedures", timeout=1)
            break
        except httpx.HTTPError:
            time.sleep(0.05)
    yield base, written
    server.should_exit = True
    thread.join(10)


@pytest.mark.skipif(not Path(CHROMIUM).exists(), reason="needs Debian's chromium (.ci/run installs it)")
def test_no_script_from_the_store_runs_in_a_browser(served: tuple[str, HostileStore]) -> None:
    """Every page, clicked through as a person would: no dialog opens, no `javascript:` or
    foreign link is on the page, and the live refresh (the app's own script) still runs."""
    from playwright.sync_api import Dialog, sync_playwright

    base, written = served
    args = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking"]
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=args)
        try:
            page = browser.new_page()
            dialogs: list[str] = []

            def opened(dialog: Dialog) -> None:  # what alert() from the store would open
                dialogs.append(dialog.message)
                dialog.dismiss()

            page.on("dialog", opened)
            for path in _pages(written):
                page.goto(base + path)
                foreign = page.eval_on_selector_all(
                    "a[href]", "links => links.map(a => a.href).filter(h => !h.startsWith(location.origin + '/'))"
                )
                assert foreign == [], (path, foreign)
            # Click every link of the record whose parent id is a script URL: none runs.
            page.goto(base + f"/p/{SCRIPT_URL}")
            for link in page.locator("#record a").all():
                link.click()
                page.go_back()
            page.goto(base + "/")
            said = page.locator("#updated").inner_text()
            page.wait_for_function("said => document.querySelector('#updated').innerText !== said", arg=said)
            assert page.evaluate("typeof window.alert") == "function" and dialogs == []
        finally:
            browser.close()


def test_a_script_url_as_a_recorded_parent_id_is_not_a_link(tmp_path: Path) -> None:
    """Finding 1 alone: a history record (and a key naming it) whose id is `javascript:...`."""
    record = {
        "id": SCRIPT_URL,
        "type_name": "t",
        "parent_id": SCRIPT_URL,
        "outcome": "failed",
        "ended_at": "2026-01-01T00:00:00+00:00",
    }
    put(str(tmp_path), f"history/1767225600000-{SCRIPT_URL}.json", json.dumps(record).encode())
    with TestClient(create_app(str(tmp_path))) as client:
        for path in ("/history", f"/p/{quote(SCRIPT_URL, safe='')}"):
            page = client.get(path)
            assert page.status_code == 200 and SCRIPT_URL in page.text
            assert not [h for h in re.findall(r'href="([^"]*)"', page.text) if not OWN_HREF.fullmatch(h)], path


def test_an_empty_store_is_served_with_the_headers(tmp_path: Path) -> None:
    with TestClient(create_app(str(tmp_path))) as client:
        answer = client.get("/")
        assert answer.status_code == 200 and "frame-ancestors 'none'" in answer.headers["content-security-policy"]
        assert answer.headers["x-frame-options"] == "DENY" and answer.headers["x-content-type-options"] == "nosniff"
        assert "<script>" not in answer.text and client.get("/static/live.js").status_code == 200


async def test_a_page_being_computed_does_not_hold_up_another(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The listing's computation runs off the event loop: while one `/` is held inside it,
    `/api/history` answers. (Held on the loop, the second answer would come only after the
    release, which a timer gives after a while so that the test ends either way.)"""
    import procstore._web.app as web_app

    inside, release = threading.Event(), threading.Event()
    events: list[str] = []
    real_row = web_app._row

    def held_row(*args: Any) -> dict[str, Any]:  # one row of `/`: `/api/history` has none
        inside.set()
        release.wait()
        return real_row(*args)

    def release_later() -> None:
        events.append("released")
        release.set()

    monkeypatch.setattr(web_app, "_row", held_row)
    message = {"type_name": "t", "data": "{}", "parent_id": None, "step": 0}
    folder = tmp_path / "procedure" / str(ProcedureId.random())
    folder.mkdir(parents=True)
    (folder / "0000000000.step").write_text(json.dumps(message))
    timer = threading.Timer(5.0, release_later)
    app = create_app(str(tmp_path))
    transport = httpx.ASGITransport(app=app)
    async with app.router.lifespan_context(app), httpx.AsyncClient(transport=transport, base_url="http://t") as client:
        timer.start()  # before: held on the loop, nothing after this line would run until then
        slow = asyncio.ensure_future(client.get("/"))
        while not inside.is_set():
            await asyncio.sleep(0.01)
        assert (await client.get("/api/history")).status_code == 200
        events.append("other page answered")
        release.set()
        assert (await slow).status_code == 200
    timer.cancel()
    assert events[0] == "other page answered", events


def test_a_long_parent_chain_makes_bounded_pages(tmp_path: Path) -> None:
    """A chain of 300: each end's page lists 200 of the others and counts the rest; the
    parent-cycle check, the ancestors and the descendants walk it without recursion."""
    ids = [ProcedureId.random() for _ in range(300)]
    for n, pid in enumerate(ids):
        message = {"type_name": "chain", "data": "{}", "parent_id": str(ids[n - 1]) if n else None, "step": 0}
        folder = tmp_path / "procedure" / str(pid)
        folder.mkdir(parents=True)
        (folder / "0000000000.step").write_text(json.dumps(message))
    with TestClient(create_app(str(tmp_path))) as client:
        assert "99 more descendants" in client.get(f"/p/{ids[0]}").text
        assert "99 more ancestors" in client.get(f"/p/{ids[-1]}").text
        assert len(client.get(f"/api/procedures/{ids[0]}").json()["descendants"]) == 299


def test_the_json_twins_escape_what_a_terminal_obeys_and_read_back_the_same(hostile: tuple[str, HostileStore]) -> None:
    """`curl .../api/procedures` in a terminal, as `procstore ls -o json`: DEL, C1 (`\\x9b` is
    a CSI) and the bidirectional overrides were sent raw (JSON escapes C0 only); now as
    `\\u009b`, `\\u202e`, which read back as the same values."""
    url, written = hostile
    raw = re.compile("[\x7f-\x9f\u200e\u200f\u202a-\u202e\u2066-\u2069]")
    twins = ["/api/procedures", "/api/history", *(f"/api/procedures/{pid}" for pid in written.procedures)]
    with TestClient(create_app(url)) as client:
        for path in twins:
            answer = client.get(path)
            assert answer.status_code == 200 and raw.search(answer.text) is None, (path, raw.search(answer.text))
        types = {p["type"] for p in client.get("/api/procedures").json()["procedures"]}
    assert "\x9b31mC1 CSI\x9b0m" in types and "\u202eright-to-left override" in types
