"""B3: walks now prune EVERY dot folder below the walk's base, not just the root's trash: a
key under a dot folder is listed by one prefix and not by a shorter one (before 6300807
and on every other backend, both list it). E.g. a manager with parent_path=".greptime":
`procstore ls ROOT` (no --parent-path) no longer points at the misplaced keys.
Run: .venv/bin/python breaks/b3_walk_hides_dot_folders.py   (exit 1 = broken)"""
import asyncio, sys, tempfile
from procstore.store import open_state_store


async def main() -> int:
    with tempfile.TemporaryDirectory() as root:
        store = open_state_store(root)
        await store.check_access()
        key = ".greptime/procedure/0c5f1e0e-8a4e-4f51-9d2c-0b7e4f0b1a11/0000000000.step"
        await store.put(key, b"{}")
        await store.put("a/.b/c", b"x")
        deep, shallow = await store.walk(".greptime/"), await store.walk("")
        print("walk('.greptime/'):", deep, "\nwalk(''):", shallow, "\nwalk('a/'):", await store.walk("a/"))
        if key not in shallow or "a/.b/c" not in await store.walk("a/"):
            print("BROKEN: keys under dot folders vanish from walks of a shorter prefix")
            return 1
        return 0

sys.exit(asyncio.run(main()))
