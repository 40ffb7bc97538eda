"""Shard-window sampling: every window once per epoch, K shards at a time, deterministic and resumable."""

from __future__ import annotations

import bisect

import numpy as np
import pytest
import torch
from torch.utils.data import Dataset

from niels_gpt.errors import ConfigError, StateError
from niels_gpt.loading.sampler import ResumableDataLoader
from niels_gpt.loading.shard_windows import ShardWindowSampler, shard_window_order
from niels_gpt.loading.windows import IndexedWindowDataset
from niels_gpt.resume import fingerprint

from ..conftest import write_pretrain_cache

COUNTS = [40, 32, 48, 0, 40, 36, 40, 44, 40, 38, 41, 40]


class Shards(Dataset):
    """ds[i] = i over shards of COUNTS windows, numbered shard after shard (as IndexedWindowDataset)."""

    def __init__(self, counts=COUNTS):
        self.counts = list(counts)
        self.first = np.concatenate([[0], np.cumsum(self.counts)]).tolist()

    def __len__(self):
        return self.first[-1]

    def __getitem__(self, i):
        return torch.tensor(i)

    def shard_counts(self):
        return self.counts

    def fingerprint(self):
        return fingerprint("shards", self.counts)

    def shard_of(self, i):
        return bisect.bisect_right(self.first, i) - 1


@pytest.mark.parametrize("K", [1, 3, 8, 40])
def test_every_window_once_per_epoch_from_k_shards_at_a_time(K):
    ds = Shards()
    for epoch in (0, 1):
        order = shard_window_order(COUNTS, K, seed=5, epoch=epoch).tolist()
        assert sorted(order) == list(range(len(ds)))
        shards = [ds.shard_of(i) for i in order]
        # a shard is needed from its first window to its last: at no point are more than K shards needed
        first = {k: shards.index(k) for k in set(shards)}
        last = {k: len(shards) - 1 - shards[::-1].index(k) for k in set(shards)}
        open_at = np.zeros(len(shards) + 1, dtype=int)
        for k in first:
            open_at[first[k]] += 1
            open_at[last[k] + 1] -= 1
        assert np.cumsum(open_at).max() == min(K, 11)  # 11 shards hold windows
    assert not torch.equal(shard_window_order(COUNTS, 3, 5, 0), shard_window_order(COUNTS, 3, 5, 1))
    assert torch.equal(shard_window_order(COUNTS, 3, 5, 0), shard_window_order(COUNTS, 3, 5, 0))


def test_one_shard_at_a_time_reads_each_shard_whole_before_the_next():
    ds = Shards()
    shards = [ds.shard_of(i) for i in shard_window_order(COUNTS, 1, seed=0, epoch=0).tolist()]
    runs = [s for j, s in enumerate(shards) if j == 0 or shards[j - 1] != s]
    assert sorted(runs) == sorted(k for k, c in enumerate(COUNTS) if c)  # each shard exactly one run


@pytest.mark.parametrize("world", [1, 2, 4])
def test_batches_and_resume_do_not_depend_on_world_size_or_workers(world):
    ds = Shards()

    def rank_batches(rank, world, state=None, n=None, workers=0):
        s = ShardWindowSampler(ds, 8, seed=2, shards_at_once=3, rank=rank, world_size=world)
        loader = ResumableDataLoader(ds, s, num_workers=workers)
        if state is not None:
            loader.load_state_dict(state)
        out = []
        for b in loader:
            out.append(b.tolist())
            if n is not None and len(out) == n:
                return out, loader.state_dict()
        return out, loader.state_dict()

    one, _ = rank_batches(0, 1)
    ranks = [rank_batches(r, world)[0] for r in range(world)]
    merged = [sum((ranks[r][t] for r in range(world)), []) for t in range(len(one))]
    assert merged == one
    first, state = rank_batches(0, 1, n=7, workers=2)
    rest, _ = rank_batches(0, world, state=state)  # resumed on another world size: rank 0's share
    assert first + merged[7:] == one and [b[:8 // world] for b in merged[7:]] == rest


def test_a_state_of_another_k_or_of_the_global_sampler_is_refused():
    from niels_gpt.loading.sampler import GlobalBatchSampler

    ds = Shards()
    state = ShardWindowSampler(ds, 8, seed=0, shards_at_once=3, rank=0, world_size=1).state_dict()
    with pytest.raises(StateError, match="written with shards_at_once=3, this sampler reads 4 shards at a time"):
        ShardWindowSampler(ds, 8, seed=0, shards_at_once=4, rank=0, world_size=1).load_state_dict(state)
    with pytest.raises(StateError, match="shard_window_sampler"):
        GlobalBatchSampler(ds, 8, seed=0, rank=0, world_size=1).load_state_dict(state)


@pytest.mark.parametrize("bad", [0, -1, 2.0, True])
def test_shards_at_once_must_be_a_positive_int(bad):
    with pytest.raises(ConfigError, match=f"shards_at_once={bad!r}: the number of shards read at a time"):
        ShardWindowSampler(Shards(), 8, seed=0, shards_at_once=bad, rank=0, world_size=1)


def test_a_dataset_without_shard_counts_is_refused():
    with pytest.raises(ConfigError, match="does not say how many windows each shard holds"):
        ShardWindowSampler(list(range(100)), 8, seed=0, rank=0, world_size=1)


def test_indexed_windows_of_a_real_cache_are_read_k_shards_at_a_time(tmp_path):
    cache = write_pretrain_cache(tmp_path / "c", {"train": [np.arange(i, i + 321) % 2000 for i in range(6)]})
    ds = IndexedWindowDataset(cache, 16)
    assert ds.shard_counts() == [20] * 6
    s = ShardWindowSampler(ds, 4, seed=1, shards_at_once=2, rank=0, world_size=1)
    batches = list(s)
    assert len(batches) == 30 and sorted(sum(batches, [])) == list(range(120))
    assert max(len(ds.shard_files(b)) for b in batches) <= 3  # K, and one more where a lane moves on
    loader = ResumableDataLoader(ds, ShardWindowSampler(ds, 4, seed=1, shards_at_once=2, rank=0, world_size=1))
    for b, idx in zip(loader, batches, strict=True):
        assert torch.equal(b["input_ids"], torch.stack([ds[i]["input_ids"] for i in idx]))


def reference_order(counts, K, seed, epoch):
    """The order written as one expression over all N windows (what shard_window_order computes in chunks)."""
    from niels_gpt.loading.order import mix_seed

    counts = torch.as_tensor(counts, dtype=torch.int64)
    S = len(counts)
    g = torch.Generator()
    g.manual_seed(mix_seed(seed, epoch, K, 1))
    perm = torch.randperm(S, generator=g)
    n = counts[perm]
    lane = torch.arange(S) % K
    length = n.double()
    length[:K] *= (K + torch.arange(min(K, S), dtype=torch.float64)) / (2 * K)
    before = torch.zeros(S, dtype=torch.float64)
    lane_total = torch.ones(K, dtype=torch.float64)
    for r in range(min(K, S)):
        idx = torch.arange(r, S, K)
        cum = torch.cumsum(length[idx], 0)
        before[idx] = cum - length[idx]
        lane_total[r] = max(float(cum[-1]), 1.0)
    N = int(n.sum())
    pos = torch.repeat_interleave(torch.arange(S), n)
    times = (before[pos] + torch.rand(N, generator=g, dtype=torch.float64) * length[pos]) / lane_total[lane[pos]]
    order = torch.sort(times, stable=True).indices
    first = torch.cumsum(counts, 0) - counts
    start = torch.cumsum(n, 0) - n
    return (torch.arange(N) - start[pos] + first[perm][pos])[order]


@pytest.mark.parametrize("chunk", [7, 1 << 20])
def test_the_order_computed_in_chunks_is_the_order_of_one_expression(chunk, monkeypatch):
    import niels_gpt.loading.shard_windows as sw

    monkeypatch.setattr(sw, "ORDER_CHUNK", chunk)
    g = torch.Generator().manual_seed(0)
    counts = torch.randint(0, 50, (40,), generator=g).tolist() + [0, 0]
    for K, seed in [(1, 0), (3, 5), (8, 2), (50, 1)]:
        got = shard_window_order(counts, K, seed, epoch=1)
        assert got.dtype == torch.int32
        assert torch.equal(got.long(), reference_order(counts, K, seed, 1))
    assert torch.equal(shard_window_order(COUNTS, 3, 5, 0).long(), reference_order(COUNTS, 3, 5, 0))
