"""Writing a cache to a URL: build it locally, upload every file, the commit markers last.

    with staged_output("s3://bucket/caches/wikitext") as local:   # a fresh local directory
        build_something(local)                                    # uploaded on success; else nothing

- A remote output is built in a staging directory ($NIELS_GPT_STAGING, else the system's temporary one):
  memory maps and the build-aside swap need a local POSIX directory. `file://` and paths are written in place.
- `upload_tree` withdraws the markers it will replace, copies every data file, then the markers: a reader
  that sees a marker sees every file it lists, and an upload killed at any moment leaves no marker.
Cost: one local copy of the output and one upload of every byte.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

from niels_gpt.atomic import file_identity, pid_alive
from niels_gpt.confine import confined_all
from niels_gpt.constants import MANIFEST_NAME, MARKERS
from niels_gpt.errors import ConfigError, first_few
from niels_gpt.storage.fs import bounded_call, call, filesystem, join, read_bytes
from niels_gpt.urls import is_url

STAGING_ENV = "NIELS_GPT_STAGING"
STAGE_PREFIX = "niels_gpt_stage_"  # <prefix><pid>_<random>: a staged output of process <pid>


def local_path_of(out) -> str | None:
    """The local path `out` stands for (a plain path or a file:// URL), or None for a remote URL."""
    out = os.fspath(out)
    if not is_url(out):
        return out
    if out.startswith("file://"):
        return out[len("file://"):]
    return None


def _files(local_dir: Path) -> list[str]:
    """Relative paths of the files to upload: no temporaries of an interrupted write, no build locks."""
    rels = []
    for root, dirs, files in os.walk(local_dir):
        dirs[:] = sorted(d for d in dirs if ".tmp-" not in d and ".old-" not in d)
        for name in sorted(files):
            if ".tmp-" in name or name.endswith(".lock"):
                continue
            rels.append(os.path.relpath(os.path.join(root, name), local_dir).replace(os.sep, "/"))
    return rels


def upload_tree(local_dir, url: str, *, fs=None, skip: frozenset[str] = frozenset()) -> list[str]:
    """Copy the files under `local_dir` to `url`, commit markers last, except `skip` (there unchanged);
    returns the remote paths written."""
    if fs is None:
        fs, root = filesystem(url, write=True)
    else:
        root = fs._strip_protocol(url)
    local_dir = Path(local_dir)
    rels = [r for r in _files(local_dir) if r not in skip]
    markers = [r for r in rels if r.rsplit("/", 1)[-1] in MARKERS]
    data = [r for r in rels if r not in markers]
    # deepest marker first: a tree's own top-level marker (if any) is the very last file written
    markers.sort(key=lambda r: (-r.count("/"), r))
    for rel in markers:  # withdraw what this upload replaces, before any data changes under it
        remote = join(root, rel)
        if call(fs, f"{url}/{rel}", "exists", remote):
            call(fs, f"removing {url}/{rel}", "rm_file", remote)
    written = []
    for rel in data + markers:
        remote = join(root, rel)
        parent = remote.rsplit("/", 1)[0]
        with contextlib.suppress(Exception):  # object stores have no directories; local ones need them
            bounded_call(fs, "makedirs", parent, exist_ok=True)
        call(fs, f"uploading {local_dir / rel} to {url}/{rel}", "put_file", os.fspath(local_dir / rel), remote)
        written.append(remote)
    return written


def check_remote_output(url: str, fs, root: str) -> set[str] | None:
    """The output guard (output_guard.py) for a prefix in a store: nothing there, or an output of ours whose
    record lists every object there (returned, so the upload removes those the new one lacks; None: none).
    The first call to the store, so bad credentials or endpoints end here, before the build."""
    try:
        found = call(fs, f"listing {url} (where the output goes)", "find", root)
    except FileNotFoundError:
        return None
    rels = sorted(f[len(root):].lstrip("/") for f in found if f.startswith(root))
    rels = [r for r in rels if r and ".tmp-" not in r]
    if not rels:
        return None
    for marker in MARKERS:
        if marker not in rels:
            continue
        data = read_bytes(fs, join(root, marker), f"reading {url}/{marker}")
        try:
            files = json.loads(data).get("files")
        except (ValueError, AttributeError):
            files = None
        if not isinstance(files, dict):
            break
        listed = {str(v.get("name", k)) if isinstance(v, dict) and marker == MANIFEST_NAME else k
                  for k, v in files.items()}
        # NOTE: the names of the output this one replaces are removed after the upload: each stays in the prefix
        confined_all(sorted(listed), f"{url}/{marker}", "files", error=ConfigError,
                     fix="remove that output yourself, or choose a new prefix")
        listed |= {marker}
        stray = [r for r in rels if r not in listed]
        if stray:
            raise ConfigError(f"{url}: holds an output of this library and also {first_few(stray)}, which "
                              f"its {marker} does not list; replacing the output would delete them: move them, "
                              "or choose a new prefix")
        return listed
    raise ConfigError(f"{url}: holds {len(rels)} object(s) that are not an output of this library "
                      f"({first_few(rels)}); nothing there is replaced: choose a new prefix, or remove them "
                      "yourself")


@contextlib.contextmanager
def staged_output(url, *, prefetch: tuple[str, ...] = (), guard: bool = False) -> Iterator[Path]:
    """Yield a local directory to build into; upload it to `url` when the block succeeds (module docstring).

    `prefetch`: sub-directories of `url` downloaded first when there (the tokenizer a build reuses),
    uploaded again only if changed. `guard`: `url` is one output: `check_remote_output` first, and the
    replaced output's files the new one lacks are removed after the upload."""
    local = local_path_of(url)
    if local is not None:
        yield Path(local)
        return
    fs, root = filesystem(str(url), write=True)  # refuse an unknown or read-only scheme before building
    old = check_remote_output(str(url), fs, root) if guard else None
    staging = os.environ.get(STAGING_ENV) or None
    sweep_dead(Path(staging or tempfile.gettempdir()), STAGE_PREFIX)
    base = Path(tempfile.mkdtemp(prefix=f"{STAGE_PREFIX}{os.getpid()}_", dir=staging))
    # the staging directory carries the output's name: builders record it (dataset_name defaults to it)
    stage = base / (str(url).rstrip("/").rsplit("/", 1)[-1] or "out")
    try:
        stage.mkdir()
        unchanged = {}
        for sub in prefetch:
            remote = join(root, sub)
            if call(fs, f"{url}/{sub}", "exists", join(remote, MARKERS[0])):
                _download_tree(fs, remote, stage / sub, f"{url}/{sub}")
                unchanged.update({rel: file_identity(stage / rel) for rel in _files(stage) if rel.startswith(sub + "/")})
        yield stage
        same = frozenset(rel for rel, before in unchanged.items() if file_identity(stage / rel) == before)
        upload_tree(stage, str(url), fs=fs, skip=same)
        for rel in sorted((old or set()) - set(_files(stage))):  # the replaced output's files it no longer has
            with contextlib.suppress(FileNotFoundError):
                call(fs, f"removing {url}/{rel}", "rm_file", join(root, rel))
    finally:
        shutil.rmtree(base, ignore_errors=True)


def _download_tree(fs, remote: str, local: Path, url: str) -> None:
    found = call(fs, f"listing {url}", "find", remote)
    for path in found:
        rel = path[len(remote):].lstrip("/") if path.startswith(remote) else path.rsplit("/", 1)[-1]
        dest = local / rel
        dest.parent.mkdir(parents=True, exist_ok=True)
        call(fs, f"downloading {url}/{rel}", "get_file", path, os.fspath(dest))


def sweep_dead(root: Path, prefix: str) -> None:
    """Remove the directories `<prefix><pid>_*` under `root` whose process is gone (killed before its cleanup)."""
    with contextlib.suppress(OSError):
        for d in root.glob(f"{prefix}*_*"):
            pid = d.name[len(prefix):].split("_", 1)[0]
            if pid.isdigit() and not pid_alive(int(pid)) and d.is_dir() and not d.is_symlink():
                shutil.rmtree(d, ignore_errors=True)


def writes_to_url(fn):
    """Let a builder `fn(first, out_dir, ...)` take an fsspec URL as out_dir: staged, then uploaded."""
    @functools.wraps(fn)
    def wrapper(first, out_dir, *args, **kwargs):
        if not is_url(out_dir):
            return fn(first, out_dir, *args, **kwargs)
        with staged_output(out_dir, guard=True) as local:
            return fn(first, str(local), *args, **kwargs)
    return wrapper
