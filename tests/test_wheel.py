"""The wheel, installed into a fresh venv without the development extras, runs the demo
and imports the testing toolkit: what a user's `pip install procstore` gets."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.slow
def test_the_wheel_installs_and_runs_without_dev_extras(tmp_path: Path) -> None:
    uv = Path(sys.executable).parent / "uv"
    subprocess.run(
        [str(uv), "build", "--wheel", "-q", "-o", str(tmp_path / "dist"), str(ROOT)], check=True, timeout=300
    )
    (wheel,) = (tmp_path / "dist").glob("procstore-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    tops = {name.split("/", 1)[0] for name in names if not name.startswith("procstore-")}
    assert tops == {"procstore", "procstore_machines"}, tops  # no generic top-level package
    assert any(name.endswith("LICENSE") for name in names) and any(name.endswith("NOTICE") for name in names)
    assert {"procstore/_web/templates/index.html", "procstore/_web/templates/procedure.html"} <= set(names)

    venv = tmp_path / "venv"
    subprocess.run([str(uv), "venv", "-q", "-p", sys.executable, str(venv)], check=True, timeout=120)
    python = venv / "bin" / "python"
    install = [str(uv), "pip", "install", "-q", "-p", str(python), "-r", str(ROOT / "requirements" / "run.txt")]
    subprocess.run([*install, "--no-deps", str(wheel)], check=True, timeout=300)

    demo = subprocess.run(
        [str(venv / "bin" / "procstore"), "demo", "--seed", "3", "--store", str(tmp_path / "store")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert demo.returncode == 0 and "invariants hold" in demo.stdout, demo.stdout + demo.stderr
    imported = subprocess.run([str(python), "-c", "import procstore.testing"], capture_output=True, text=True)
    assert imported.returncode == 0, imported.stderr
    # Without the web extra, `serve` says what to install (and nothing else breaks).
    serve = subprocess.run([str(venv / "bin" / "procstore"), "serve", str(tmp_path / "store")], capture_output=True,
                           text=True, timeout=60)  # fmt: skip
    assert serve.returncode == 2 and "pip install 'procstore[web]'" in serve.stderr, serve.stderr

    # A user's project with pytest but without hypothesis or moto: the plugin loads, and
    # pytest runs a test of theirs.
    lock = str(ROOT / "requirements" / "dev.txt")
    subprocess.run([str(uv), "pip", "install", "-q", "-p", str(python), "pytest", "-c", lock], check=True, timeout=300)
    project = tmp_path / "project"
    project.mkdir()
    (project / "test_mine.py").write_text("def test_mine(procstore_store):\n    assert procstore_store.url\n")
    run = subprocess.run(
        [str(python), "-m", "pytest", "-q", "-p", "no:cacheprovider", "-k", "memory"],
        cwd=project,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert "1 passed" in run.stdout, run.stdout + run.stderr
    no_hypothesis = subprocess.run([str(python), "-c", "import hypothesis"], capture_output=True, timeout=60)
    assert no_hypothesis.returncode != 0
