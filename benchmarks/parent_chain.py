"""How long operators' views take on a store holding one long parent chain (a hostile or
corrupt store can hold one): `procstore ls`, `tree` and the web view's `/` and leaf page.

    .venv/bin/python -m benchmarks.parent_chain [LENGTH]

Run on its own (not part of `python -m benchmarks`): it prints one line per view.
"""

from __future__ import annotations

import asyncio
import json
import sys
import tempfile
import time
from pathlib import Path

from click.testing import CliRunner

from procstore._cli.app import cli
from procstore.ids import ProcedureId
from procstore.store import open_state_store


async def write_chain(url: str, length: int) -> list[ProcedureId]:
    store = open_state_store(url)
    ids = [ProcedureId.random() for _ in range(length)]
    try:
        for n, pid in enumerate(ids):
            parent = str(ids[n - 1]) if n else None
            value = {"type_name": "chain::Link", "data": "{}", "parent_id": parent, "step": 0}
            await store.put(f"procedure/{pid}/0000000000.step", json.dumps(value).encode())
    finally:
        await store.close()
    return ids


def timed(name: str, run: object) -> None:
    start = time.perf_counter()
    assert callable(run)
    try:
        outcome = run()
    except Exception as e:
        outcome = f"{type(e).__name__}"
    print(f"{name:<24} {time.perf_counter() - start:8.2f} s  {outcome}", flush=True)


def main(length: int) -> None:
    from starlette.testclient import TestClient

    from procstore._web.app import create_app

    with tempfile.TemporaryDirectory() as folder:
        url = str(Path(folder) / "store")
        Path(url).mkdir()
        ids = asyncio.run(write_chain(url, length))
        runner = CliRunner()
        timed("ls", lambda: runner.invoke(cli, ["ls", url]).exit_code)
        timed("ls -o json", lambda: runner.invoke(cli, ["ls", url, "-o", "json"]).exit_code)
        timed("tree", lambda: runner.invoke(cli, ["tree", url]).exit_code)
        timed("tree -o json", lambda: runner.invoke(cli, ["tree", url, "-o", "json"]).exit_code)
        with TestClient(create_app(url)) as client:
            timed("web /", lambda: client.get("/").status_code)
            timed("web /p/{leaf}", lambda: client.get(f"/p/{ids[-1]}").status_code)
            timed("web /p/{root}", lambda: client.get(f"/p/{ids[0]}").status_code)
        timed("delete root (declined)", lambda: runner.invoke(cli, ["delete", url, str(ids[0])], input="n\n").exit_code)


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 3000)
