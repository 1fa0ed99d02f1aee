"""The README's quick-start commands are the ones CI runs."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def quick_start_commands() -> list[str]:
    readme = (ROOT / "README.md").read_text()
    block = readme.split("## Quick start", 1)[1].split("```sh", 1)[1].split("```", 1)[0]
    return [line for line in block.splitlines() if line and not line.startswith("#")]


def test_two_commands_demo_then_tests() -> None:
    demo, tests = quick_start_commands()
    assert demo.endswith("procstore demo")
    assert re.search(r"python -m pytest$", tests)


def test_ci_runs_the_readme_test_command_verbatim() -> None:
    ci = (ROOT / ".ci" / "run").read_text().splitlines()
    assert quick_start_commands()[1] in ci
