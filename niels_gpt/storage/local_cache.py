"""The download cache shared by the processes of one host: its size bound, its pins and its download locks
(docs/storage.md, "Reading").

    <cache dir>/
      .lock                      eviction runs under this flock, one process at a time
      remote/<mirror>/...        the mirrors (storage/mirror.py), laid out like the caches they mirror
      locks/<mirror>/<rel>.lock  one per file ever fetched: the process holding it is the one downloading
      pins/<pid>-<n>.txt         files a live process needs kept (batches in flight or prefetched)

Only files a mirror's marker lists are counted and evicted, so eviction never runs among a user's files
(`claim` refuses a directory that is not ours). Room granted to a download is reserved at once by a sparse
`<name>.reserved.tmp-<pid>`, so parallel downloads never grant the same room twice. Pin files are written on
a short thread (a rename takes ~4 ms, too long for a training step). Lock files stay: unlinking one while
another process waits on it would let a third take a fresh lock beside it.
"""

from __future__ import annotations

import atexit
import contextlib
import fcntl
import hashlib
import itertools
import json
import os
import threading
import time
import weakref
from pathlib import Path

from niels_gpt.atomic import TMP_SUFFIX, pid_alive, write_bytes_atomic
from niels_gpt.confine import confined
from niels_gpt.constants import MANIFEST_NAME, MARKERS
from niels_gpt.errors import ConfigError, StorageError, first_few
from niels_gpt.storage.fs import transfers_stopped
from niels_gpt.storage.settings import MIRRORS, cache_dir_label

LOCKS, PINS, STAMPS = "locks", "pins", "stamps"
OWN_MARK = ".niels_gpt_download_cache"  # in the root: this directory is a download cache this library made
# what a download cache holds at its top; "core": the CORE evaluation bundle train keeps in the default
# directory (~/.cache/niels_gpt/core, train/eval_core.py), never touched by eviction
OWN_ENTRIES = {OWN_MARK, ".lock", MIRRORS, LOCKS, PINS, STAMPS, "core"}
SOURCES = "sources"  # remote/sources/: temporaries of inputs read from URLs (sources/records.py)
TOKENIZERS = "tokenizers"  # remote/tokenizers/<sha256>/: tokenizers fetched from a work store (storage/work.py)
RESERVED = ".reserved"  # <name>.reserved.tmp-<pid>: room granted to a download in progress
LOCK_POLL_S = 0.02
_pin_ids = itertools.count()


class NoRoom(Exception):
    """A prefetch found no room: every file it could evict is pinned or kept (the caller skips it)."""


def claim(root: Path) -> None:
    """Make `root` a download cache of this library (missing, empty, marked, or laid out as one), or refuse
    it with a ConfigError before anything is written there."""
    root = Path(root)
    label = cache_dir_label()
    if (root / OWN_MARK).is_file():
        return
    if root.exists() and not root.is_dir():
        raise ConfigError(f"{label} {root}: a file, not a directory; the download cache is a directory of its own "
                          "(created when missing): choose another path")
    root.mkdir(parents=True, exist_ok=True)
    entries = sorted(e for e in os.listdir(root) if not TMP_SUFFIX.search(e))
    if entries and not _laid_out_as_ours(root, entries):
        raise ConfigError(f"{label} {root}: a non-empty directory that is not a download cache of this library "
                          f"(it holds {first_few(entries)}); nothing in it is deleted or replaced: choose a new "
                          "or empty directory for the download cache")
    write_bytes_atomic(root / OWN_MARK, b"a download cache of niels_gpt: files under remote/ may be evicted\n",
                       durable=False)


def _laid_out_as_ours(root: Path, entries: list[str]) -> bool:
    if not set(entries) <= OWN_ENTRIES:
        return False
    mirrors = root / MIRRORS
    if not mirrors.is_dir():
        return not mirrors.exists()
    return all(e in (SOURCES, TOKENIZERS) or (len(e) == 16 and all(c in "0123456789abcdef" for c in e))
               for e in os.listdir(mirrors))


def fetched(mirror_dir: Path) -> set[str]:
    """The relative paths a mirror's marker lists: the only files of it eviction may remove (empty: none)."""
    for marker in MARKERS:
        try:
            doc = json.loads((Path(mirror_dir) / marker).read_bytes())
        except (OSError, ValueError):
            continue
        files = doc.get("files") if isinstance(doc, dict) else None
        if not isinstance(files, dict):
            return set()
        if marker == MANIFEST_NAME:
            return {str(r.get("name")) for r in files.values() if isinstance(r, dict)}
        return set(files)
    return set()


def lock_path(root: Path, mirror: str, rel: str) -> Path:
    return root / LOCKS / mirror / (hashlib.sha256(rel.encode()).hexdigest()[:24] + ".lock")


@contextlib.contextmanager
def file_lock(path: Path, *, timeout_s: float, what: str):
    """Hold the flock of `path` (created if missing); StorageError naming `what` after `timeout_s`."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with _open_lock(path) as fh:
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if transfers_stopped():
                    raise KeyboardInterrupt from None  # Ctrl-C: the download waited for is ending too
                if time.monotonic() > deadline:
                    raise StorageError(f"{what}: waited {timeout_s:.0f} s for another process downloading it "
                                       f"(it holds {path}); if that process hangs, stop it and rerun") from None
                time.sleep(LOCK_POLL_S)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def _open_lock(path: Path):
    try:
        return open(path, "a")
    except IsADirectoryError:
        raise StorageError(f"{path}: a directory where the download cache keeps a lock file; remove it "
                           f"(rmdir {path}) and rerun") from None


_live_pins: dict[int, frozenset[str]] = {}  # id(Pins) -> its paths, for this process's own evictions


class Pins:
    """The files this process needs kept, published for every process's eviction; dropped on close() or
    when collected. Pickles as nothing."""

    def __init__(self, root: Path):
        self.root = Path(root)
        self._pid, self._path, self._paths = None, None, frozenset()
        self._lock = threading.Lock()
        self._finalizer = None

    def set(self, paths) -> None:
        """Replace this process's pinned set (absolute paths): at once in memory, soon in its pin file."""
        paths = frozenset(map(str, paths))
        if self._pid != os.getpid():  # a forked child publishes its own pins, never its parent's file
            self._pid, self._paths, self._lock = os.getpid(), frozenset(), threading.Lock()
            self._path = self.root / PINS / f"{self._pid}-{next(_pin_ids)}.txt"
            self._path.parent.mkdir(parents=True, exist_ok=True)
            self._finalizer = weakref.finalize(self, _drop, id(self), self._path, self._pid, self._lock)
        if paths == self._paths:
            return
        self._paths = paths
        _live_pins[id(self)] = paths
        # NOTE: a short thread per change, holding no reference to self: the latest set is written last
        threading.Thread(target=_write_pins, args=(self._lock, self._path, weakref.ref(self)), daemon=True,
                         name="niels-gpt-pins").start()

    def close(self) -> None:
        if self._finalizer is not None and self._pid == os.getpid():
            self._finalizer()
        _live_pins.pop(id(self), None)
        self._paths = frozenset()

    def __getstate__(self):
        return {"root": self.root, "_pid": None, "_path": None, "_paths": frozenset(), "_finalizer": None}

    def __setstate__(self, state):
        self.__dict__.update(state)
        self._lock = threading.Lock()


def _write_pins(lock: threading.Lock, path: Path, ref) -> None:
    with lock:
        pins = ref()
        if pins is None or id(pins) not in _live_pins:
            return  # closed or collected meanwhile: its file is gone and must stay gone
        write_bytes_atomic(path, "\n".join(sorted(_live_pins[id(pins)])).encode(), durable=False)


def _drop(key: int, path: Path, pid: int, lock: threading.Lock) -> None:
    with lock:  # after any write in progress, and no write after it
        _live_pins.pop(key, None)
        if os.getpid() == pid:
            with contextlib.suppress(FileNotFoundError):
                path.unlink()


def pinned(root: Path) -> set[str]:
    """Every path some live process pins (this one's from memory); pin files of dead processes are removed."""
    out: set[str] = set().union(*_live_pins.values())
    d = Path(root) / PINS
    if not d.is_dir():
        return out
    for p in d.iterdir():
        pid = p.name.split("-", 1)[0]
        # a pin file being replaced (its final name holds the set until the rename), or this process's own
        # (memory holds its current set; the file may be a set behind)
        if TMP_SUFFIX.search(p.name) or pid == str(os.getpid()):
            continue
        if not pid.isdigit() or not pid_alive(int(pid)):
            with contextlib.suppress(FileNotFoundError):
                p.unlink()
            continue
        with contextlib.suppress(FileNotFoundError):
            out.update(_pin_lines(p, Path(root)))
    return out


def _pin_lines(path: Path, root: Path) -> list[str]:
    """The paths a pin file lists: absolute paths of files inside the mirrors (niels_gpt/confine.py)."""
    fix = f"remove {path} (a live process rewrites its own pins)"
    try:
        text = path.read_bytes().decode("utf-8")
    except UnicodeDecodeError as exc:
        raise StorageError(f"{path}: a pin file of the download cache that is not UTF-8 text ({exc.reason} at byte "
                           f"{exc.start}); it was damaged or written by something else: {fix}") from None
    base = f"{os.path.abspath(root)}/{MIRRORS}/"
    lines = [line for line in text.splitlines() if line]
    for k, line in enumerate(lines, 1):
        inside = line[len(base):] if line.startswith(base) else line
        confined(inside, path, f"line {k}", error=StorageError, fix=fix)
    return lines


def reservation(local: Path) -> Path:
    return local.with_name(f"{local.name}{RESERVED}.tmp-{os.getpid()}")


_IN_FLIGHT: set[Path] = set()  # this process's reservations and download temporaries, until released


def hold(path: Path) -> Path:
    """Note a download's temporary (its reservation, its partial file); `release` removes it."""
    _IN_FLIGHT.add(path)
    return path


def release(path: Path) -> None:
    _IN_FLIGHT.discard(path)
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)


atexit.register(lambda: [release(p) for p in list(_IN_FLIGHT)])  # NOTE: Ctrl-C leaves mid-download


def make_room(root: Path, max_bytes: int, need: int, keep: set[str], *, strict: bool = False,
              reserve: Path | None = None, wait_s: float = 0.0, what: str = "") -> None:
    """Evict least recently used files under `root`/remote (not `keep`, not pinned) until `need` more bytes
    fit in `max_bytes`, then create `reserve` (sparse, `need` bytes; the caller releases it).

    No room: `strict` (a prefetch) raises NoRoom; else it waits up to `wait_s` for downloads in progress
    to land (StorageError naming `what` after), and only when kept and pinned files alone fill the bound
    does it go past it."""
    deadline = time.monotonic() + wait_s
    while True:
        with _open_lock(Path(root) / ".lock") as fh:
            fcntl.flock(fh, fcntl.LOCK_EX)  # held for a directory walk: milliseconds, never a network wait
            total, reserved, files = _holdings(root, set(keep) | pinned(root))
            if strict and total - sum(f[2] for f in files) + need > max_bytes:
                raise NoRoom
            files.sort()
            for _, p, size in files:
                if total + need <= max_bytes:
                    break
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(p)
                total -= size
            if total + need <= max_bytes or not reserved or wait_s <= 0:
                if reserve is not None:
                    reserve.parent.mkdir(parents=True, exist_ok=True)
                    hold(reserve)
                    with open(reserve, "wb") as f:
                        f.truncate(need)
                return
        if transfers_stopped():
            raise KeyboardInterrupt  # Ctrl-C: the downloads waited for are ending too
        if time.monotonic() > deadline:
            raise StorageError(f"{what}: waited {wait_s:.0f} s for room in the download cache {root} (other downloads "
                               f"in progress hold {reserved:,} of its {max_bytes:,} bytes); if another process "
                               "hangs, stop it and rerun, or raise --cache-limit")
        time.sleep(LOCK_POLL_S)


def _holdings(root: Path, keep: set[str]) -> tuple[int, int, list[tuple[int, str, int]]]:
    """(bytes the bound counts, of which reserved, [(atime, path, bytes)] eviction may remove) under
    `root`/remote; temporaries of dead processes are removed."""
    files, total, reserved, listed = [], 0, 0, {}
    mirrors = os.path.join(root, MIRRORS)
    for d, _, names in os.walk(mirrors):
        for name in names:
            p = os.path.join(d, name)
            rel = os.path.relpath(p, mirrors).split(os.sep)
            if rel[0] not in listed:
                listed[rel[0]] = fetched(Path(mirrors) / rel[0])
            m = TMP_SUFFIX.search(name)
            if m and not pid_alive(int(m.group(1))):
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(p)  # a killed download, or its reservation
                continue
            if m and not name[:m.start()].endswith(RESERVED):
                continue  # a download in progress: its reservation counts for it
            try:
                st = os.stat(p)
            except FileNotFoundError:
                if m:  # a reservation whose download landed after the listing skipped its temporary: count it
                    with contextlib.suppress(FileNotFoundError):
                        total += os.stat(os.path.join(d, name[:m.start() - len(RESERVED)])).st_size
                continue
            held = rel[0] == TOKENIZERS  # a tokenizer fetched for a build: counted, never evicted (builds read it)
            if not m and not held and "/".join(rel[1:]) not in listed[rel[0]] and name not in MARKERS:
                continue  # not a file this library fetched: neither counted nor ever evicted
            total += st.st_size
            if m:
                reserved += st.st_size
            elif name not in MARKERS and p not in keep and not held:
                files.append((st.st_atime_ns, p, st.st_size))  # access time: last use
    return total, reserved, files


def disk_usage(root: Path) -> int:
    """Bytes of every file under `root`/remote but the sparse reservations: what the bound covers."""
    total = 0
    for d, _, names in os.walk(Path(root) / MIRRORS):
        for name in names:
            m = TMP_SUFFIX.search(name)
            if m and name[:m.start()].endswith(RESERVED):
                continue
            with contextlib.suppress(FileNotFoundError):
                total += os.stat(os.path.join(d, name)).st_size
    return total
