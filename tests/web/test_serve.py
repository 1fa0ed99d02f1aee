"""`procstore serve`: over HTTP, and as a person sees it in a real headless Chromium."""

from __future__ import annotations

import asyncio
import json
import shutil
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import uvicorn
from click.testing import CliRunner
from starlette.testclient import TestClient

from procstore._cli.app import cli
from procstore._runtime.lease import LEASE_KEY
from procstore._web.app import create_app
from procstore.store import open_state_store
from procstore.store.history import HistoryStore
from procstore.store.local import LocalDirStore
from procstore.testing.pytest_plugin import free_port
from tests.cli.store_builder import MixedStore, build_mixed_store
from tests.support import put_now as put

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"


@pytest.fixture
def mixed(tmp_path: Path) -> tuple[str, MixedStore]:
    """Procedures in every state: unfinished, committed, rolling back, unreadable, a child."""
    url = str(tmp_path / "cp")
    built = asyncio.run(build_mixed_store(open_state_store(url), ""))
    put(url, LEASE_KEY, b'{"holder":"cp-1:7000","epoch":3,"renewal":5,"ttl":10.0,"released":false}')
    return url, built


def test_the_list_the_counts_and_the_lease(mixed: tuple[str, MixedStore]) -> None:
    url, store = mixed
    with TestClient(create_app(url)) as client:
        page = client.get("/")
        assert page.status_code == 200
        assert "10</b> procedures" in page.text and "4 unfinished" in page.text and "2 unreadable" in page.text
        assert "held by <b>cp-1:7000</b>, epoch 3" in page.text
        assert "restore a good value" in page.text  # what to do with an unreadable one
        filtered = client.get("/", params={"status": "rolling back"}).text
        assert store.rolling_back in filtered and store.migration not in filtered
        data = client.get("/api/procedures").json()
        assert data["counts"]["done"] == 3 and len(data["procedures"]) == 10


def test_one_procedure_its_tree_and_its_decoded_steps(mixed: tuple[str, MixedStore]) -> None:
    url, store = mixed
    with TestClient(create_app(url)) as client:
        child = client.get(f"/p/{store.running_child}").text
        assert "ancestor" in child and store.parent[:8] in child
        migration = client.get(f"/p/{store.migration[:8]}").text
        assert "step 1 step" in migration and 'class="changed"' in migration  # a field that changed
        rolling = client.get(f"/p/{store.rolling_back}").text
        assert "error:" in rolling
        torn = client.get(f"/p/{store.truncated}").text
        assert "unreadable:" in torn and "restore a good value" in torn
        assert client.get("/p/ffffffff").status_code == 404


def test_only_a_parent_in_the_store_is_linked(mixed: tuple[str, MixedStore]) -> None:
    url, store = mixed
    orphan, gone = str(uuid.uuid4()), str(uuid.uuid4())
    message = {"type_name": "test::Orphan", "data": "{}", "parent_id": gone, "step": 0}
    put(url, f"procedure/{orphan}/0000000000.step", json.dumps(message).encode())
    with TestClient(create_app(url)) as client:
        page = client.get("/").text
        assert f'href="p/{gone}"' not in page and f"{gone[:8]} (missing)" in page
        assert f'href="p/{store.parent}"' in page  # the running child's parent is stored
        assert client.get(f"/p/{store.parent}").status_code == 200


def test_the_history_of_ended_procedures_and_their_pages(tmp_path: Path) -> None:
    """Managers with history=: the records are listed, and `/p/{id}` of an id whose keys are
    gone shows its record (as `procstore show` does)."""
    from procstore import ProcedureFailed, ProcedureWithId
    from tests.procedures import Parent, World
    from tests.runtime.helpers import steps
    from tests.support import manager_for

    url = str(tmp_path)
    world = World.new()
    with TestClient(create_app(url)) as client:
        assert "No history records" in client.get("/history").text

    async def end_some() -> tuple[str, str, str]:
        async with manager_for(LocalDirStore(tmp_path), history=True) as manager:
            parent = ProcedureWithId.new(Parent.create(world, ["a"]))
            await (await manager.submit(parent)).wait()
            # History orders ends to the millisecond: the failing one's must come after.
            await asyncio.sleep(0.02)
            failing = steps(world, 3, fail_at=1, name="<b>boom</b>")
            with pytest.raises(ProcedureFailed):
                await (await manager.submit(failing)).wait()
            child = next(r.id for r in await HistoryStore(LocalDirStore(tmp_path)).list() if r.parent_id)
        return str(parent.id), str(failing.id), child

    parent, failing, child = asyncio.run(end_some())
    with TestClient(create_app(url)) as client:
        page = client.get("/history")
        assert page.status_code == 200 and "3</b> records" in page.text
        for pid in (parent, failing, child):
            assert f'href="p/{pid}"' in page.text and pid[:8] in page.text
        assert "1 failed" in page.text and "2 done" in page.text and "<b>boom" not in page.text
        ended = client.get(f"/p/{failing[:8]}")
        assert ended.status_code == 200 and "its keys are gone" in ended.text and "failed" in ended.text
        assert "&lt;b&gt;boom" in ended.text  # escaped
        assert f'href="../p/{parent}"' in client.get(f"/p/{child}").text  # its parent has a page: its record
        assert client.get(f"/api/procedures/{parent}").json()["ended"]["outcome"] == "done"
        assert client.get("/api/history").json()["records"][0]["id"] == failing  # newest first
        assert client.get("/p/ffffffff").status_code == 404


def test_stored_values_are_escaped(tmp_path: Path) -> None:
    url = str(tmp_path)
    pid = str(uuid.uuid4())
    evil = "<script>alert(1)</script>"
    message = {"type_name": evil, "data": json.dumps({"x": evil}), "parent_id": None, "step": 0}
    put(url, f"procedure/{pid}/0000000000.step", json.dumps(message).encode())
    with TestClient(create_app(url)) as client:
        for path in ("/", f"/p/{pid}"):
            text = client.get(path).text
            assert evil not in text and "&lt;script&gt;" in text


def test_a_failed_procedure_and_a_rolled_back_one_are_told_apart_by_their_end_records(tmp_path: Path) -> None:
    """Kept by keep_failed: one without rollback and one that rolled back are stored alike
    (`.rollback`, then `.commit`); the web view and `procstore ls` say what their end records
    say: `failed`, and `rolled back` for the one whose rollback ran."""
    from procstore import ProcedureFailed, ProcedureWithId
    from tests.procedures import Undoable, World
    from tests.runtime.helpers import steps
    from tests.support import manager_for

    url = str(tmp_path)
    world = World.new()

    async def fail_two() -> list[str]:
        ids = []
        async with manager_for(LocalDirStore(tmp_path), keep_failed=True) as manager:
            for procedure in (
                steps(world, 3, fail_at=1),
                ProcedureWithId.new(Undoable({"world": world.name, "steps": 3, "fail_at": 1})),
            ):
                with pytest.raises(ProcedureFailed):
                    await (await manager.submit(procedure)).wait()
                ids.append(str(procedure.id))
        return ids

    ids = asyncio.run(fail_two())
    with TestClient(create_app(url)) as client:
        data = client.get("/api/procedures").json()
        assert [p["status"] for p in data["procedures"]] == ["failed", "rolled back"]
        assert data["counts"]["failed"] == data["counts"]["rolled back"] == 1
        assert "1 failed" in client.get("/").text and "1 rolled back" in client.get("/").text
        page = client.get(f"/p/{ids[0]}").text
        assert "failed-note" in page
        assert "failed: the procedure failed and ended" in page and "the procedure finished" not in page
    listed = CliRunner().invoke(cli, ["ls", url, "--json"])
    assert [json.loads(line)["status"] for line in listed.output.splitlines()] == ["failed", "rolled back"]
    rolled_back = CliRunner().invoke(cli, ["ls", url, "--status", "rolled-back", "--json"]).output
    assert [json.loads(line)["id"] for line in rolled_back.splitlines()] == [ids[1]]


def test_an_unreadable_store_answers_503_with_the_reason() -> None:
    with TestClient(create_app("http://127.0.0.1:1/x")) as client:
        page = client.get("/")
        assert page.status_code == 503 and "cannot be read" in page.text


def test_serve_without_the_web_extra_says_what_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    import builtins

    real_import = builtins.__import__

    def no_uvicorn(name: str, *args: object, **kwargs: object) -> object:
        if name == "uvicorn":
            raise ImportError("No module named 'uvicorn'", name="uvicorn")
        return real_import(name, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(builtins, "__import__", no_uvicorn)
    result = CliRunner().invoke(cli, ["serve", "/tmp"])
    assert result.exit_code == 2 and "pip install 'procstore[web]'" in result.output


@pytest.mark.parametrize("url", ["nosuch://bucket/x", "missing/store"])
def test_serve_on_a_bad_url_is_a_one_line_error(url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(uvicorn, "run", lambda *a, **k: pytest.fail("the server started"))
    result = CliRunner().invoke(cli, ["serve", url])
    assert result.exit_code == 3, result.output
    assert "Error: " in result.output and "Traceback" not in result.output
    assert not (tmp_path / "missing").exists()  # nothing created


@pytest.mark.parametrize(("listen", "foreign"), [("127.0.0.1", 400), ("::1", 400), ("0.0.0.0", 200)])
def test_serve_on_a_loopback_address_answers_only_its_own_host_names(
    listen: str, foreign: int, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Against DNS rebinding: a page of attacker.example that resolves to 127.0.0.1 gets nothing."""
    apps = []
    monkeypatch.setattr(uvicorn, "run", lambda app, **_: apps.append(app))
    result = CliRunner().invoke(cli, ["serve", str(tmp_path), "--host", listen])
    assert result.exit_code == 0, result.output
    assert ("not a loopback address" in result.output) == (foreign == 200)  # exposed: said so
    with TestClient(apps[0]) as client:
        assert client.get("/api/procedures", headers={"Host": "attacker.example:8600"}).status_code == foreign
        for own in ("127.0.0.1:8600", "localhost:8600", "[::1]:8600"):
            assert client.get("/api/procedures", headers={"Host": own}).status_code == 200


@pytest.mark.parametrize(("listen", "shown"), [("::1", "http://[::1]:8123/"), ("127.0.0.1", "http://127.0.0.1:8123/")])
def test_serve_prints_a_url_that_opens(
    listen: str, shown: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(uvicorn, "run", lambda *a, **k: None)
    result = CliRunner().invoke(cli, ["serve", str(tmp_path), "--host", listen, "--port", "8123"])
    assert result.exit_code == 0 and f"on {shown} " in result.output, result.output


@pytest.fixture
def served(mixed: tuple[str, MixedStore]) -> Iterator[tuple[str, str, MixedStore]]:
    url, store = mixed
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
    yield base, url, store
    server.should_exit = True
    thread.join(10)


@pytest.mark.skipif(not Path(CHROMIUM).exists(), reason="needs Debian's chromium (.ci/run installs it)")
def test_the_list_fits_an_80_column_window(served: tuple[str, str, MixedStore], tmp_path: Path) -> None:
    """640 px wide: nothing scrolls sideways; ids, types, statuses and parents stay."""
    from playwright.sync_api import sync_playwright

    base, _, store = served
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=["--headless", "--no-sandbox", "--disable-gpu"])
        try:
            page = browser.new_page(viewport={"width": 640, "height": 900})
            page.goto(base + "/")
            page.screenshot(path=str(tmp_path / "procstore-serve-640.png"), full_page=True)
            widths = page.evaluate(
                "() => [document.documentElement.scrollWidth,"
                " document.querySelector('#procedures').getBoundingClientRect().right]"
            )
            assert widths[0] <= 640 and widths[1] <= 640, widths
            table = page.locator("#procedures").inner_text()
            assert store.parent[:8] in table and "metasrv-procedure::RegionMigration" in table and "unreadable" in table
            page.goto(base + f"/p/{store.migration}")
            assert page.evaluate("document.documentElement.scrollWidth") <= 640
        finally:
            browser.close()


@pytest.mark.skipif(not Path(CHROMIUM).exists(), reason="needs Debian's chromium (.ci/run installs it)")
def test_a_person_sees_the_store_in_a_browser_and_it_updates_live(
    served: tuple[str, str, MixedStore], tmp_path: Path
) -> None:
    from playwright.sync_api import sync_playwright

    base, url, store = served
    args = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
            "--disable-background-networking", "--disable-component-update", "--disable-sync"]  # fmt: skip
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=args)
        try:
            page = browser.new_page()
            page.goto(base + "/")
            counts = page.locator("#counts").inner_text()
            assert "10 procedures" in counts and "1 rolling back" in counts and "2 unreadable" in counts
            assert "cp-1:7000" in page.locator("#lease").inner_text()
            table = page.locator("#procedures").inner_text()
            assert "metasrv-procedure::RegionMigration" in table and "unreadable" in table
            page.screenshot(path=str(tmp_path / "procstore-serve.png"), full_page=True)
            # A procedure appears in the store: the page shows it without a reload.
            # (in a thread: Playwright's sync API runs an event loop in this one)
            key = f"procedure/{uuid.uuid4()}/0000000000.step"
            value = b'{"type_name":"live::Arrived","data":"{}","parent_id":null,"step":0}'
            writer = threading.Thread(target=put, args=(url, key, value))
            writer.start()
            writer.join()
            # Predicates as functions: the page's Content-Security-Policy forbids evaluating strings.
            arrived = "() => document.querySelector('#counts').innerText.includes('11 procedures')"
            page.wait_for_function(arrived, timeout=10_000)
            assert "live::Arrived" in page.locator("#procedures").inner_text()
            # A filter picked but not yet submitted survives the live updates.
            page.select_option("select[name=status]", "unreadable")
            said = page.locator("#updated").inner_text()
            page.wait_for_function("said => document.querySelector('#updated').innerText !== said", arg=said)
            page.wait_for_timeout(700)  # two refreshes more
            assert page.eval_on_selector("select[name=status]", "e => e.value") == "unreadable"
            page.click(f"text={store.truncated[:8]}")
            page.wait_for_selector("#steps")
            assert "unreadable" in page.locator("#steps").inner_text()
            page.screenshot(path=str(tmp_path / "procstore-serve-procedure.png"), full_page=True)
        finally:
            browser.close()
    assert (tmp_path / "procstore-serve.png").stat().st_size > 1000


def test_serve_on_a_host_that_is_not_utf8_is_a_usage_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`--host $'\\xff'` (a shell passes the byte as a lone surrogate) was an internal error."""
    (tmp_path / "procedure").mkdir()
    monkeypatch.setattr(uvicorn, "run", lambda *a, **k: pytest.fail("the server started"))
    result = CliRunner().invoke(cli, ["serve", str(tmp_path), "--host", "\udcff"])
    assert result.exit_code == 2 and "valid Unicode" in result.output, result.output
