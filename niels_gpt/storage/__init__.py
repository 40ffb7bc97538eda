"""Caches at fsspec URLs: write (stage locally, upload, marker last: upload.py) and read (a bounded local
mirror: mirror.py, local_cache.py, remote.py), every call limited and retried (fs.py); docs/storage.md.

    from niels_gpt.storage import configure, staged_output, RemoteCache
    configure(cache_dir="/scratch/niels_gpt", max_bytes="20GB")   # or $NIELS_GPT_CACHE(_MAX_BYTES)
"""

from niels_gpt.storage.fs import SCHEMES, filesystem
from niels_gpt.storage.mirror import RemoteCache
from niels_gpt.storage.remote import open_location, split_url
from niels_gpt.storage.settings import configure, local_cache_dir, max_cache_bytes, parse_size, reset
from niels_gpt.storage.upload import staged_output, upload_tree, writes_to_url

__all__ = ["SCHEMES", "RemoteCache", "configure", "filesystem", "local_cache_dir", "max_cache_bytes",
           "open_location", "parse_size", "reset", "split_url", "staged_output", "upload_tree", "writes_to_url"]
