"""Caches at fsspec URLs: write (stage locally, upload, marker last) and read (a bounded local mirror).

    from niels_gpt.storage import configure, staged_output, RemoteCache
    configure(cache_dir="/scratch/niels_gpt", max_bytes="20GB")   # or $NIELS_GPT_CACHE(_MAX_BYTES)

| module | what |
|---|---|
| settings.py | the download cache's directory, size bound and network time limit |
| fs.py | fsspec filesystems per scheme; retries with backoff; a time limit on every call |
| mirror.py | `RemoteCache`: one cache URL mirrored file by file, each file checked against meta.json |
| local_cache.py | the host's shared download cache: eviction, pins, one download per file |
| remote.py | opening caches at URLs for readers and the read-side commands |
| upload.py | writing: build locally, upload, markers last |

Every reader of the package takes a URL where it takes a cache path; see docs/storage.md.
"""

from niels_gpt.storage.fs import SCHEMES, filesystem
from niels_gpt.storage.mirror import RemoteCache
from niels_gpt.storage.remote import open_location, split_url
from niels_gpt.storage.settings import configure, local_cache_dir, max_cache_bytes, parse_size
from niels_gpt.storage.upload import staged_output, upload_tree, writes_to_url

__all__ = ["SCHEMES", "RemoteCache", "configure", "filesystem", "local_cache_dir", "max_cache_bytes",
           "open_location", "parse_size", "split_url", "staged_output", "upload_tree", "writes_to_url"]
