"""What a reader over a URL holds on disk stays within the download cache's bound, counting the files it
evicted but still maps (held_disk: the directory plus deleted-but-mapped files of every process)."""

from __future__ import annotations

import mmap
import os

import numpy as np
import pytest
import torch

from niels_gpt.cache.pretrain_dataset import PretrainTokenStreamDataset
from niels_gpt.loading.sampler import GlobalBatchSampler, ResumableDataLoader
from niels_gpt.loading.shard_windows import ShardWindowSampler
from niels_gpt.loading.stream import RankBatchStream
from niels_gpt.loading.windows import IndexedWindowDataset
from niels_gpt.readers.held import deleted_mapped, held_disk
from niels_gpt.storage import configure
from niels_gpt.storage.local_cache import disk_usage

from ..conftest import http_server, write_pretrain_cache

SHARD_TOKENS = 5_001  # 10,002 bytes a shard
SHARDS = 15


@pytest.fixture
def served(tmp_path):
    cache = write_pretrain_cache(tmp_path / "c", {"train": [(np.arange(SHARD_TOKENS) * (i + 1)) % 2000
                                                            for i in range(SHARDS)],
                                                  "val": [np.arange(500) % 2000]})
    with http_server(tmp_path) as url:
        yield cache, f"{url}/c", 6 * 2 * SHARD_TOKENS + (cache / "meta.json").stat().st_size  # six shards, marker


def test_held_disk_counts_a_deleted_file_this_process_still_maps(tmp_path):
    root = tmp_path / "dc"
    (root / "remote" / "m").mkdir(parents=True)
    kept, gone = root / "remote" / "m" / "a.bin", root / "remote" / "m" / "b.bin"
    kept.write_bytes(b"a" * 5000)
    gone.write_bytes(b"b" * 7000)
    with open(gone, "rb") as f:
        mm = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    os.unlink(gone)
    assert disk_usage(root) == 5000
    assert list(deleted_mapped(root).values()) == [7000]
    assert held_disk(root) == 12_000
    mm.close()
    assert held_disk(root) == 5000


def test_random_windows_from_a_url_stay_within_the_bound(served, download_cache):
    cache, url, BOUND = served
    configure(cache_dir=download_cache, max_bytes=BOUND)
    remote = PretrainTokenStreamDataset(url + "/train", T=64, device="cpu")
    local = PretrainTokenStreamDataset(str(cache / "train"), T=64, device="cpu")
    g_remote, g_local = torch.Generator().manual_seed(1), torch.Generator().manual_seed(1)
    for _ in range(60):  # every shard is reached many times over
        a, b = remote.get_batch(B=3, generator=g_remote), local.get_batch(B=3, generator=g_local)
        assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])
        assert held_disk(download_cache) <= BOUND
    assert torch.equal(g_remote.get_state(), g_local.get_state())


def test_random_windows_through_a_stream_stay_within_the_bound(served, download_cache):
    cache, url, BOUND = served
    configure(cache_dir=download_cache, max_bytes=BOUND)
    remote = RankBatchStream(PretrainTokenStreamDataset(url + "/train", T=64, device="cpu"), 2, seed=3,
                             rank=0, world_size=1)
    local = RankBatchStream(PretrainTokenStreamDataset(str(cache / "train"), T=64, device="cpu"), 2, seed=3,
                            rank=0, world_size=1)
    for _ in range(60):
        assert torch.equal(next(remote)[0], next(local)[0])
        assert held_disk(download_cache) <= BOUND
    remote._plan.prefetcher.close()


def test_a_split_that_fits_the_bound_is_mapped_whole(served, download_cache):
    cache, url, _ = served
    configure(cache_dir=download_cache, max_bytes=SHARDS * 2 * SHARD_TOKENS + (cache / "meta.json").stat().st_size)
    remote = PretrainTokenStreamDataset(url + "/train", T=64, device="cpu")
    g = torch.Generator().manual_seed(1)
    for _ in range(60):
        remote.get_batch(B=3, generator=g)
    assert remote.core.flat is not None  # every shard mirrored: one map, like a local cache


@pytest.mark.parametrize("sampler", ["global", "shard_windows"])
def test_indexed_windows_from_a_url_let_evicted_shards_go(served, download_cache, sampler):
    cache, url, BOUND = served
    configure(cache_dir=download_cache, max_bytes=BOUND)
    remote, local = IndexedWindowDataset(url, 64), IndexedWindowDataset(cache, 64)

    def make(ds):
        if sampler == "global":
            return GlobalBatchSampler(ds, 4, seed=2, rank=0, world_size=1)
        return ShardWindowSampler(ds, 4, seed=2, shards_at_once=2, rank=0, world_size=1)

    s = make(remote)
    n = 0
    for a, b in zip(ResumableDataLoader(remote, s), ResumableDataLoader(local, make(local)), strict=True):
        assert torch.equal(a["input_ids"], b["input_ids"])
        assert held_disk(download_cache) <= BOUND
        n += 1
    assert n == len(local) // 4
    for i in (0, len(remote) - 1):  # item by item too
        assert torch.equal(remote[i]["labels"], local[i]["labels"])
    assert not deleted_mapped(download_cache)
    s.prefetcher.close()


def test_eviction_reads_this_process_pins_from_memory_not_its_own_pin_file(tmp_path):
    from niels_gpt.storage.local_cache import pinned

    (tmp_path / "pins").mkdir()
    (tmp_path / "pins" / f"{os.getpid()}-999.txt").write_text("/old/set\n")  # written a set behind
    other = f"{tmp_path}/remote/m/other.bin"  # pins name files inside the mirrors (niels_gpt/confine.py)
    (tmp_path / "pins" / f"{os.getppid()}-1.txt").write_text(f"{other}\n")
    assert pinned(tmp_path) == {other}


def test_eviction_counts_a_download_that_landed_while_it_listed_the_directory(tmp_path, monkeypatch):
    import niels_gpt.storage.local_cache as local_cache

    d = tmp_path / "remote" / "m"
    d.mkdir(parents=True)
    (d / "a.bin").write_bytes(b"a" * 1000)  # listed as its temporary and its reservation, both gone since
    listing = [(str(d), [], [f"a.bin.tmp-{os.getpid()}", f"a.bin.reserved.tmp-{os.getpid()}"])]
    monkeypatch.setattr(local_cache.os, "walk", lambda top: iter(listing))
    with pytest.raises(local_cache.NoRoom):
        local_cache.make_room(tmp_path, 1500, 1000, set(), strict=True)


def test_the_prefetch_budget_leaves_out_the_marker(tmp_path):
    from types import SimpleNamespace

    from niels_gpt.loading.prefetch import PREFETCH_SHARE, ShardPrefetcher

    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "meta.json").write_bytes(b"x" * 60_000)  # 10,000 shards' records: a large marker
    remote = SimpleNamespace(root=tmp_path, local_dir=tmp_path / "m", marker="meta.json", max_bytes=100_000)
    assert ShardPrefetcher(remote).budget == int((100_000 - 60_000) * PREFETCH_SHARE)


def test_ranks_of_one_host_share_the_prefetch_budget(tmp_path, monkeypatch):
    from types import SimpleNamespace

    from niels_gpt.loading.prefetch import ShardPrefetcher, planners

    (tmp_path / "m").mkdir()
    remote = SimpleNamespace(root=tmp_path, local_dir=tmp_path / "m", marker="meta.json", max_bytes=1000,
                             size=lambda rel: 100, has=lambda rel: True)
    ahead = [f"train/shard_{i:05d}.bin" for i in range(10)]
    monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)
    alone = ShardPrefetcher(remote)
    assert len(alone.plan([], ahead)) == 7  # 0.75 of the bound
    alone.close()
    (tmp_path / "pins" / f"{os.getppid()}-0.txt").write_text("")  # another live process plans here too
    assert planners(tmp_path) == 2
    shared = ShardPrefetcher(remote)
    assert len(shared.plan([], ahead)) == 3  # half of it each
    shared.close()
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "4")  # ranks started together, before any pin file
    assert planners(tmp_path) == 4


def test_a_read_waits_for_downloads_in_progress_instead_of_passing_the_bound(served, download_cache, monkeypatch):
    """Five shards pinned and a sixth downloading slowly (its reservation) fill the bound; a read that needs
    a seventh now waits for that download to land, evicts it (not pinned), and never holds seven."""
    import threading

    from niels_gpt.storage import mirror
    from niels_gpt.storage.local_cache import Pins

    cache, url, BOUND = served
    configure(cache_dir=download_cache, max_bytes=BOUND)
    rc = mirror.RemoteCache(url)
    rels = [f"train/shard_{i:05d}.bin" for i in range(7)]
    pins = Pins(rc.root)
    pins.set(rc.fetch(r) for r in rels[:5])
    gate, slow_started = threading.Event(), threading.Event()
    download = mirror.RemoteCache._download

    def slow(self, rel, *args):
        if rel == rels[5]:
            slow_started.set()
            gate.wait(30)  # a transfer in progress, its room reserved
        download(self, rel, *args)
        held.append(held_disk(download_cache))  # the moment a download lands: the most the disk holds

    held: list[int] = []
    monkeypatch.setattr(mirror.RemoteCache, "_download", slow)
    prefetch = threading.Thread(target=rc.fetch, args=(rels[5],), kwargs={"prefetch": True})
    prefetch.start()
    assert slow_started.wait(30)
    read = threading.Thread(target=rc.fetch, args=(rels[6],))
    read.start()
    read.join(0.5)  # it waits for the room the slow download holds (it went past the bound before)
    gate.set()
    prefetch.join(30)
    read.join(30)
    pins.close()
    assert max(held) <= BOUND, held
    assert rc.has(rels[6]) and not rc.has(rels[5])  # landed, then evicted for the read
    assert all(rc.has(r) for r in rels[:5])  # pinned: kept


def test_a_wait_for_room_held_by_a_download_that_never_lands_ends_in_one_line(tmp_path):
    from niels_gpt.errors import StorageError
    from niels_gpt.storage.local_cache import make_room

    d = tmp_path / "remote" / "m"
    d.mkdir(parents=True)
    with open(d / f"a.bin.reserved.tmp-{os.getpid()}", "wb") as f:  # a live download's room, never released
        f.truncate(1000)
    with pytest.raises(StorageError, match=r"^https://h/c/b\.bin: waited 0 s for room in the download cache .*"
                                           r"other downloads in progress hold 1,000 of its 1,500 bytes"):
        make_room(tmp_path, 1500, 1000, set(), wait_s=0.05, what="https://h/c/b.bin")
    make_room(tmp_path, 1500, 1000, set())  # no wait asked: it goes ahead, as before


def test_a_queued_prefetch_whose_shard_left_the_plan_never_downloads(tmp_path, monkeypatch):
    """Its room would be taken from the shards still planned (and a read waits for it to land)."""
    import threading
    from types import SimpleNamespace

    from niels_gpt.loading.prefetch import ShardPrefetcher

    (tmp_path / "m").mkdir()
    gate, started, fetched = threading.Event(), threading.Event(), []

    def fetch(rel, prefetch=False):
        fetched.append(rel)
        started.set()
        gate.wait(30)

    remote = SimpleNamespace(root=tmp_path, local_dir=tmp_path / "m", marker="meta.json", max_bytes=1000,
                             size=lambda rel: 100, has=lambda rel: False, fetch=fetch)
    monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)
    p = ShardPrefetcher(remote, requests=1)
    p.plan(["a"], ["b", "c"])  # one download at a time: b and c queued behind a
    assert started.wait(30)
    p.plan(["d"], [])  # the plan moved on
    gate.set()
    p.wait()
    p.close()
    assert fetched == ["a", "d"]
