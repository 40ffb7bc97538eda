"""Write-to-temporary-then-rename, the commit protocol every writer in the package uses.

A file appears under its final name only complete and flushed to disk; a crash leaves at most a
`*.tmp-<pid>` file that no reader looks at. Directories are committed by writing their meta.json
(or manifest.json) last.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path


def tmp_name(final: str | os.PathLike) -> Path:
    final = Path(final)
    return final.with_name(f"{final.name}.tmp-{os.getpid()}")


def fsync_file(path: str | os.PathLike) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def commit(tmp: str | os.PathLike, final: str | os.PathLike) -> None:
    """fsync `tmp`, then move it over `final` in one step."""
    fsync_file(tmp)
    os.replace(tmp, final)


@contextlib.contextmanager
def atomic_path(final: str | os.PathLike) -> Iterator[Path]:
    """Yield a temporary path to write; on success it replaces `final`, on error it is removed."""
    tmp = tmp_name(final)
    try:
        yield tmp
        commit(tmp, final)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def write_bytes_atomic(final: str | os.PathLike, data: bytes) -> None:
    with atomic_path(final) as tmp:
        with open(tmp, "wb") as f:
            f.write(data)
