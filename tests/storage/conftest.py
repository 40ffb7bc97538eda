"""The storage servers and the download cache of tests/conftest.py; every test here gets its own download cache."""

from __future__ import annotations

import os

import pytest

from niels_gpt.cache.build_cache import build_pretrain_cache

from ..conftest import CREDENTIALS, _QuietHandler, free_port, http_server, sample_texts  # noqa: F401  (imported from here by tests)

SHARD_BYTES = 16_384


def build_sample_cache(tokenizer, out):
    """The sample corpus as a pretraining cache at `out` (a path or a URL), in several small shards."""
    build_pretrain_cache(sample_texts(), str(out), tokenizer=tokenizer, max_train_tokens=40_000,
                         max_val_tokens=4_000, shard_bytes=SHARD_BYTES, seed=3, shuffle_buffer=None,
                         progress=False)


def file_tree(root):
    """relative path -> bytes of every file under `root`."""
    return {os.path.relpath(os.path.join(d, n), root): open(os.path.join(d, n), "rb").read()
            for d, _, names in os.walk(root) for n in names}


@pytest.fixture(autouse=True)
def own_download_cache(download_cache):
    """Each test downloads into its own local cache directory."""
    return download_cache
