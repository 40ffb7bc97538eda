"""Write-local-then-upload: memmaps need a local POSIX file, so remote outputs are built in a
temporary directory and copied with fsspec, manifest.json last (a reader that sees the manifest sees
every array). Cost: one extra local copy of the shard on disk and one upload.

Any fsspec URL works (`s3://`, `gs://`, `memory://`, `file://`); a plain path or `file://` URL is
written in place with no copy. fsspec is imported only when a URL is used.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable
from pathlib import Path

from niels_gpt.constants import MANIFEST_NAME
from niels_gpt.errors import ConfigError


def is_url(out) -> bool:
    return "://" in str(out)


def local_path_of(out) -> str | None:
    """The local path `out` stands for, or None when it is a remote URL."""
    out = str(out)
    if not is_url(out):
        return out
    if out.startswith("file://"):
        return out[len("file://"):]
    return None


def write_then_upload(out, write_fn: Callable[[str], dict]) -> dict:
    """Call `write_fn(local_dir)`; if `out` is remote, upload what it wrote to `out`. Returns its result."""
    local = local_path_of(out)
    if local is not None:
        return write_fn(local)
    with tempfile.TemporaryDirectory(prefix="niels_gpt_pack_") as tmp:
        result = write_fn(tmp)
        upload_dir(tmp, str(out))
        return result


def upload_dir(local_dir, url: str, *, fs=None) -> list[str]:
    """Copy every file of `local_dir` to `url` (flat, no sub-directories), manifest.json last.

    Returns the remote paths written. `fs` overrides the filesystem fsspec infers from the URL.
    """
    import fsspec

    if fs is None:
        fs, root = fsspec.core.url_to_fs(url)
    else:
        root = fs._strip_protocol(url)
    local_dir = Path(local_dir)
    names = sorted(p.name for p in local_dir.iterdir() if p.is_file())
    if MANIFEST_NAME not in names:
        raise ConfigError(f"{local_dir}: no {MANIFEST_NAME} to upload; the shard was not finalized")
    # NOTE: temporaries of an interrupted local write never travel.
    names = [n for n in names if ".tmp-" not in n and n != MANIFEST_NAME] + [MANIFEST_NAME]
    fs.makedirs(root, exist_ok=True)
    written = []
    for name in names:
        remote = f"{root.rstrip('/')}/{name}"
        fs.put_file(os.fspath(local_dir / name), remote)
        written.append(remote)
    return written
