"""Write-to-temporary-then-rename: a file appears under its final name only complete and flushed; a crash
leaves at most a `*.tmp-<pid>` file that no reader looks at. Directories commit by their marker, written last.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
from collections.abc import Iterator
from pathlib import Path

TMP_SUFFIX = re.compile(r"\.tmp-(\d+)$")


def file_identity(path: str | os.PathLike) -> tuple[int, int, int] | None:
    """What tells the file at `path` from one written in its place (None: no file there): inode, size, mtime."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_ino, st.st_size, st.st_mtime_ns


def tmp_name(final: str | os.PathLike) -> Path:
    final = Path(final)
    return final.with_name(f"{final.name}.tmp-{os.getpid()}")


def fsync_file(path: str | os.PathLike) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def commit(tmp: str | os.PathLike, final: str | os.PathLike, durable: bool = True) -> None:
    """fsync `tmp` (unless not `durable`: for files their reader checks by sha256 anyway, such as a build's
    parts), then move it over `final` in one step."""
    if durable:
        fsync_file(tmp)
    os.replace(tmp, final)


@contextlib.contextmanager
def atomic_path(final: str | os.PathLike, durable: bool = True) -> Iterator[Path]:
    """Yield a temporary path to write; on success it replaces `final`, on error it is removed."""
    tmp = tmp_name(final)
    try:
        yield tmp
        commit(tmp, final, durable)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def write_bytes_atomic(final: str | os.PathLike, data: bytes, durable: bool = True) -> None:
    with atomic_path(final, durable) as tmp:
        with open(tmp, "wb") as f:
            f.write(data)


def pid_alive(pid: int) -> bool:
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # someone else's live process
    return True


def stale_temporaries(directory: str | os.PathLike, *, prefix: str | None = None) -> list[Path]:
    """`*.tmp-<pid>` files and directories under `directory` (or, with `prefix`, its entries named
    `<prefix>.tmp-<pid>`) whose writer is no longer running: what a killed build left behind."""
    d = Path(directory)
    if not d.is_dir():
        return []
    found = []
    entries = d.iterdir() if prefix is not None else d.rglob("*")
    for p in entries:
        m = TMP_SUFFIX.search(p.name)
        if m is None or (prefix is not None and p.name[:m.start()] != prefix):
            continue
        if not pid_alive(int(m.group(1))):
            found.append(p)
    return sorted(found)


def remove_stale_temporaries(directory: str | os.PathLike, *, prefix: str | None = None) -> list[Path]:
    """Delete what `stale_temporaries` finds (a live writer's temporaries are left alone); returns them."""
    found = stale_temporaries(directory, prefix=prefix)
    for p in found:
        if p.is_dir() and not p.is_symlink():
            shutil.rmtree(p, ignore_errors=True)
        else:
            with contextlib.suppress(FileNotFoundError):
                p.unlink()
    return found
