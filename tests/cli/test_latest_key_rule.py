"""Every reader of a folder ranks its keys alike: a `.rollback` over a `.step` at one step,
whatever order a listing gives them in."""

from __future__ import annotations

from pathlib import Path

from click.testing import CliRunner

from procstore._cli.app import cli
from procstore._cli.common import ExitCode
from tests.greptime import greptime_step

_PID = "d0000000-0000-4000-8000-000000000001"


def test_resume_reads_a_rollback_and_a_step_at_one_step_as_recovery_does(tmp_path: Path) -> None:
    """Recovery runs this procedure's rollback (`.rollback` ranks over `.step` at step 1);
    `procstore resume` names the same latest key in its refusal, not the `.step`."""
    folder = tmp_path / "procedure" / _PID
    folder.mkdir(parents=True)
    (folder / "0000000000.step").write_bytes(greptime_step("T", "0", 0))
    (folder / "0000000001.rollback").write_bytes(greptime_step("T", "1", 1, error="boom"))
    (folder / "0000000001.step").write_bytes(greptime_step("T", "1", 1))
    result = CliRunner().invoke(cli, ["resume", str(tmp_path), _PID])
    assert result.exit_code == ExitCode.REFUSED, result.output
    assert "its latest key is 1.rollback" in result.output, result.output
