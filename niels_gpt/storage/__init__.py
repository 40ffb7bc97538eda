"""Caches at fsspec URLs: write (stage locally, upload, marker last) and read (on-demand local mirror).

    from niels_gpt.storage import configure, staged_output, RemoteCache
    configure(cache_dir="/scratch/niels_gpt", max_bytes=20 << 30)   # or $NIELS_GPT_CACHE(_MAX_BYTES)

Every reader of the package takes a URL where it takes a cache path; see docs/storage.md.
"""

from niels_gpt.storage.fs import SCHEMES, filesystem
from niels_gpt.storage.remote import (
    RemoteCache,
    configure,
    local_cache_dir,
    max_cache_bytes,
    open_location,
    split_url,
)
from niels_gpt.storage.upload import staged_output, upload_tree, writes_to_url

__all__ = ["SCHEMES", "RemoteCache", "configure", "filesystem", "local_cache_dir", "max_cache_bytes",
           "open_location", "split_url", "staged_output", "upload_tree", "writes_to_url"]
