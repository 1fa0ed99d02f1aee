"""The pytest plugin's fixtures, as a user's test suite gets them (entry point `procstore`)."""

from __future__ import annotations

from collections.abc import Callable

from procstore.testing import CrashExplorer
from procstore.testing.pytest_plugin import StoreUnderTest
from tests.testing.test_explorer import Deposits


async def test_explorer_fixture_on_every_store(
    procstore_store: StoreUnderTest, procstore_explorer: Callable[..., CrashExplorer]
) -> None:
    report = await procstore_explorer(Deposits(idempotent=True)).explore()
    report.assert_ok()
    assert report.explored == 14


async def test_store_fixture_is_usable(procstore_store: StoreUnderTest) -> None:
    from procstore.store import open_state_store

    store = open_state_store(procstore_store.url, procstore_store.storage_options)
    try:
        await store.check_access()
        await store.put("k", b"v")
        assert await store.get("k") == b"v"
    finally:
        await store.close()


def test_the_moto_endpoint_sends_one_server_header(procstore_moto_endpoint: str) -> None:
    # Two make aiohttp refuse every answer under `python -X dev`: "Duplicate 'Server' header found".
    import http.client
    from urllib.parse import urlsplit

    url = urlsplit(procstore_moto_endpoint)
    connection = http.client.HTTPConnection(url.hostname or "", url.port, timeout=10)
    try:
        connection.request("GET", "/")
        response = connection.getresponse()
        response.read()
        assert len(response.msg.get_all("Server") or []) == 1, response.msg.get_all("Server")
    finally:
        connection.close()
