"""Every Python block in the README and the docs is complete and runs.

Each block runs in its own interpreter, in an empty temporary folder, as a reader who
copies it into a file would run it.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
_BLOCK = re.compile(r"^```python\n(.*?)^```", re.M | re.S)


def python_blocks() -> list[tuple[str, str]]:
    found = []
    for page in PAGES:
        for n, block in enumerate(_BLOCK.findall(page.read_text()), start=1):
            found.append((f"{page.relative_to(ROOT)}#{n}", block))
    return found


def test_the_docs_have_examples() -> None:
    pages = {name.split("#")[0] for name, _ in python_blocks()}
    assert {"README.md", "docs/writing-procedures.md", "docs/state-machines.md", "docs/testing.md"} <= pages


@pytest.mark.parametrize(("where", "code"), python_blocks(), ids=[name for name, _ in python_blocks()])
def test_code_block_runs(tmp_path: Path, where: str, code: str) -> None:
    script = tmp_path / "example.py"
    script.write_text(code)
    result = subprocess.run(
        [sys.executable, str(script)], cwd=tmp_path, capture_output=True, text=True, timeout=120, check=False
    )
    assert result.returncode == 0, f"{where} failed:\n{result.stdout}\n{result.stderr}"
