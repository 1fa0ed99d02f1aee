"""The README's quick-start commands are the ones CI runs, verbatim."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def quick_start_commands() -> list[str]:
    readme = (ROOT / "README.md").read_text()
    block = readme.split("<!-- ci:commands -->", 1)[1].split("```sh", 1)[1].split("```", 1)[0]
    return [line for line in block.splitlines() if line and not line.startswith("#")]


def test_two_commands_demo_then_tests() -> None:
    demo, tests = quick_start_commands()
    assert demo.startswith("python3 -m venv .venv && ") and demo.endswith("procstore demo")
    assert re.search(r"python -m pytest$", tests)
    # Nothing but the lock: the stock pip installs a pinned uv, which installs the rest.
    for command in (demo, tests):
        assert "pip install -q -r requirements/uv.txt" in command
        assert "--upgrade" not in command and " -U " not in command


def test_ci_takes_the_commands_from_the_readme() -> None:
    ci = (ROOT / ".ci" / "run").read_text()
    assert "ci:commands" in ci  # extracted at run time, so the two can never drift
