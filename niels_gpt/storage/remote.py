"""Opening caches at URLs for the readers and the read-side commands (inspect, verify, stats).

The readers open the local directory `open_location` gives (a URL's mirror) with their ordinary code;
the mirror itself is storage/mirror.py and storage/local_cache.py.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
from collections.abc import Callable
from pathlib import Path

from niels_gpt.atomic import write_bytes_atomic
from niels_gpt.confine import confined
from niels_gpt.constants import MANIFEST_NAME, META_NAME
from niels_gpt.errors import CacheError, ConfigError, IncompleteCacheError, NielsGPTError
from niels_gpt.storage.fs import call, filesystem, join, read_bytes
from niels_gpt.storage.local_cache import claim
from niels_gpt.storage.mirror import RemoteCache
from niels_gpt.storage.settings import MIRRORS, local_cache_dir
from niels_gpt.storage.upload import local_path_of


def open_location(path) -> tuple[Path, RemoteCache | None]:
    """(local directory, RemoteCache or None) for a cache directory given as a path or a URL."""
    local = local_path_of(path)
    if local is not None:
        return Path(local), None
    rc = RemoteCache(os.fspath(path))
    return rc.local_dir, rc


def split_url(url: str) -> tuple[str, str]:
    """"s3://b/cache/train" -> ("s3://b/cache", "train")."""
    url = os.fspath(url).rstrip("/")
    parent, _, last = url.rpartition("/")
    if "://" not in parent or parent.endswith(":/") or parent.endswith("://"):
        raise ConfigError(f"{url}: expected <cache URL>/<split or file>, e.g. s3://bucket/cache/train")
    return parent, last


def open_marker(url: str) -> tuple[RemoteCache, str]:
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


def read_location(path, *, everything: bool = True, collect: bool = False,
                  fresh: bool = False) -> tuple[str, Callable[[str], str], list[str]]:
    """For a read-side command: (local path, a function naming mirrored paths by their URL, problems) for a
    cache, packed directory or split directory at `path`; a local path is itself, named as it is.

    At a URL: `everything`: every file its marker lists (under the split) is fetched and checked, kept from
    eviction during this call. `collect`: a file that fails its check is a problem line, not a CacheError.
    `fresh`: every file downloaded again (what verify does: it checks the bytes at the URL); a damaged
    mirrored copy is a problem line too."""
    local = local_path_of(path)
    if local is not None:
        return local, str, []
    url = os.fspath(path).rstrip("/")
    rc, sub = open_marker(url)
    problems = []
    if everything:
        rels = sorted(r for r in rc.records if not sub or r.startswith(f"{sub}/"))  # a split: its own files
        keep = frozenset(rels)
        for rel in rels:
            if fresh:
                damaged = rc.damaged_copy(rel)
                if damaged is not None:
                    problems.append(damaged)
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

    return str(local), named, problems


def _unlisted(rc: RemoteCache, sub: str) -> list[str]:
    """Problem lines for the files at the URL (under `sub`) its marker does not list (none for http)."""
    fs, base = filesystem(rc.url)
    top = f"{base}/{sub}" if sub else base
    try:
        found = call(fs, f"listing {rc.url}", "find", top)
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


def tokenizer_near(url: str, levels: int = 2) -> Path | None:
    """The local mirror of the `tokenizer` directory beside the cache at `url` or up to `levels` above it
    (build-all's layout), or None: what inspect decodes with when no --tokenizer is given."""
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
        data = read_bytes(fs, join(path, META_NAME), f"reading {url}/meta.json")
        model = str(json.loads(data).get("model_file") or "")
    except (FileNotFoundError, ValueError, AttributeError):
        return None
    if not model:
        return None
    confined(model, f"{url}/meta.json", "model_file", parts=1, fix="retrain the tokenizer and upload it again")
    claim(local_cache_dir())
    local = local_cache_dir() / MIRRORS / hashlib.sha256(url.encode()).hexdigest()[:16]
    local.mkdir(parents=True, exist_ok=True)
    fresh = (local / META_NAME).is_file() and (local / META_NAME).read_bytes() == data
    if not fresh or not (local / model).is_file():
        tmp = local / f"{model}.tmp-{os.getpid()}"
        call(fs, f"downloading {url}/{model}", "get_file", join(path, model), os.fspath(tmp))
        os.replace(tmp, local / model)
        write_bytes_atomic(local / META_NAME, data)
    return local
