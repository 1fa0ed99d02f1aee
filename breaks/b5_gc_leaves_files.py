"""B5: `procstore gc` ("for stores no one starts") reports every finished procedure deleted
but exits while its daemon workers still rmtree the trash: the files stay on disk, hidden.
Run: .venv/bin/python breaks/b5_gc_leaves_files.py   (exit 1 = broken)"""
import asyncio, os, subprocess, sys, tempfile, uuid
from pathlib import Path
from procstore.store import open_state_store

STEPS, PROCS = 300, 40


async def fill(root: str) -> None:
    store = open_state_store(root)
    await store.check_access()
    value = b'{"type_name":"T","data":"{}","parent_id":null,"step":0}'
    for _ in range(PROCS):
        pid = uuid.uuid4()
        await asyncio.gather(*(store.put(f"procedure/{pid}/{i:010d}.step", value) for i in range(STEPS)))
        await store.put(f"procedure/{pid}/{STEPS:010d}.commit", b"")


with tempfile.TemporaryDirectory() as root:
    asyncio.run(fill(root))
    exe = Path(sys.executable).with_name("procstore")
    out = subprocess.run([exe, "gc", root], capture_output=True, text=True)
    print((out.stdout.strip() or out.stderr.strip()).splitlines()[-1])
    left = sum(len(f) for _d, _s, f in os.walk(root))
    print(f"files left on disk after gc: {left} (of {PROCS * (STEPS + 1)})")
    sys.exit(1 if left else 0)
