"""The disk a download cache holds: its files, and the files it evicted that a process still maps.

POSIX frees an unlinked file's blocks only when its last map goes, so `held_disk(root)` counts the files
under `root`/remote (`disk_usage`) plus every deleted file under `root` mapped by this process, its
descendants (DataLoader workers) and `pids`, once each (read from /proc/<pid>/maps; 0 off Linux).
`whole=True` counts every file under `root` by its allocated blocks instead (other loaders' caches).
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

from niels_gpt.storage.local_cache import disk_usage

DELETED = " (deleted)"


def descendants(pid: int) -> list[int]:
    """`pid`'s children, their children, ... (from /proc/<pid>/task/*/children)."""
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        with contextlib.suppress(OSError):
            for task in os.listdir(f"/proc/{p}/task"):
                with contextlib.suppress(OSError), open(f"/proc/{p}/task/{task}/children") as f:
                    kids = [int(c) for c in f.read().split()]
                    out.extend(kids)
                    todo.extend(kids)
    return out


def deleted_mapped(root: str | os.PathLike, pids=None) -> dict[tuple[str, str], int]:
    """{(device, inode): bytes} of the deleted files under `root` mapped by this process, its
    descendants and `pids`."""
    prefix = os.path.abspath(root).rstrip("/") + "/"
    me = os.getpid()
    held: dict[tuple[str, str], int] = {}
    procs = [me, *descendants(me)]
    for p in pids or ():
        procs += [p, *descendants(p)]
    for pid in dict.fromkeys(procs):
        try:
            with open(f"/proc/{pid}/maps") as f:
                lines = f.read().splitlines()
        except OSError:  # gone meanwhile, or not Linux
            continue
        for line in lines:
            if not line.endswith(DELETED):
                continue
            parts = line.split(maxsplit=5)
            if len(parts) < 6 or not parts[5].startswith(prefix):
                continue
            key = (parts[3], parts[4])
            if key in held:
                continue
            lo, hi = (int(x, 16) for x in parts[0].split("-"))
            try:  # the file's own size, through the map
                size = os.stat(f"/proc/{pid}/map_files/{parts[0]}").st_size
            except OSError:
                size = int(parts[2], 16) + hi - lo  # the end of this map in the file (page-rounded)
            held[key] = size
    return held


def held_disk(root: str | os.PathLike, pids=None, *, whole: bool = False) -> int:
    """Bytes of the download cache at `root`: files in it plus deleted files a process still maps."""
    return (dir_blocks(root) if whole else disk_usage(Path(root))) + sum(deleted_mapped(root, pids).values())


def dir_blocks(path: str | os.PathLike) -> int:
    """Disk used under `path` (allocated blocks: a sparse file counts what it holds, not its size)."""
    total = 0
    for d, _, names in os.walk(path):
        for n in names:
            with contextlib.suppress(FileNotFoundError):
                total += os.stat(os.path.join(d, n)).st_blocks * 512
    return total
