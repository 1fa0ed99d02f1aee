"""`procstore lease` on a store whose managers lead by lease, on a local directory and S3."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from procstore import Lease, ProcedureManager
from procstore._cli.common import ExitCode
from procstore._runtime.lease import LEASE_KEY, LeaseRecord
from procstore.store import open_state_store
from procstore.testing.pytest_plugin import create_bucket, s3_storage_options
from tests.cli.test_commands import Place


@pytest.fixture(params=["local", "s3"])
def place(request: pytest.FixtureRequest, tmp_path: Path) -> Place:
    if request.param == "local":
        (tmp_path / "cp").mkdir()
        return Place(str(tmp_path / "cp"), {})
    endpoint = request.getfixturevalue("procstore_moto_endpoint")
    return Place(f"s3://{create_bucket(endpoint)}/cp", s3_storage_options(endpoint))


def put(place: Place, key: str, value: bytes) -> None:
    async def write() -> None:
        store = open_state_store(place.url, place.options)
        try:
            await store.put(key, value)
        finally:
            await store.close()

    asyncio.run(write())


def test_no_lease_is_not_found(place: Place) -> None:
    put(place, "procedure/.keep", b"")  # an existing, lease-less store
    result = place.run("lease")
    assert result.exit_code == ExitCode.NOT_FOUND, result.output
    assert "no lease at" in result.output and LEASE_KEY in result.output


def test_shows_the_holder_and_whether_it_holds(place: Place) -> None:
    async def lead_and_stop() -> None:
        manager = ProcedureManager(place.url, place.options, lease=Lease(ttl=5, holder="cp-7:7000"))
        await manager.start()
        await manager.stop()  # marks the lease released

    asyncio.run(lead_and_stop())
    result = place.run("lease")
    assert result.exit_code == 0, result.output
    assert "cp-7:7000" in result.output and "released" in result.output

    put(place, LEASE_KEY, LeaseRecord("cp-8:7000", epoch=2, renewal=9, ttl=600).encode())
    result = place.run("lease", "--json")
    assert result.exit_code == 0, result.output
    shown = json.loads(result.output)
    assert shown["holder"] == "cp-8:7000" and shown["epoch"] == 2 and shown["state"] == "held"


def test_an_unreadable_lease_names_the_key(place: Place) -> None:
    put(place, LEASE_KEY, b'{"holder": "cp-1", "epo')
    result = place.run("lease")
    assert result.exit_code == ExitCode.UNREADABLE, result.output
    assert LEASE_KEY in result.output and "not a lease record" in result.output
