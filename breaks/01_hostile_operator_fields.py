"""Hostile text in the stores' newer files (activity, requests, a step's signal name, a
history record's started/ended_by actions) reaches the CLI or the web view raw."""

import json
import tempfile
from pathlib import Path

from click.testing import CliRunner
from starlette.testclient import TestClient

from procstore._cli.app import cli
from procstore._web.app import create_app

EVIL = "\x1b]0;pwned\x07<script>alert(1)</script>\u202eevil[red]markup[/red]"
PID = "11111111-1111-4111-8111-111111111111"
ENDED = "22222222-2222-4222-8222-222222222222"
RAW = ("\x1b", "\x07", "\u202e", "<script>")

root = Path(tempfile.mkdtemp())
folder = root / "procedure" / PID
folder.mkdir(parents=True)
msg = {"type_name": "app::T", "data": "{}", "parent_id": None, "step": 0, "signal": EVIL, "wake_at": 2e9}
(folder / "0000000000.step").write_text(json.dumps(msg))
(root / "activity").mkdir()
(root / "activity" / f"{PID}.json").write_text(
    json.dumps(
        {
            "run": 1,
            "doing": "backing off",
            "since": "2026-01-01T00:00:00Z",
            "step": 0,
            "manager": EVIL,
            "attempt": 3,
            "last_error": EVIL,
            "next_try": EVIL,
            "lock": EVIL,
            "held_by": [EVIL],
            "reason": EVIL,
            "retries": [{"at": EVIL, "attempt": 1, "error": EVIL}],
        }
    )
)
(root / "requests").mkdir()
(root / "requests" / f"{PID}.json").write_text(
    json.dumps({"kind": "cancel", "reason": EVIL, "requested_at": 1.0, "requested_by": EVIL})
)
action = {"kind": "resume", "by": EVIL, "at": EVIL, "reason": EVIL}
(root / "history").mkdir()
(root / "history" / f"1767225600000-{ENDED}.json").write_text(
    json.dumps(
        {
            "id": ENDED,
            "type_name": "app::T",
            "parent_id": None,
            "outcome": "cancelled",
            "error": "e",
            "ended_at": "2026-01-01T00:00:00.000Z",
            "started_at": "2026-01-01T00:00:00.000Z",
            "run": 2,
            "started": action,
            "ended_by": {**action, "kind": "cancel"},
            "output": json.dumps(EVIL),
        }
    )
)

failures = []
runner = CliRunner()
for args in (
    ["ls", str(root)],
    ["show", str(root), PID],
    ["show", str(root), ENDED],
    ["history", str(root)],
    ["watch", str(root), "--count", "1"],
    ["tree", str(root)],
):
    out = runner.invoke(cli, args)
    text = out.output
    raw = [r for r in RAW[:3] if r in text]
    if raw or out.exit_code != 0:
        failures.append(f"procstore {args[0]}: exit {out.exit_code}, raw {raw!r}: {text[-300:]!r}")
with TestClient(create_app(str(root))) as client:
    for path in ("/", f"/p/{PID}", f"/p/{ENDED}", "/history"):
        page = client.get(path)
        raw = [r for r in RAW if r in page.text]
        if raw or page.status_code != 200:
            failures.append(f"web {path}: {page.status_code}, raw {raw!r}")
print("\n".join(failures) or "all escaped")
assert not failures
