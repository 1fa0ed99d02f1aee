"""`procstore signal ID NAME --payload JSON` parses the payload with orjson, which reads an
integer beyond 64 bits as a float: 123456789012345678901234567890 is stored (and delivered)
as 1.2345678901234568e+29, silently. `Client.signal` refuses such an integer (TypeError)."""

import json
import tempfile
from pathlib import Path

from click.testing import CliRunner

from procstore._cli.app import cli

PID = "11111111-1111-4111-8111-111111111111"
root = Path(tempfile.mkdtemp())
folder = root / "procedure" / PID
folder.mkdir(parents=True)
(folder / "0000000000.step").write_text(json.dumps({"type_name": "t", "data": "{}", "parent_id": None, "step": 0}))
BIG = '{"id": 123456789012345678901234567890}'
result = CliRunner().invoke(cli, ["signal", str(root), PID, "go", "--payload", BIG])
print(result.exit_code, result.output.strip()[-200:])
stored = [p.read_text() for p in (root / "requests" / "signals" / PID).glob("*.json")] if result.exit_code == 0 else []
assert not any("e+29" in s for s in stored), f"the payload was stored changed: {stored}"
