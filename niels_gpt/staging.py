"""Builds that never damage what they replace: one lock per output, built aside, swapped in when complete.

- `<out>.lock` holds {"pid", "host", "since"}, hard-linked into place whole: a second build of the output
  fails at once naming the holder; a dead pid on this host is stale and taken over, another host's never.
- The build writes `<out>.tmp-<pid>`; when complete: `out -> out.old-<pid>`, `tmp -> out`, old removed. A
  reader sees the old cache, the new one, or (between the renames) none and a clear error, never a mix; a
  kill between the renames leaves `out.old-<pid>`, which the next build puts back first.
Cost: two renames per build.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import shutil
import socket
import time
from collections.abc import Iterator
from pathlib import Path

from niels_gpt.atomic import fsync_file, pid_alive, remove_stale_temporaries, tmp_name
from niels_gpt.errors import ConfigError, OutOfSpaceError, OutputLockedError
from niels_gpt.output_guard import check_output

OLD_INFIX = ".old-"
UNWRITABLE_ERRNOS = (errno.EACCES, errno.EPERM, errno.EROFS)


def lock_path(out: Path) -> Path:
    return out.with_name(out.name + ".lock")


@contextlib.contextmanager
def _writable(where: Path) -> Iterator[None]:
    """A location we may not write (permissions, a read-only file system) is one line naming it."""
    try:
        yield
    except OSError as exc:
        if exc.errno not in UNWRITABLE_ERRNOS:
            raise
        raise ConfigError(f"{where}: not writable ({exc.strerror}); choose a writable output "
                          "location") from exc


@contextlib.contextmanager
def output_lock(out: str | os.PathLike) -> Iterator[Path]:
    """Hold `<out>.lock` for the duration of a build of `out`."""
    out = Path(out)
    lock = lock_path(out)
    with _writable(lock.parent):
        try:
            lock.parent.mkdir(parents=True, exist_ok=True)
        except (NotADirectoryError, FileExistsError) as exc:
            raise ConfigError(f"{lock.parent}: a file, not a directory; choose another output "
                              "location") from exc
    me = {"pid": os.getpid(), "host": socket.gethostname(), "since": time.strftime("%Y-%m-%dT%H:%M:%S")}
    remove_stale_temporaries(lock.parent, prefix=lock.name)  # what a build killed as it took the lock left
    for _ in range(2):
        try:
            with _writable(lock.parent):
                _create_lock(lock, me)
        except FileExistsError:
            holder = _read(lock)
            if holder.get("host") == me["host"] and isinstance(holder.get("pid"), int) and not pid_alive(holder["pid"]):
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(lock)  # stale: its builder died on this host
                continue
            if not holder:
                raise OutputLockedError(
                    f"{out}: {lock} is there but names no build (empty or unreadable: a build killed as it took "
                    "the lock, by an older version); if no build of this output is running, remove the lock file "
                    "and rerun") from None
            raise OutputLockedError(
                f"{out}: another build holds {lock} (pid {holder.get('pid')} on {holder.get('host')} since "
                f"{holder.get('since')}); wait for it to finish, or if that process is gone (another host, a "
                "crashed machine), remove the lock file and rerun") from None
        break
    else:  # pragma: no cover - the stale lock came back between our two tries
        raise OutputLockedError(f"{out}: could not take {lock}; rerun")
    try:
        yield lock
    finally:
        if _read(lock).get("pid") == me["pid"]:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(lock)


def _create_lock(lock: Path, me: dict) -> None:
    """Create `lock` holding `me`, or raise FileExistsError. NOTE: written aside, then hard-linked (a link,
    like O_EXCL, fails when the name exists): a kill never leaves an empty lock that names no holder."""
    tmp = tmp_name(lock)
    try:
        with open(tmp, "w") as f:
            json.dump(me, f)
        try:
            os.link(tmp, lock)
        except OSError as exc:  # a file system without hard links: create it in place (EEXIST is raised)
            if exc.errno not in (errno.EPERM, errno.ENOTSUP, errno.EOPNOTSUPP, errno.EMLINK):
                raise
            fd = os.open(lock, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
            with os.fdopen(fd, "w") as f:
                json.dump(me, f)
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)


def _read(lock: Path) -> dict:
    try:
        data = json.loads(lock.read_text("utf-8"))
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def recover(out: Path) -> None:
    """Undo what a build killed mid-swap or mid-build left beside `out` (its writers are all dead)."""
    for p in sorted(out.parent.glob(f"{out.name}{OLD_INFIX}*")):
        pid = p.name[len(out.name) + len(OLD_INFIX):]
        if not pid.isdigit() or pid_alive(int(pid)):
            continue
        if not out.exists():
            os.rename(p, out)  # killed between the two renames: the old output was complete
        else:
            shutil.rmtree(p, ignore_errors=True)
    remove_stale_temporaries(out.parent, prefix=out.name)


@contextlib.contextmanager
def build_aside(out: str | os.PathLike, needs: int | None = None, *, kind: str = "cache",
                flag: str = "output") -> Iterator[Path]:
    """Lock `out`, yield a fresh staging directory beside it, and swap it in when the block succeeds.

    Only an output of `kind` this library made is replaced (output_guard.py: checked before and, under the
    lock, again before the swap). `needs`: the output's bound in bytes, for a full disk's error."""
    out = check_output(out, kind=kind, flag=flag)  # symlinks followed: the link keeps pointing at the output
    with output_lock(out):
        recover(out)
        stage = tmp_name(out)
        shutil.rmtree(stage, ignore_errors=True)
        with _writable(out.parent):
            stage.mkdir()
        free_at_start = _free_bytes(stage)
        try:
            yield stage
        except OSError as exc:
            # what the build used: its files, or the free space gone (a writer may have removed its file)
            written = max(tree_bytes(stage), free_at_start - _free_bytes(stage))
            shutil.rmtree(stage, ignore_errors=True)
            if exc.errno in SPACE_ERRNOS:
                raise out_of_space(exc, out, written, free_at_start, needs) from exc
            raise
        except BaseException:
            shutil.rmtree(stage, ignore_errors=True)
            raise
        check_output(out, kind=kind, flag=flag)  # what is there may have changed while the build ran
        swap_in(stage, out)


SPACE_ERRNOS = (errno.ENOSPC, errno.EDQUOT)


def tree_bytes(path: Path) -> int:
    """Bytes of the files below `path` (0 when it is gone)."""
    total = 0
    for root, _, files in os.walk(path):
        for name in files:
            with contextlib.suppress(OSError):
                total += os.lstat(os.path.join(root, name)).st_size
    return total


def _free_bytes(path: Path) -> int:
    try:
        return shutil.disk_usage(path).free
    except OSError:
        return 0


def human_bytes(n: float) -> str:
    for unit in ("bytes", "KiB", "MiB", "GiB"):
        if n < 1024:
            return f"{n:,.0f} {unit}" if unit == "bytes" else f"{n:,.1f} {unit}"
        n /= 1024
    return f"{n:,.1f} TiB"


def out_of_space(exc: OSError, out: Path, written: int, free_at_start: int | None = None,
                 needs: int | None = None) -> OutOfSpaceError:
    """One line for a full disk: where, what was written before it filled, what is free, what is needed."""
    free = _free_bytes(out.parent) if out.parent.exists() else None
    why = "disk quota exceeded" if exc.errno == errno.EDQUOT else "no space left on device"
    free_text = "" if free is None else f"; {human_bytes(free)} free there now"
    floor = max(written, free_at_start or 0)
    need = f"it needed more than {human_bytes(floor)}" if floor else "it needed more than was free"
    if needs and needs > floor:
        need += f" (up to {human_bytes(needs)} for its token budgets)"
    name = f" (writing {Path(exc.filename).name})" if getattr(exc, "filename", None) else ""
    return OutOfSpaceError(exc.errno, f"{out}: {why}{name}; {need}; the partial output was removed and the "
                           f"previous one, if any, is untouched{free_text}: free space or choose another location")


def swap_in(stage: Path, out: Path) -> None:
    old = out.with_name(f"{out.name}{OLD_INFIX}{os.getpid()}")
    if out.exists():
        os.rename(out, old)
    os.rename(stage, out)
    with contextlib.suppress(OSError):
        fsync_file(out.parent)
    shutil.rmtree(old, ignore_errors=True)
