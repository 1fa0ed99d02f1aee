"""B1: a `.trash` the user owns (Obsidian/other tools use that name), or a `.trash` symlink,
is emptied by ANY check_access: every manager start and every CLI command, `procstore ls`
(a read-only listing) included. Files procstore never wrote are deleted.
Run: .venv/bin/python breaks/b1_user_trash_wiped.py   (exit 1 = broken)"""
import os, subprocess, sys, tempfile, time
from pathlib import Path

exe = Path(sys.executable).with_name("procstore")
bad = []
with tempfile.TemporaryDirectory() as tmp:
    # 1. a real .trash folder with the user's files, in the store root
    root = Path(tmp, "store"); (root / ".trash" / "my-notes").mkdir(parents=True)
    (root / ".trash" / "my-notes" / "todo.md").write_text("keep me")
    # 2. a .trash symlink to a precious folder elsewhere
    root2 = Path(tmp, "store2"); root2.mkdir()
    precious = Path(tmp, "precious"); (precious / "photos").mkdir(parents=True)
    (precious / "photos" / "a.jpg").write_text("x")
    os.symlink(precious, root2 / ".trash")
    for r in (root, root2):
        subprocess.run([exe, "ls", str(r)], capture_output=True)  # read-only command
    time.sleep(0.5)
    if not (root / ".trash" / "my-notes" / "todo.md").exists():
        bad.append("procstore ls deleted the user's .trash/my-notes/todo.md")
    if not (precious / "photos" / "a.jpg").exists():
        bad.append(f"procstore ls deleted {precious}/photos through the .trash symlink")
print("\n".join(bad) or "held")
sys.exit(1 if bad else 0)
