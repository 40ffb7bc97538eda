"""One cache at a URL, mirrored file by file into the host's download cache, each file checked once
(docs/storage.md, "Reading").

    rc = RemoteCache("s3://bucket/caches/wikitext")   # fetches meta.json (the commit marker) only
    path = rc.fetch("train/shard_00000.bin")          # downloads on first use, then a local path

The mirror `<download cache>/remote/<sha256(url)[:16]>/` is laid out like the remote cache, so readers open
it with their ordinary code. A download is renamed into place only when its size and sha256 match the
marker (a mismatch is fetched once more, then refused). A stamp (`stamps/<mirror>/<sha256(rel)[:24]>.json`:
size, mtime_ns, sha256) lets a host hash each copy once; a copy damaged on disk is fetched again.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import sys
import threading
import time
from pathlib import Path

from niels_gpt.atomic import write_bytes_atomic
from niels_gpt.confine import confined, confined_all
from niels_gpt.constants import MANIFEST_NAME, META_NAME
from niels_gpt.errors import CacheError, CacheMismatchError, ConfigError, IncompleteCacheError
from niels_gpt.meta import record_problem, sha256_file
from niels_gpt.storage.fs import call, filesystem, join, longest_wait_s, read_bytes
from niels_gpt.storage.local_cache import (
    STAMPS,
    NoRoom,
    claim,
    file_lock,
    hold,
    lock_path,
    make_room,
    release,
    reservation,
)
from niels_gpt.storage.settings import MAX_BYTES_ENV, MIRRORS, local_cache_dir, max_cache_bytes

_STAMP_WRITE = threading.Lock()


def stamp_path(root: Path, mirror: str, rel: str) -> Path:
    return root / STAMPS / mirror / (hashlib.sha256(rel.encode()).hexdigest()[:24] + ".json")


def write_stamp(root: Path, mirror: str, rel: str, local: Path, sha256: str) -> None:
    """Remember that `local` (as it is now: size, mtime) has this sha256."""
    st = os.stat(local)
    path = stamp_path(root, mirror, rel)
    path.parent.mkdir(parents=True, exist_ok=True)
    with _STAMP_WRITE:  # NOTE: the temporary name is per process: two threads stamping one file shared it
        write_bytes_atomic(path, json.dumps({"size": st.st_size, "mtime_ns": st.st_mtime_ns,
                                             "sha256": sha256}).encode(), durable=False)


def copy_problem(root: Path, mirror: str, rel: str, rec: dict, local: Path, st: os.stat_result, *,
                 stamped: bool = True) -> str | None:
    """What is wrong with a mirrored copy against its record, or None: its size, and its sha256 (the stamp's
    when it matches this file's size and mtime)."""
    if st.st_size != rec["bytes"]:
        return f"has {st.st_size} bytes, the record says {rec['bytes']}"
    want = rec.get("sha256")
    if want is None:
        return None
    known = None
    with contextlib.suppress(OSError, ValueError, KeyError, TypeError):
        stamp = json.loads(stamp_path(root, mirror, rel).read_bytes()) if stamped else {}
        known = stamp["sha256"] if (stamp["size"], stamp["mtime_ns"]) == (st.st_size, st.st_mtime_ns) else None
    if known is None:
        known = sha256_file(str(local))
        if known == want:
            with contextlib.suppress(OSError):
                write_stamp(root, mirror, rel, local, known)
    return None if known == want else f"has sha256 {known[:16]}…, the record says {want[:16]}…"


DOWNLOADS_PER_MISMATCH = 2  # a checksum mismatch is fetched once more before it is refused
_trusted: dict[str, tuple[int, int, int]] = {}  # mirrored path -> (size, mtime_ns, inode) checked in this process


class RemoteCache:
    """One cache directory at a URL, mirrored file by file on demand. Pickles as its URL and paths."""

    def __init__(self, url: str, *, marker: str = META_NAME):
        self.url = str(url).rstrip("/")
        self.marker = marker
        self.root = Path(os.path.abspath(local_cache_dir()))
        self.mirror = hashlib.sha256(self.url.encode()).hexdigest()[:16]
        self.local_dir = self.root / MIRRORS / self.mirror
        self.max_bytes = max_cache_bytes()
        self.healed: list[str] = []  # mirrored copies found damaged and fetched again, one line each
        self._fs, self._fs_pid = None, None
        fs, path = self.fs
        claim(self.root)  # before any download: a directory that is not a download cache is refused at once
        remote = join(path, marker)
        try:
            data = read_bytes(fs, remote, f"reading {self.url}/{marker}")
        except FileNotFoundError:
            raise IncompleteCacheError(f"no {marker} at {self.url}: the upload was interrupted or never ran "
                                       "(the marker is uploaded last); rebuild or re-upload the cache") from None
        try:
            doc = json.loads(data)
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise CacheError(f"{self.url}/{marker}: not valid JSON ({exc}); rebuild and re-upload the cache") from exc
        if not isinstance(doc, dict):
            raise CacheError(f"{self.url}/{marker}: expected a JSON object, got {type(doc).__name__}")
        self.records = records_of(doc, marker, self.url)
        self.local_dir.mkdir(parents=True, exist_ok=True)
        self._reconcile(data)

    @property
    def fs(self):
        # NOTE: a DataLoader worker forked from the process that opened the dataset inherits this object
        # without pickling it; async filesystems (s3fs) refuse to run in a fork, so each process opens its own
        if self._fs is None or self._fs_pid != os.getpid():
            self._fs, self._fs_pid = filesystem(self.url), os.getpid()
        return self._fs

    def __getstate__(self):
        state = self.__dict__.copy()
        state["_fs"] = None  # each process opens its own connection (s3fs sessions do not survive a fork)
        return state

    def _reconcile(self, data: bytes) -> None:
        """Drop mirrored files the new marker no longer vouches for, then store the marker."""
        local_marker = self.local_dir / self.marker
        try:
            old = records_of(json.loads(local_marker.read_bytes()), self.marker)
        except (OSError, ValueError, CacheError):
            old = None
        if old != self.records:
            for root, _, files in os.walk(self.local_dir):
                for name in files:
                    rel = os.path.relpath(os.path.join(root, name), self.local_dir).replace(os.sep, "/")
                    if rel == self.marker:
                        continue
                    if old is None or (old.get(rel) or {}).get("sha256") != (self.records.get(rel) or {}).get("sha256"):
                        with contextlib.suppress(FileNotFoundError):
                            os.unlink(os.path.join(root, name))
        if not local_marker.is_file() or local_marker.read_bytes() != data:
            write_bytes_atomic(local_marker, data)

    def has(self, rel: str) -> bool:
        return (self.local_dir / rel).is_file()

    def size(self, rel: str) -> int:
        return int(self.record(rel)["bytes"])

    def record(self, rel: str) -> dict:
        rec = self.records.get(rel)
        if rec is None:
            raise CacheError(f"{self.url}/{self.marker} does not list {rel}; the cache does not have this file")
        return rec

    def fetch(self, rel: str, *, keep: frozenset[str] | set[str] = frozenset(), prefetch: bool = False) -> Path:
        """Local path of `rel`, downloaded and checked first if it is not mirrored yet. `keep`: other files
        eviction leaves alone; `prefetch`: raise local_cache.NoRoom rather than pass the bound."""
        rec = self.record(rel)  # only names the marker lists (confined when it was read) become paths
        local = self.local_dir / rel
        if self._good_copy(rel, rec, local):
            return local
        if int(rec["bytes"]) > self.max_bytes:
            raise ConfigError(f"{self.url}: one file needs {int(rec['bytes']):,} bytes but the local cache {self.root} "
                              f"may hold {self.max_bytes:,}; raise --cache-limit (${MAX_BYTES_ENV}) or pass max_bytes "
                              "to niels_gpt.storage.configure")
        what = f"{self.url}/{rel}"
        with file_lock(lock_path(self.root, self.mirror, rel), timeout_s=longest_wait_s() * DOWNLOADS_PER_MISMATCH,
                       what=what):
            if self._good_copy(rel, rec, local):  # another process or thread downloaded it while this one waited
                return local
            room = reservation(local)
            make_room(self.root, self.max_bytes, int(rec["bytes"]),
                      {str(self.local_dir / r) for r in keep} | {str(local)}, strict=prefetch, reserve=room,
                      wait_s=longest_wait_s() * DOWNLOADS_PER_MISMATCH, what=what)
            try:
                for attempt in range(1, DOWNLOADS_PER_MISMATCH + 1):
                    try:
                        self._download(rel, rec, local, attempt)
                        break
                    except CacheMismatchError:
                        if attempt == DOWNLOADS_PER_MISMATCH:
                            raise
            finally:
                release(room)
        return local

    def damaged_copy(self, rel: str) -> str | None:
        """One line when the mirrored copy of `rel` differs from its record (hashed now, whatever its stamp
        says), else None; verify reports it, then fetches the file again."""
        local = self.local_dir / rel
        try:
            st = os.stat(local)
        except FileNotFoundError:
            return None
        problem = copy_problem(self.root, self.mirror, rel, self.record(rel), local, st, stamped=False)
        return None if problem is None else \
            f"{self.url}/{rel}: the local copy {local} {problem}; it was damaged on this disk and is fetched again (healed)"

    def _good_copy(self, rel: str, rec: dict, local: Path) -> bool:
        """Whether the mirrored copy may be served (then marked most recently used), checked once per process
        (`copy_problem`); a bad copy is removed and named in a warning and in `healed`."""
        try:
            st = os.stat(local)
        except FileNotFoundError:
            return False
        key = (st.st_size, st.st_mtime_ns, st.st_ino)
        if _trusted.get(str(local)) != key:
            problem = copy_problem(self.root, self.mirror, rel, rec, local, st)
            if problem is not None:
                line = f"{self.url}/{rel}: the local copy {local} {problem}; it was damaged on this disk: fetching it again"
                print(f"warning: {line}", file=sys.stderr)
                self.healed.append(line)
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(local)
                return False
            _trusted[str(local)] = key
        # NOTE: the access time is eviction's LRU clock; the modification time stays what the stamp recorded
        with contextlib.suppress(FileNotFoundError):
            os.utime(local, ns=(time.time_ns(), st.st_mtime_ns))
        return True

    def _download(self, rel: str, rec: dict, local: Path, attempt: int) -> None:
        fs, path = self.fs
        remote = join(path, rel)
        local.parent.mkdir(parents=True, exist_ok=True)
        tmp = hold(local.with_name(f"{local.name}.tmp-{os.getpid()}"))
        again = "" if attempt == 1 else f" (downloaded {attempt} times)"
        try:
            call(fs, f"downloading {self.url}/{rel}", "get_file", remote, os.fspath(tmp))
            digest = sha256_file(str(tmp))  # NOTE: from the page cache the download just filled
            size = tmp.stat().st_size
            if size != rec["bytes"]:
                raise CacheMismatchError(f"{self.url}/{rel}: downloaded {size} bytes, {self.marker} says "
                                         f"{rec['bytes']}{again}; the remote file was truncated or replaced after "
                                         "the build: rebuild and re-upload the cache")
            if rec.get("sha256") is not None and digest != rec["sha256"]:
                raise CacheMismatchError(f"{self.url}/{rel}: sha256 {digest[:16]}… differs from {self.marker} "
                                         f"{rec['sha256'][:16]}…{again}; the remote file was damaged or replaced "
                                         "after the build: rebuild and re-upload the cache")
            os.replace(tmp, local)
        except FileNotFoundError as exc:
            raise CacheError(f"{self.url}/{rel}: listed in {self.marker} but missing remotely; the cache was "
                             "partly deleted: rebuild and re-upload it") from exc
        finally:
            release(tmp)
        with contextlib.suppress(FileNotFoundError):  # evicted already: the stamp is only a hint
            write_stamp(self.root, self.mirror, rel, local, digest)


def records_of(doc: dict, marker: str, where: str = "") -> dict[str, dict]:
    """{relative path: {"bytes", "sha256", ...}} from a meta.json or a packed manifest.json."""
    marker = f"{where}/{marker}" if where else marker
    files = doc.get("files")
    if not isinstance(files, dict):
        raise CacheError(f"{marker}: 'files' is missing or not an object; rebuild and re-upload the cache")
    if marker.endswith(MANIFEST_NAME):  # array -> {"name", "bytes", "sha256", ...}
        out = {}
        for key, rec in files.items():
            if isinstance(rec, dict) and isinstance(rec.get("name"), str) and isinstance(rec.get("bytes"), int):
                out[confined(rec["name"], marker, f"files.{key}.name", parts=1, fix="re-run pack-sft")] = rec
            else:
                raise CacheError(f"{marker}: a files record {rec!r} has no name and bytes; re-run pack-sft")
        examples = doc.get("examples")  # pack-sft's examples.npy: each packed sequence's cache example
        if isinstance(examples, dict) and isinstance(examples.get("name"), str) and isinstance(examples.get("bytes"), int):
            out[confined(examples["name"], marker, "examples.name", parts=1, fix="re-run pack-sft")] = examples
        return out
    confined_all(files, marker, "files", fix="rebuild and re-upload the cache")
    for rel, rec in files.items():
        bad = record_problem(rec)
        if bad is not None:
            raise CacheError(f"{marker}: the record of {rel} {bad}; rebuild and re-upload the cache")
    return dict(files)


__all__ = ["NoRoom", "RemoteCache", "records_of"]
