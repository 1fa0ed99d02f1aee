"""The web view's operator actions: through `Client`, with this server's token, only where enabled."""

from __future__ import annotations

import asyncio
import os
import re
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import uvicorn
from click.testing import CliRunner
from starlette.testclient import TestClient

from procstore import Client
from procstore._cli.app import cli
from procstore._web.app import create_app
from procstore.store import open_state_store
from procstore.testing.pytest_plugin import free_port
from tests.cli.store_builder import MixedStore, build_mixed_store
from tests.web.test_serve import CHROMIUM

SCREENSHOTS = os.environ.get("PROCSTORE_DOCS_SCREENSHOTS")
"""A folder to write the docs' screenshots to (docs/images), when set."""


@pytest.fixture
def mixed(tmp_path: Path) -> tuple[str, MixedStore]:
    url = str(tmp_path / "cp")
    return url, asyncio.run(build_mixed_store(open_state_store(url), ""))


def _token(page: str) -> str:
    found = re.search(r'name="token" value="([^"]+)"', page)
    assert found is not None, page[:2000]
    return found.group(1)


def _pending(url: str, pid: str) -> object:
    async def read() -> object:
        async with Client(url) as client:
            return (await client.get(pid)).pending

    return asyncio.run(read())


def test_a_cancel_with_a_reason_goes_through_the_client_with_the_servers_token(mixed: tuple[str, MixedStore]) -> None:
    url, store = mixed
    with TestClient(create_app(url, actions=True)) as client:
        page = client.get(f"/p/{store.migration}").text
        token = _token(page)
        assert 'id="actions"' in page and "cancel" in page and "rewind" in page
        forged = client.post(f"/p/{store.migration}/action", data={"action": "cancel", "reason": "x"})
        assert forged.status_code == 403 and _pending(url, store.migration) is None
        stale = client.post(f"/p/{store.migration}/action", data={"action": "cancel", "token": "guess"})
        assert stale.status_code == 403 and _pending(url, store.migration) is None
        done = client.post(
            f"/p/{store.migration}/action",
            data={"action": "cancel", "reason": "wrong <b>region</b>", "token": token},
            follow_redirects=False,
        )
        assert done.status_code == 303 and "said=" in done.headers["location"]
        pending = _pending(url, store.migration)
        assert pending is not None and pending.kind == "cancel" and pending.reason == "wrong <b>region</b>"  # type: ignore[attr-defined]
        shown = client.get(done.headers["location"].replace("../", "/p/")).text
        assert "wrong &lt;b&gt;region&lt;/b&gt;" in shown and 'id="pending"' in shown and "cancel stored" in shown
        spoofed = client.get(f"/p/{store.migration}?said=made-up&done=rewind+stored").text
        assert 'id="said"' not in spoofed  # a link cannot claim an action nobody took
        refused = client.post(
            f"/p/{store.migration}/action", data={"action": "resume", "token": token}, follow_redirects=False
        )
        assert refused.status_code == 303
        said = client.get(refused.headers["location"].replace("../", "/p/")).text
        assert "refused: " in said and "unfinished" in said


def test_without_actions_there_is_no_form_and_a_post_is_refused(mixed: tuple[str, MixedStore]) -> None:
    url, store = mixed
    with TestClient(create_app(url)) as client:
        page = client.get(f"/p/{store.migration}").text
        assert 'id="actions"' not in page and 'name="token"' not in page
        answer = client.post(f"/p/{store.migration}/action", data={"action": "cancel", "token": "x"})
        assert answer.status_code == 403 and _pending(url, store.migration) is None


@pytest.mark.parametrize(
    ("flags", "actions"),
    [
        (["--host", "127.0.0.1"], True),
        (["--host", "127.0.0.1", "--read-only"], False),
        (["--host", "0.0.0.0"], False),
        (["--host", "0.0.0.0", "--allow-actions"], True),
    ],
)
def test_actions_are_on_for_a_loopback_address_and_elsewhere_only_when_allowed(
    flags: list[str], actions: bool, mixed: tuple[str, MixedStore], monkeypatch: pytest.MonkeyPatch
) -> None:
    url, store = mixed
    apps = []
    monkeypatch.setattr(uvicorn, "run", lambda app, **_: apps.append(app))
    result = CliRunner().invoke(cli, ["serve", url, *flags])
    assert result.exit_code == 0, result.output
    with TestClient(apps[0], headers={"Host": "127.0.0.1:8600"}) as client:
        assert ('id="actions"' in client.get(f"/p/{store.migration}").text) == actions


def test_the_overview_searches_and_pages(tmp_path: Path) -> None:
    from tests.support import put_now as put

    url = str(tmp_path)
    for n in range(250):
        kind = "alpha" if n % 2 else "beta"
        value = f'{{"type_name":"t::{kind}","data":"{{}}","parent_id":null,"step":0}}'.encode()
        put(url, f"procedure/00000000-0000-4000-8000-{n:012d}/0000000000.step", value)
    with TestClient(create_app(url)) as client:
        first = client.get("/").text
        assert "100 shown of 250, page 1 of 3" in first and 'id="next"' in first and 'id="previous"' not in first
        last = client.get("/?page=3").text
        assert "50 shown of 250, page 3 of 3" in last and 'id="next"' not in last
        alpha = client.get("/?q=alpha").text
        assert "of 125" in alpha and "t::beta" not in alpha.split('id="procedures"')[1]
        one = client.get("/?q=00000000-0000-4000-8000-000000000042").text
        assert "1 shown of 1" in one


@pytest.fixture
def served(mixed: tuple[str, MixedStore]) -> Iterator[tuple[str, str, MixedStore]]:
    url, store = mixed
    port = free_port()
    app = create_app(url, refresh=0.3, actions=True)
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
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
    yield base, url, store
    server.should_exit = True
    thread.join(10)


@pytest.mark.skipif(not Path(CHROMIUM).exists(), reason="needs Debian's chromium (.ci/run installs it)")
def test_an_operator_cancels_with_a_reason_in_a_browser(served: tuple[str, str, MixedStore], tmp_path: Path) -> None:
    from playwright.sync_api import sync_playwright

    base, url, store = served
    shots = Path(SCREENSHOTS) if SCREENSHOTS else tmp_path
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=["--headless", "--no-sandbox", "--disable-gpu"])
        try:
            page = browser.new_page(viewport={"width": 1100, "height": 900})
            page.goto(base + "/?q=metasrv")
            page.screenshot(path=str(shots / "serve-overview.png"), full_page=True)
            page.goto(base + f"/p/{store.migration}")
            page.fill("input[name=reason]", "the target datanode is being drained")
            page.wait_for_timeout(700)  # two live refreshes: the reason typed stays
            assert page.input_value("input[name=reason]") == "the target datanode is being drained"
            page.click("button[value=cancel]")
            page.wait_for_selector("#pending")
            assert "the target datanode is being drained" in page.locator("#pending").inner_text()
            assert "cancel stored" in page.locator("#said").inner_text()
            page.screenshot(path=str(shots / "serve-procedure.png"), full_page=True)
        finally:
            browser.close()
    pending = _pending(url, store.migration)
    assert pending is not None and pending.reason == "the target datanode is being drained"  # type: ignore[attr-defined]


def test_a_hostile_page_number_is_page_one(tmp_path: Path) -> None:
    (tmp_path / "procedure").mkdir()
    with TestClient(create_app(str(tmp_path))) as client:
        for page in ("²", "9" * 5000, "-1", "0", "x", "1e9"):
            assert client.get("/", params={"page": page}).status_code == 200, page
            assert client.get("/api/procedures", params={"page": page}).status_code == 200, page


def test_a_duration_is_never_negative() -> None:
    from procstore._web.app import _duration

    assert _duration(-5.0) == "0.0s" and _duration(3725.0) == "1h02m05s"
