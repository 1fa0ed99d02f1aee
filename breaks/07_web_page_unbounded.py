"""`procstore serve` over a hostile store: a procedure's page shows its input, its output and
the retries its activity lists whole, though "every page [is] bounded in total"
(tests/web/test_untrusted_pages.py): a 5 MB input or 100,000 published retries make a page
of megabytes, and the CLI's `show` the same."""

import json
import tempfile
import time
from pathlib import Path

from starlette.testclient import TestClient

from procstore._web.app import create_app

PID = "11111111-1111-4111-8111-111111111111"
root = Path(tempfile.mkdtemp())
folder = root / "procedure" / PID
folder.mkdir(parents=True)
data = json.dumps({"text": "x" * 5_000_000})
(folder / "0000000000.step").write_text(json.dumps({"type_name": "t", "data": data, "parent_id": None, "step": 0}))
(folder / "0000000001.step").write_text(json.dumps({"type_name": "t", "data": "{}", "parent_id": None, "step": 1}))
(root / "activity").mkdir()
retries = [{"at": f"2026-01-01T00:00:{i % 60:02d}Z", "attempt": i, "error": "e" * 50} for i in range(100_000)]
(root / "activity" / f"{PID}.json").write_text(
    json.dumps(
        {"run": 1, "doing": "backing off", "since": "2026-01-01T00:00:00Z", "step": 1, "attempt": 3, "retries": retries}
    )
)
with TestClient(create_app(str(root))) as client:
    began = time.monotonic()
    page = client.get(f"/p/{PID}")
    took = time.monotonic() - began
print(f"page: {page.status_code}, {len(page.content):,} bytes in {took:.1f}s")
assert len(page.content) < 2_000_000, f"a page of {len(page.content):,} bytes"
