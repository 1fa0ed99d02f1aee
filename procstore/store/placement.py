"""`spread_subfolders()`: ask ext4 to place a folder's subfolders apart on disk, where that helps.

A local store makes a folder per procedure in `procedure/`, writes a few files into it and
deletes it all when the procedure ends, a thousand procedures at once. ext4 places a new
file's inode in its folder's block group and, when it has no journal, skips every inode
freed there in the last minute or more when it looks for a free one, reading each one's
inode to see when it was freed. With every procedure folder in one group, each create walks
past the thousands of inodes the last procedures freed: measured on the benchmark machine
(ext4 without a journal), the kernel's time per 5-step procedure at N=1,000 doubled (2.5 to
6 ms) within a minute and the rate fell by a third, where the same operations eight
procedures at a time were unaffected.

ext2/3/4's `TOPDIR` attribute (`chattr +T`) marks a folder whose subfolders are unrelated
trees: the Orlov allocator gives each new subfolder the block group with the fewest folders,
so the procedures' folders, and their files, spread over the disk, and a create walks past
only the few inodes freed in its own group. It costs inode-table writes (spread inodes share
fewer blocks: about a tenth more bytes written), and ext4 with a journal does not do that
walk, so only a folder on ext4 without a journal is marked (`gains_from_spreading`).

A hint, never needed: nothing changes but placement. It changes no data and orders no
write, so a crash at any point leaves the store as it would be without it.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import platform
import struct
import sys

_TOPDIR_FL = 0x00020000
"""`FS_TOPDIR_FL` from `<linux/fs.h>`."""


def _linux_ioctl(direction: int, number: int) -> int | None:
    """`_IOR`/`_IOW('f', number, long)` in the common encoding of Linux's ioctl numbers
    (x86, arm, riscv, s390); None off Linux and where the encoding differs (powerpc, mips,
    sparc, alpha, parisc)."""
    if sys.platform != "linux" or platform.machine().lower().startswith(("ppc", "mips", "sparc", "alpha", "parisc")):
        return None
    return direction << 30 | struct.calcsize("l") << 16 | ord("f") << 8 | number


_GET_FLAGS = _linux_ioctl(2, 1)  # FS_IOC_GETFLAGS
_SET_FLAGS = _linux_ioctl(1, 2)  # FS_IOC_SETFLAGS


def gains_from_spreading(path: str) -> bool:
    """Whether the folder at `path` is on ext2/3/4 without a journal, as Linux's sysfs says
    (`/sys/fs/ext4/<device>/journal_task` reads `<none>`); False if it cannot tell."""
    try:
        device = os.stat(path).st_dev
        name = os.path.basename(os.path.realpath(f"/sys/dev/block/{os.major(device)}:{os.minor(device)}"))
        with open(f"/sys/fs/ext4/{name}/journal_task", encoding="ascii") as task:
            return task.read().strip() == "<none>"
    except (OSError, ValueError):  # no such device or file; a value that is not text
        return False


def spread_subfolders(path: str) -> bool:
    """Mark the folder at `path` so that its new subfolders are placed apart (ext2/3/4's
    `TOPDIR`); whether it is marked now. Never raises: a symlink (not followed), a
    filesystem or platform without the attribute, or a folder this process may not change
    are left as they are."""
    if _GET_FLAGS is None or _SET_FLAGS is None:
        return False
    with contextlib.suppress(OSError):
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
        try:
            # The kernel reads and writes an int, whatever the number's size says.
            (flags,) = struct.unpack("i", fcntl.ioctl(fd, _GET_FLAGS, bytes(4)))
            if not flags & _TOPDIR_FL:
                fcntl.ioctl(fd, _SET_FLAGS, struct.pack("i", flags | _TOPDIR_FL))
            return True
        finally:
            os.close(fd)
    return False
