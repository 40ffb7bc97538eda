"""The global order at the size users run: 48.8 M windows (100 B tokens at T=2048) cost a rank a chunk,
not int64[N] arrays; the order stays a permutation that depends only on (N, seed, epoch)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from niels_gpt.loading.order import CHUNK, SMALL_ORDER, EpochOrder, epoch_order, epoch_permutation, mix_seed
from niels_gpt.loading.sampler import GlobalBatchSampler
from niels_gpt.resume import fingerprint

WINDOWS = 48_800_000
LIMIT = 64 << 20


class Sized:
    """A dataset of `n` samples that is never read: the sampler only needs its length and its name."""

    def __init__(self, n):
        self.n = n

    def __len__(self):
        return self.n

    def fingerprint(self):
        return fingerprint("sized", self.n)


def held_bytes(obj, seen=None) -> int:
    """Bytes of every tensor reachable from `obj` through attributes, dicts, lists and tuples."""
    seen = set() if seen is None else seen
    if id(obj) in seen:
        return 0
    seen.add(id(obj))
    if isinstance(obj, torch.Tensor):
        return obj.untyped_storage().nbytes()
    if isinstance(obj, dict):
        return sum(held_bytes(k, seen) + held_bytes(v, seen) for k, v in obj.items())
    if isinstance(obj, (list, tuple, set)):
        return sum(held_bytes(v, seen) for v in obj)
    if hasattr(obj, "__dict__"):
        return held_bytes(vars(obj), seen)
    return 0


def test_a_rank_of_a_48_8_million_window_run_holds_well_under_64_mib_of_order():
    ds = Sized(WINDOWS)
    sampler = GlobalBatchSampler(ds, 512, seed=3, rank=5, world_size=8)
    it = iter(sampler)
    first = [next(it) for _ in range(3)]
    # the last batches of the epoch and the first of the next, as a resumed run or a prefetch plan reads them
    state = {**sampler.state_dict(), "samples_consumed": sampler.usable - 2 * 512, "order": None}
    sampler.load_state_dict(state)
    tail = list(sampler)
    head = next(iter(sampler))
    assert len(tail) == 2 and all(len(b) == 64 for b in first + tail + [head])
    assert all(0 <= i < WINDOWS for b in first + tail + [head] for i in b)
    held = held_bytes(sampler)
    assert held <= 2 * CHUNK * 8 < LIMIT, held  # two epochs' chunks at most, whatever N


def test_a_computed_order_is_a_permutation_for_every_size():
    for n in [1, 2, 3, 5, 16, 17, 100, 1000, 4097, CHUNK + 3]:
        for seed in range(3):
            perm = EpochOrder.seeded(n, seed).materialise()
            assert torch.equal(torch.sort(perm).values, torch.arange(n)), (n, seed)


def test_small_datasets_keep_the_randperm_order_and_large_ones_compute_theirs():
    g = torch.Generator().manual_seed(mix_seed(3, 1))
    assert torch.equal(epoch_permutation(1000, 3, 1), torch.randperm(1000, generator=g))
    assert isinstance(epoch_order(SMALL_ORDER + 1, 3, 1), EpochOrder)


def test_a_computed_order_depends_on_its_seed_alone_and_slices_agree_with_the_whole():
    n = 3 * CHUNK + 11
    whole = EpochOrder.seeded(n, 7).materialise()
    assert torch.equal(whole, EpochOrder.seeded(n, 7).materialise())
    assert not torch.equal(whole, EpochOrder.seeded(n, 8).materialise())
    order = EpochOrder.seeded(n, 7)
    for start, stop in [(0, 5), (CHUNK - 3, CHUNK + 4), (n - 9, n), (5, 5 + 2 * CHUNK), (17, 18)]:
        assert torch.equal(order.slice(start, stop), whole[start:stop])
    assert torch.equal(order[torch.tensor([n - 1, 0, CHUNK])], whole[[n - 1, 0, CHUNK]])


@pytest.mark.parametrize("n", [10, 1000])
def test_every_sample_lands_at_every_position_about_equally_often(n):
    # position of sample 0 over 2,000 seeds: each of 10 positions ~200 times (a fixed order would give 2,000)
    counts = torch.zeros(min(n, 10), dtype=torch.int64)
    for seed in range(2000):
        pos = int((EpochOrder.seeded(n, seed).materialise() == 0).nonzero()) * len(counts) // n
        counts[pos] += 1
    assert int(counts.min()) > 140 and int(counts.max()) < 260, counts.tolist()


def test_an_order_slices_like_the_tensor_it_stands_for():
    from niels_gpt.loading.order import TensorOrder

    whole = EpochOrder.seeded(300, 1).materialise()
    for order in (EpochOrder.seeded(300, 1), TensorOrder(whole)):
        for s in (slice(None, 8), slice(290, None), slice(5, 50, 7), slice(-10, None), slice(40, 20)):
            assert torch.equal(order[s], whole[s]), s


class Shards(Sized):
    """`n` windows in shards of `per` windows (the last one shorter), numbered shard after shard."""

    def __init__(self, n, per):
        super().__init__(n)
        self.counts = [per] * (n // per) + ([n % per] if n % per else [])

    def shard_counts(self):
        return self.counts

    def fingerprint(self):
        return fingerprint("shards", self.n, len(self.counts))


def test_a_rank_of_a_48_8_million_window_shard_window_run_holds_well_under_64_mib_of_order():
    import tracemalloc

    from niels_gpt.loading.shard_windows import ShardWindowOrder, ShardWindowSampler

    ds = Shards(WINDOWS, 9_973)  # 4,894 shards
    tracemalloc.start()
    try:
        sampler = ShardWindowSampler(ds, 512, seed=3, rank=5, world_size=8)
        it = iter(sampler)
        batches = [next(it) for _ in range(2)]
        for at in (WINDOWS // 2, sampler.usable - 512):  # the middle and the end of the epoch, as a resume reads them
            sampler.load_state_dict({**sampler.state_dict(), "samples_consumed": at, "order": None})
            batches.append(next(iter(sampler)))
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert isinstance(sampler._order(), ShardWindowOrder)
    assert all(len(b) == 64 and all(0 <= i < WINDOWS for i in b) for b in batches)
    held = held_bytes(sampler) + sum(a.nbytes for a in vars(sampler._order()).values() if hasattr(a, "nbytes"))
    assert held <= 4 << 20 and peak <= LIMIT, (held, peak)
    # a batch reads few shards: at most two a lane
    assert all(len({i // 9_973 for i in b}) <= 16 for b in batches)


@pytest.mark.parametrize("counts", [[40, 32, 48, 0, 40, 36, 40, 44, 40, 38, 41, 40], [1], [5, 0, 7], [3] * 20])
@pytest.mark.parametrize("K", [1, 3, 8, 40])
def test_a_computed_shard_window_order_is_a_permutation_read_k_shards_at_a_time(counts, K):
    from niels_gpt.loading.shard_windows import ShardWindowOrder

    order = ShardWindowOrder(counts, K, seed=5, epoch=1)
    perm = order.materialise()
    assert torch.equal(torch.sort(perm).values, torch.arange(sum(counts)))
    assert torch.equal(perm, ShardWindowOrder(counts, K, seed=5, epoch=1)[torch.arange(sum(counts))])
    first = np.cumsum(counts) - np.asarray(counts)
    shard = np.searchsorted(first, perm.numpy(), side="right") - 1
    lo = {k: np.flatnonzero(shard == k)[0] for k in set(shard.tolist())}
    hi = {k: np.flatnonzero(shard == k)[-1] for k in set(shard.tolist())}
    open_at = np.zeros(len(perm) + 1, dtype=int)
    for k in lo:
        open_at[lo[k]] += 1
        open_at[hi[k] + 1] -= 1
    assert np.cumsum(open_at).max() <= min(K, len(lo)) + 1  # K shards at a time, K+1 while a lane moves on


def test_small_shard_window_datasets_keep_the_sorted_times_order():
    from niels_gpt.loading.shard_windows import ShardWindowSampler, shard_epoch_order, shard_window_order

    counts = [40, 32, 48, 0, 40]
    assert torch.equal(shard_epoch_order(counts, 3, 5, 0).materialise(), shard_window_order(counts, 3, 5, 0).long())
    sampler = ShardWindowSampler(Shards(SMALL_ORDER + 1, 100_000), 8, seed=0, rank=0, world_size=1)
    assert type(sampler._order()).__name__ == "ShardWindowOrder"
