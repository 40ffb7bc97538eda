"""Scale tier: whole epochs through a bounded download cache, for every window reader, raw and compressed, with
and without DataLoader workers; and a cache of 10,000 small shards read through a bounded cache.

At every step, and at every moment a download lands (the most the disk can hold), the disk the download cache
holds (held_disk: its files plus the deleted files any process of the test, workers included, still maps)
stays within the bound, and the batches equal the local cache's. The background downloads are slowed so the
training loop outruns them, as it does on a slow link: downloads of shards the plan left are still landing
while the reader fetches what it needs now. Sizes are chosen to be cheap: shards of a few KB, windows of
32-64 tokens.
"""

from __future__ import annotations

import json
import os
import threading
import time

import numpy as np
import pytest
import torch

from niels_gpt.cache.build_cache import build_pretrain_cache
from niels_gpt.cache.pretrain_dataset import PretrainTokenStreamDataset
from niels_gpt.loading.sampler import GlobalBatchSampler, ResumableDataLoader
from niels_gpt.loading.shard_windows import ShardWindowSampler
from niels_gpt.loading.stream import RankBatchStream
from niels_gpt.loading.windows import IndexedWindowDataset
from niels_gpt.readers.held import held_disk
from niels_gpt.storage import configure, mirror

from ..conftest import CREDENTIALS, http_server, sample_texts, write_pretrain_cache

T, B = 64, 4
SLOW_S = 0.02  # each background download waits this long with its room reserved


@pytest.fixture(scope="module")
def built(tmp_path_factory, tokenizer):
    """The sample corpus as raw and zstd caches of ~1 KB shards, served over HTTP."""
    root = tmp_path_factory.mktemp("scale")
    for compress in (None, "zstd"):
        build_pretrain_cache(sample_texts(), str(root / (compress or "raw")), tokenizer=tokenizer,
                             max_train_tokens=30_000, max_val_tokens=2_000, shard_bytes=1024, seed=3,
                             shuffle_buffer=None, progress=False, compress=compress)
    with http_server(root) as url:
        yield root, url


def _bound(cache, shards: int) -> int:
    """`shards` of the largest train shards and the marker: the download cache's bound."""
    meta = json.loads((cache / "meta.json").read_text())
    sizes = sorted((r["bytes"] for rel, r in meta["files"].items() if rel.startswith("train/")), reverse=True)
    assert len(sizes) > 2 * shards  # the split is far larger than the bound
    return sum(sizes[:shards]) + (cache / "meta.json").stat().st_size


CASES = [("random", c, 0) for c in ("raw", "zstd")] + \
    [(r, c, w) for r in ("global", "shard_windows") for c in ("raw", "zstd") for w in (0, 2)]


def _watch_landings(monkeypatch, download_cache, bound: int) -> list[tuple[str, int]]:
    """Slow the background downloads and measure held disk each time any download lands (DataLoader workers
    raise at once: their list does not reach the test)."""
    over: list[tuple[str, int]] = []
    download = mirror.RemoteCache._download

    def watched(self, rel, *args):
        if threading.current_thread().name.startswith("niels-gpt-prefetch"):
            time.sleep(SLOW_S)
        download(self, rel, *args)
        held = held_disk(download_cache)
        if held > bound:
            over.append((rel, held))
            assert held <= bound, f"{rel} landed: held {held} > {bound}"

    monkeypatch.setattr(mirror.RemoteCache, "_download", watched)
    return over


@pytest.mark.parametrize("reader,compress,workers", CASES, ids=[f"{r}-{c}-{w}w" for r, c, w in CASES])
def test_a_whole_epoch_stays_within_the_bound(built, download_cache, monkeypatch, reader, compress, workers):
    root, url = built
    cache = root / compress
    # what the batches being read need at once: a batch reaches up to B shards, and with workers the
    # global sampler pins the 2 x prefetch_factor batches the workers hold too
    bound = _bound(cache, (2 * 2 + 2) * B if reader == "global" and workers else 2 * B)
    configure(cache_dir=download_cache, max_bytes=bound)
    over = _watch_landings(monkeypatch, download_cache, bound)
    steps = 0
    if reader == "random":
        remote = RankBatchStream(PretrainTokenStreamDataset(f"{url}/{compress}/train", T=T, device="cpu"), B,
                                 seed=1, rank=0, world_size=1)
        local = RankBatchStream(PretrainTokenStreamDataset(str(cache / "train"), T=T, device="cpu"), B,
                                seed=1, rank=0, world_size=1)
        epoch = remote.dataset.num_tokens // (B * T)
        remote.end_after(epoch)
        for _ in range(epoch):
            assert torch.equal(next(remote)[1], next(local)[1])
            assert held_disk(download_cache) <= bound, steps
            steps += 1
        prefetcher = remote._plan.prefetcher
    else:
        remote, local = IndexedWindowDataset(f"{url}/{compress}", T), IndexedWindowDataset(cache, T)

        def sampler(ds):
            if reader == "global":
                return GlobalBatchSampler(ds, B, seed=2, rank=0, world_size=1)
            return ShardWindowSampler(ds, B, seed=2, shards_at_once=2, rank=0, world_size=1)

        s = sampler(remote)
        s.end_after(len(remote) // B)
        loader = ResumableDataLoader(remote, s, num_workers=workers)
        for a, b in zip(loader, ResumableDataLoader(local, sampler(local)), strict=True):
            assert torch.equal(a["labels"], b["labels"])
            assert held_disk(download_cache) <= bound, steps
            steps += 1
        assert steps == len(local) // B
        prefetcher = s.prefetcher
    prefetcher.wait()  # the downloads still landing after the last batch count too
    prefetcher.close()
    assert not over and prefetcher.failures == 0
    assert steps >= 50


SMALL_SHARDS = 10_000
SMALL_TOKENS = 49  # 98 bytes a shard: one window of T=32 at stride 32 (48 // 32)


@pytest.fixture(scope="module")
def small_shards(tmp_path_factory):
    """A cache of 10,000 shards of 98 bytes (each its own token pattern), written once per module."""
    root = tmp_path_factory.mktemp("small")
    cache = write_pretrain_cache(root / "c", {"train": [(np.arange(SMALL_TOKENS) + 7 * i) % 2000
                                                        for i in range(SMALL_SHARDS)],
                                              "val": [np.arange(100)]})
    return root, cache


def _read_small(url: str, cache, download_cache, batches: int) -> None:
    """`batches` batches of each window reader from `url` against the local cache, held disk checked each step;
    the bound is 5% of the split and the marker."""
    bound = int(0.05 * SMALL_SHARDS * SMALL_TOKENS * 2) + (cache / "meta.json").stat().st_size
    configure(cache_dir=download_cache, max_bytes=bound)
    remote, local = IndexedWindowDataset(url, 32), IndexedWindowDataset(cache, 32)
    assert len(remote) == SMALL_SHARDS
    s = ShardWindowSampler(remote, 16, seed=5, shards_at_once=16, rank=0, world_size=1)
    s.end_after(batches)
    s_local = ShardWindowSampler(local, 16, seed=5, shards_at_once=16, rank=0, world_size=1)
    for n, (a, b) in enumerate(zip(ResumableDataLoader(remote, s), ResumableDataLoader(local, s_local), strict=False)):
        assert torch.equal(a["input_ids"], b["input_ids"])
        assert held_disk(download_cache) <= bound
        if n + 1 == batches:
            break
    s.prefetcher.close()
    stream = RankBatchStream(PretrainTokenStreamDataset(f"{url}/train", T=32, device="cpu"), 4, seed=0,
                             rank=0, world_size=1)
    stream.end_after(batches // 4)
    for _ in range(batches // 4):
        next(stream)
        assert held_disk(download_cache) <= bound
    stream._plan.prefetcher.close()


def test_ten_thousand_small_shards_over_http_stay_within_the_bound(small_shards, download_cache):
    root, cache = small_shards
    with http_server(root) as url:
        _read_small(f"{url}/c", cache, download_cache, batches=60)


@pytest.fixture(scope="module")
def small_shards_s3(small_shards, s3_endpoint):
    """The 10,000-shard cache uploaded once to a moto S3 bucket (fsspec's batched put; meta.json last)."""
    import fsspec
    import s3fs

    root, cache = small_shards
    with pytest.MonkeyPatch.context() as mp:
        for k, v in CREDENTIALS.items():
            mp.setenv(k, v)
        mp.setitem(fsspec.config.conf, "s3", {"endpoint_url": s3_endpoint, "key": "testing", "secret": "testing"})
        s3fs.S3FileSystem.clear_instance_cache()
        fs = s3fs.S3FileSystem(endpoint_url=s3_endpoint, key="testing", secret="testing")
        fs.mkdir("scale-small")
        fs.put([str(p) for p in sorted((cache / "train").iterdir())], "s3://scale-small/c/train/")
        fs.put([str(p) for p in sorted((cache / "val").iterdir())], "s3://scale-small/c/val/")
        fs.put_file(os.fspath(cache / "meta.json"), "s3://scale-small/c/meta.json")
        yield "s3://scale-small/c", cache
        s3fs.S3FileSystem.clear_instance_cache()


@pytest.mark.slow  # the upload: 10,000 PUTs to moto take ~70 s on 2 cores
def test_ten_thousand_small_shards_on_s3_stay_within_the_bound(small_shards_s3, download_cache):
    url, cache = small_shards_s3
    _read_small(url, cache, download_cache, batches=60)
