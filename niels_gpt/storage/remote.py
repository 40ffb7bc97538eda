"""Reading a cache at a URL: files downloaded on first use into a size-bounded local cache.

    rc = RemoteCache("s3://bucket/caches/wikitext")   # fetches meta.json (the commit marker) only
    path = rc.fetch("train/shard_00000.bin")          # downloads on first use, then a local path

- The local cache lives under $NIELS_GPT_CACHE (default ~/.cache/niels_gpt), one mirror directory per
  URL (`remote/<sha256(url)[:16]>/`), laid out exactly like the remote cache, so every reader opens
  the mirror with its ordinary local code: same memory maps, same batches, same resume state.
- Nothing is downloaded until a reader touches a file: a DDP rank or DataLoader worker fetches only
  the shards its own draws or indices reach.
- A download goes to `<name>.tmp-<pid>`; only when its size and sha256 equal
  the marker's record is it renamed into place. A file under its final name was therefore checked,
  once, and is trusted afterwards; a partial or damaged download is never visible (a killed
  process's temporary is removed by the next eviction pass).
- The marker is read from the URL at every open; when it changed (the cache was rebuilt), mirrored
  files whose sha256 changed are deleted before the new marker replaces the old one.
- Size bound: $NIELS_GPT_CACHE_MAX_BYTES (default DEFAULT_MAX_BYTES), over every mirror under the
  cache directory. Before a download, least recently used files (by mtime, refreshed on every fetch)
  are deleted until the new file fits; files the current batch needs are never evicted. A memory map
  of an evicted file stays valid (POSIX keeps unlinked files alive while mapped); readers reopen
  their maps of files that were evicted and fetched again.
- Several processes may share one cache directory: eviction runs under an flock, downloads rename
  atomically, and two processes fetching the same file both end with the same verified bytes.
- `mirror_for_reading(url)` serves the read-side commands (inspect, verify, stats): it mirrors a
  whole cache, packed directory or split directory, checked file by file, so that their local code
  reads it; each file that fails its download check is one problem line naming its URL.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import threading
from collections.abc import Callable
from pathlib import Path

from niels_gpt.atomic import TMP_SUFFIX, pid_alive, write_bytes_atomic
from niels_gpt.constants import MANIFEST_NAME
from niels_gpt.errors import CacheError, CacheMismatchError, ConfigError, IncompleteCacheError, NielsGPTError
from niels_gpt.meta import record_problem, sha256_file
from niels_gpt.storage.fs import filesystem, join, with_retries
from niels_gpt.storage.upload import local_path_of
from niels_gpt.urls import is_url

CACHE_ENV = "NIELS_GPT_CACHE"
MAX_BYTES_ENV = "NIELS_GPT_CACHE_MAX_BYTES"
DEFAULT_CACHE_DIR = "~/.cache/niels_gpt"
DEFAULT_MAX_BYTES = 50 << 30
MIRRORS = "remote"

_settings: dict = {"cache_dir": None, "max_bytes": None}
_download_lock = threading.Lock()


def configure(*, cache_dir: str | os.PathLike | None = None, max_bytes: int | None = None) -> None:
    """Set the local cache directory and its size bound for this process (overrides the env vars)."""
    if max_bytes is not None and (not isinstance(max_bytes, int) or max_bytes < 1):
        raise ConfigError(f"max_bytes must be a positive int, got {max_bytes!r}")
    _settings.update(cache_dir=None if cache_dir is None else os.fspath(cache_dir), max_bytes=max_bytes)


def local_cache_dir() -> Path:
    return Path(_settings["cache_dir"] or os.environ.get(CACHE_ENV) or DEFAULT_CACHE_DIR).expanduser()


def max_cache_bytes() -> int:
    if _settings["max_bytes"] is not None:
        return _settings["max_bytes"]
    raw = os.environ.get(MAX_BYTES_ENV)
    if not raw:
        return DEFAULT_MAX_BYTES
    try:
        value = int(raw)
    except ValueError:
        value = 0
    if value < 1:
        raise ConfigError(f"${MAX_BYTES_ENV}={raw!r}: expected a positive number of bytes")
    return value


class RemoteCache:
    """One cache directory at a URL, mirrored file by file on demand. Pickles as its URL and paths."""

    def __init__(self, url: str, *, marker: str = "meta.json"):
        self.url = str(url).rstrip("/")
        self.marker = marker
        self.root = local_cache_dir()
        self.local_dir = self.root / MIRRORS / hashlib.sha256(self.url.encode()).hexdigest()[:16]
        self.max_bytes = max_cache_bytes()
        self._fs, self._fs_pid = None, None
        fs, path = self.fs
        remote = join(path, marker)
        try:
            data = with_retries(lambda: fs.cat_file(remote), f"reading {self.url}/{marker}")
        except FileNotFoundError:
            raise IncompleteCacheError(f"no {marker} at {self.url}: the upload was interrupted or never ran "
                                       "(the marker is uploaded last); rebuild or re-upload the cache") from None
        try:
            doc = json.loads(data)
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise CacheError(f"{self.url}/{marker}: not valid JSON ({exc}); rebuild and re-upload the cache") from exc
        if not isinstance(doc, dict):
            raise CacheError(f"{self.url}/{marker}: expected a JSON object, got {type(doc).__name__}")
        self.records = _records(doc, marker, self.url)
        self.local_dir.mkdir(parents=True, exist_ok=True)
        self._reconcile(data)

    @property
    def fs(self):
        # NOTE: a DataLoader worker forked from the process that opened the dataset inherits this
        # object without pickling it; async filesystems (s3fs) refuse to run in a fork, so each
        # process opens its own.
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
            old = _records(json.loads(local_marker.read_bytes()), self.marker)
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

    def fetch(self, rel: str, *, keep: frozenset[str] | set[str] = frozenset()) -> Path:
        """Local path of `rel`, downloaded and checked first if it is not mirrored yet.

        `keep`: other files the caller needs now; eviction leaves them alone.
        """
        local = self.local_dir / rel
        try:
            os.utime(local)  # most recently used
            return local
        except FileNotFoundError:
            pass
        rec = self.records.get(rel)
        if rec is None:
            raise CacheError(f"{self.url}/{self.marker} does not list {rel}; the cache does not have this file")
        with _download_lock:
            if local.is_file():
                return local
            self._make_room(int(rec["bytes"]), {str(self.local_dir / r) for r in keep} | {str(local)})
            self._download(rel, rec, local)
        return local

    def _download(self, rel: str, rec: dict, local: Path) -> None:
        fs, path = self.fs
        remote = join(path, rel)
        local.parent.mkdir(parents=True, exist_ok=True)
        tmp = local.with_name(f"{local.name}.tmp-{os.getpid()}")

        try:
            with_retries(lambda: fs.get_file(remote, os.fspath(tmp)), f"downloading {self.url}/{rel}")
            digest = sha256_file(str(tmp))  # NOTE: from the page cache the download just filled
            size = tmp.stat().st_size
            if size != rec["bytes"]:
                raise CacheMismatchError(f"{self.url}/{rel}: downloaded {size} bytes, {self.marker} says "
                                         f"{rec['bytes']}; the remote file was truncated or replaced after the "
                                         "build: rebuild and re-upload the cache")
            if rec.get("sha256") is not None and digest != rec["sha256"]:
                raise CacheMismatchError(f"{self.url}/{rel}: sha256 {digest[:16]}… differs from {self.marker} "
                                         f"{rec['sha256'][:16]}…; the remote file was damaged or replaced after "
                                         "the build: rebuild and re-upload the cache")
            os.replace(tmp, local)
        except FileNotFoundError as exc:
            raise CacheError(f"{self.url}/{rel}: listed in {self.marker} but missing remotely; the cache was "
                             "partly deleted: rebuild and re-upload it") from exc
        finally:
            with contextlib.suppress(FileNotFoundError):
                tmp.unlink()

    def _make_room(self, need: int, keep: set[str]) -> None:
        """Delete least recently used mirrored files (all mirrors) until `need` more bytes fit."""
        if need > self.max_bytes:
            raise ConfigError(f"{self.url}: one file needs {need:,} bytes but the local cache {self.root} may hold "
                              f"{self.max_bytes:,}; raise ${MAX_BYTES_ENV} or pass max_bytes to "
                              "niels_gpt.storage.configure")
        import fcntl

        lock = self.root / ".lock"
        with open(lock, "a") as fh:
            fcntl.flock(fh, fcntl.LOCK_EX)
            files, total = [], 0
            for root, _, names in os.walk(self.root / MIRRORS):
                for name in names:
                    p = os.path.join(root, name)
                    m = TMP_SUFFIX.search(name)
                    if m and not pid_alive(int(m.group(1))):
                        with contextlib.suppress(FileNotFoundError):
                            os.unlink(p)  # a killed download
                        continue
                    try:
                        st = os.stat(p)
                    except FileNotFoundError:
                        continue
                    total += st.st_size
                    if not m and name not in ("meta.json", "manifest.json") and p not in keep:
                        files.append((st.st_mtime_ns, p, st.st_size))
            files.sort()
            for _, p, size in files:
                if total + need <= self.max_bytes:
                    break
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(p)
                total -= size


def _records(doc: dict, marker: str, where: str = "") -> dict[str, dict]:
    """{relative path: {"bytes", "sha256", ...}} from a meta.json or a packed manifest.json."""
    marker = f"{where}/{marker}" if where else marker
    files = doc.get("files")
    if not isinstance(files, dict):
        raise CacheError(f"{marker}: 'files' is missing or not an object; rebuild and re-upload the cache")
    if marker.endswith("manifest.json"):  # array -> {"name", "bytes", "sha256", ...}
        out = {}
        for rec in files.values():
            if isinstance(rec, dict) and isinstance(rec.get("name"), str) and isinstance(rec.get("bytes"), int):
                out[rec["name"]] = rec
            else:
                raise CacheError(f"{marker}: a files record {rec!r} has no name and bytes; re-run pack-sft")
        return out
    for rel, rec in files.items():
        bad = record_problem(rec)
        if bad is not None:
            raise CacheError(f"{marker}: the record of {rel} {bad}; rebuild and re-upload the cache")
    return dict(files)


def open_location(path) -> tuple[Path, RemoteCache | None]:
    """(local directory, RemoteCache or None) for a cache directory given as a path or a URL."""
    path = os.fspath(path)
    if not is_url(path):
        return Path(path), None
    if path.startswith("file://"):
        return Path(path[len("file://"):]), None
    rc = RemoteCache(path)
    return rc.local_dir, rc


def split_url(url: str) -> tuple[str, str]:
    """"s3://b/cache/train" -> ("s3://b/cache", "train")."""
    url = os.fspath(url).rstrip("/")
    parent, _, last = url.rpartition("/")
    if "://" not in parent or parent.endswith(":/") or parent.endswith("://"):
        raise ConfigError(f"{url}: expected <cache URL>/<split or file>, e.g. s3://bucket/cache/train")
    return parent, last


def _open_marker(url: str) -> tuple[RemoteCache, str]:
    """(the RemoteCache holding `url`, the sub-directory of it that `url` names: "" or a split)."""
    try:
        return RemoteCache(url), ""
    except IncompleteCacheError as exc:
        first = exc
    try:
        return RemoteCache(url, marker=MANIFEST_NAME), ""
    except IncompleteCacheError:
        pass
    parent, last = url.rstrip("/").rpartition("/")[::2]
    if "://" in parent and not parent.endswith(":/"):
        try:
            return RemoteCache(parent), last  # a split directory of a pretraining cache: s3://b/c/train
        except IncompleteCacheError:
            pass
    raise IncompleteCacheError(f"{first} (a URL given to inspect, verify or stats is one cache, packed directory or "
                               f"split directory: a root of several caches is read one cache URL at a time)")


def mirror_for_reading(url: str, *, everything: bool = True, collect: bool = False,
                       fresh: bool = False) -> tuple[Path, Callable[[str], str], list[str]]:
    """(local path, a function that names mirrored paths in a text by their URL, download problems).

    `url`: a cache (meta.json), a packed directory (manifest.json) or a split directory of a cache. With
    `everything`, each file its marker lists (under the split, for a split) is downloaded and checked (size and sha256) unless it is
    mirrored already, and kept from eviction during this call (the local cache may pass its bound until
    the next download evicts). A file that fails its check or is missing remotely raises its CacheError
    naming its URL; with `collect` it is one problem line instead (and absent locally), and the others
    are still fetched. `fresh`: download (and check) every file again, even one mirrored already: what
    verify does, so that it checks the bytes at the URL, not an earlier copy of them.
    """
    url = os.fspath(url).rstrip("/")
    rc, sub = _open_marker(url)
    problems = []
    if everything:
        rels = sorted(r for r in rc.records if not sub or r.startswith(f"{sub}/"))  # a split: its own files
        keep = frozenset(rels)
        for rel in rels:
            if fresh:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(rc.local_dir / rel)  # a reader's memory map of it stays valid (see fetch)
            try:
                rc.fetch(rel, keep=keep)
            except CacheError as exc:
                if not collect or isinstance(exc, IncompleteCacheError):
                    raise
                problems.append(str(exc))
    if fresh and collect:
        problems += _unlisted(rc, sub)
    local = rc.local_dir / sub if sub else rc.local_dir

    def named(text: str) -> str:
        return str(text).replace(str(rc.local_dir), rc.url)

    return local, named, problems


def _unlisted(rc: RemoteCache, sub: str) -> list[str]:
    """Files at the URL (under `sub`) that its marker does not list, as verify reports them in a local
    output; a store that cannot list (http) has none to report."""
    fs, base = filesystem(rc.url)
    top = f"{base}/{sub}" if sub else base
    try:
        found = with_retries(lambda: fs.find(top), f"listing {rc.url}")
    except (FileNotFoundError, NotImplementedError):
        return []
    strip = base.lstrip("/")
    out = []
    for f in sorted(found):
        rel = f.lstrip("/")[len(strip):].lstrip("/")
        if rel == rc.marker or rel in rc.records:
            continue
        out.append(f"{rc.url}/{rel}: a file the {rc.marker} does not list (a temporary of a killed run or a "
                   "leftover); remove it or rebuild")
    return out


@contextlib.contextmanager
def errors_named(named: Callable[[str], str]):
    """Let a package error raised by local code reading a mirror name the URL instead of the mirror."""
    try:
        yield
    except NielsGPTError as exc:
        text = named(str(exc))
        if text != str(exc):
            exc.args = (text,)
        raise


def read_location(path, **kw) -> tuple[str, Callable[[str], str], list[str]]:
    """For a read-side command: (local path, naming function, problems). A cache URL is mirrored
    (`mirror_for_reading(url, **kw)`), a file:// URL is the path it names, a local path is itself."""
    local = local_path_of(path)
    if local is not None:
        return local, str, []
    mirror, named, problems = mirror_for_reading(path, **kw)
    return str(mirror), named, problems


def tokenizer_near(url: str, levels: int = 2) -> Path | None:
    """The local mirror of the `tokenizer` directory next to the cache at `url` or above it (build-all's
    layout), when there is one: what inspect decodes with when no --tokenizer is given. The tokenizer's own
    meta.json lists no files; readers compare the model's sha256 with the cache's record."""
    parent = os.fspath(url).rstrip("/")
    for _ in range(levels + 1):
        local = _mirror_tokenizer(f"{parent}/tokenizer")
        if local is not None:
            return local
        parent, _, last = parent.rpartition("/")
        if "://" not in parent or parent.endswith(":/") or not last:
            return None
    return None


def _mirror_tokenizer(url: str) -> Path | None:
    fs, path = filesystem(url)
    try:
        data = with_retries(lambda: fs.cat_file(join(path, "meta.json")), f"reading {url}/meta.json")
        model = str(json.loads(data).get("model_file") or "")
    except (FileNotFoundError, ValueError, AttributeError):
        return None
    if not model or "/" in model:
        return None
    local = local_cache_dir() / MIRRORS / hashlib.sha256(url.encode()).hexdigest()[:16]
    local.mkdir(parents=True, exist_ok=True)
    fresh = (local / "meta.json").is_file() and (local / "meta.json").read_bytes() == data
    if not fresh or not (local / model).is_file():
        tmp = local / f"{model}.tmp-{os.getpid()}"
        with_retries(lambda: fs.get_file(join(path, model), os.fspath(tmp)), f"downloading {url}/{model}")
        os.replace(tmp, local / model)
        write_bytes_atomic(local / "meta.json", data)
    return local
