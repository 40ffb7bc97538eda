"""Write-local-then-upload: memmaps need a local POSIX file, so remote outputs are built in a
temporary directory and copied with fsspec, manifest.json last (a reader that sees the manifest sees
every array). Cost: one extra local copy of the shard on disk and one upload.

Any writable fsspec URL works (`s3://`, `gs://`, `hf://`, `memory://`, `file://`); a plain path or
`file://` URL is written in place with no copy. The upload itself (retries, markers last, old markers
withdrawn first) is niels_gpt/storage/upload.py.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from niels_gpt.constants import MANIFEST_NAME
from niels_gpt.errors import ConfigError
from niels_gpt.storage.upload import staged_output, upload_tree


def write_then_upload(out, write_fn: Callable[[str], dict]) -> dict:
    """Call `write_fn(local_dir)`; if `out` is remote, upload what it wrote to `out`. Returns its result."""
    with staged_output(out, guard=True) as local:
        return write_fn(str(local))


def upload_dir(local_dir, url: str, *, fs=None) -> list[str]:
    """Copy every file of `local_dir` to `url`, manifest.json last (niels_gpt.storage.upload_tree).

    Returns the remote paths written. `fs` overrides the filesystem fsspec infers from the URL.
    """
    local_dir = Path(local_dir)
    if not (local_dir / MANIFEST_NAME).is_file():
        raise ConfigError(f"{local_dir}: no {MANIFEST_NAME} to upload; the shard was not finalized")
    return upload_tree(local_dir, url, fs=fs)
