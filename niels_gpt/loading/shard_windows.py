"""Shard-aware random order: every window once per epoch, read from K shards at a time, so a download cache
smaller than the split does not fetch evicted shards again (docs/storage.md measures the trade-off).

- shards: torch.randperm from (seed, epoch); shard j goes to lane j mod K, a lane reads its shards in turn;
- up to SMALL_ORDER windows (`shard_window_order`): each window gets a time uniform in its shard's stretch of
  its lane (a lane's first shard shortened by (K + r) / 2K in lane r, so lanes change shard at other moments);
  the order is every window sorted by time. Worked example, K=2, shards a, b, c of 4 windows: lane 0 = a then
  c (a: [0, 1/3), c: [1/3, 1)), lane 1 = b: the first third mixes a and b, the rest c and b;
- above (`ShardWindowOrder`), position by position: the lanes take turns a window at a time, a shard's
  windows in a keyed permutation (loading/order.py). Worked example, K=2, lanes [a, c] and [b] of 4 windows
  each: positions 0..7 alternate a and b, 8..11 are c.

Cost: one rand and one stable sort of N per epoch (3.3 s for 13 M windows on 2 cores), int32[N] held.
"""

from __future__ import annotations

import numpy as np
import torch

from niels_gpt.errors import ConfigError, StateError
from niels_gpt.loading.order import (
    MASK31,
    ROUNDS,
    SMALL_ORDER,
    EpochOrder,
    Order,
    TensorOrder,
    mix_seed,
)
from niels_gpt.loading.sampler import GlobalBatchSampler

SHARDS_AT_ONCE = 8
SHARD_WINDOW_KIND = "shard_window_sampler"
ORDER_CHUNK = 1 << 20  # windows whose times (and ids) are computed at once


def shard_window_order(counts, K: int, seed: int, epoch: int) -> torch.Tensor:
    """The epoch order (window indices, int32 below 2**31 windows) for shards holding `counts[k]` windows
    each, window indices numbered shard by shard in the given order (as IndexedWindowDataset numbers them)."""
    counts = torch.as_tensor(counts, dtype=torch.int64)
    S = len(counts)
    g = torch.Generator()
    g.manual_seed(mix_seed(seed, epoch, K, 1))
    perm = torch.randperm(S, generator=g)
    n = counts[perm]  # windows of each shard, in the order they are read
    lane = torch.arange(S) % K
    # each shard's interval in its lane's time: its windows, the lane's first shard shortened (staggering)
    length = n.double()
    length[:K] *= (K + torch.arange(min(K, S), dtype=torch.float64)) / (2 * K)
    before = torch.zeros(S, dtype=torch.float64)  # where a shard's interval starts in its lane
    lane_total = torch.ones(K, dtype=torch.float64)
    for r in range(min(K, S)):
        idx = torch.arange(r, S, K)
        cum = torch.cumsum(length[idx], 0)
        before[idx] = cum - length[idx]
        lane_total[r] = max(float(cum[-1]), 1.0)
    N = int(n.sum())
    start = torch.cumsum(n, 0) - n  # where each shard's windows begin in perm order
    shift = (torch.cumsum(counts, 0) - counts)[perm] - start  # perm-order index -> window index
    # NOTE: the same arithmetic as one expression over N windows, a chunk at a time and in place: the
    # times are bit-identical, and the temporaries are a chunk's, not five float64/int64 arrays of N
    times = torch.rand(N, generator=g, dtype=torch.float64)
    for a in range(0, N, ORDER_CHUNK):
        b = min(a + ORDER_CHUNK, N)
        pos = torch.searchsorted(start, torch.arange(a, b), right=True) - 1  # the perm position of each window
        times[a:b] = (before[pos] + times[a:b] * length[pos]) / lane_total[lane[pos]]
    order = torch.sort(times, stable=True).indices
    del times
    out = torch.empty(N, dtype=torch.int32 if N < 2**31 else torch.int64)
    for a in range(0, N, ORDER_CHUNK):
        j = order[a:a + ORDER_CHUNK]
        out[a:a + len(j)] = j + shift[torch.searchsorted(start, j, right=True) - 1]
    return out


class ShardWindowOrder(Order):
    """The shard-window order of one epoch, position by position: `order[positions]`, `order.slice(a, b)`."""

    def __init__(self, counts, K: int, seed: int, epoch: int):
        counts = np.asarray(counts, dtype=np.int64).reshape(-1)
        S = len(counts)
        g = torch.Generator()
        g.manual_seed(mix_seed(seed, epoch, K, 2))
        perm = torch.randperm(S, generator=g).numpy()
        self.keys = torch.randint(0, MASK31 + 1, (ROUNDS,), generator=g, dtype=torch.int64).tolist()
        self.counts, self.n = counts, int(counts.sum())
        self.first = np.cumsum(counts) - counts  # window id of each shard's first window
        self.lanes = [perm[r::K] for r in range(K)]  # shard ids, in the order each lane reads them
        self.lane_end = [np.cumsum(counts[lane]) for lane in self.lanes]  # lane item after each of its shards
        lengths = np.array([int(e[-1]) if len(e) else 0 for e in self.lane_end], dtype=np.int64)
        # phases: between two lane lengths the same lanes take turns; position p of phase m is item
        # u = level[m] + (p - start[m]) // len(active) of lane active[(p - start[m]) % len(active)]
        self.start, self.level, self.active, self.width = [], [], [], []
        p = u = 0
        for top in sorted(set(lengths.tolist()) - {0}):
            act = np.flatnonzero(lengths > u)
            self.start.append(p), self.level.append(u), self.width.append(len(act))
            self.active.append(np.pad(act, (0, K - len(act))))
            p, u = p + (top - u) * len(act), top
        self.start, self.level, self.width = (np.array(a, dtype=np.int64) for a in (self.start, self.level, self.width))
        self.active = np.array(self.active, dtype=np.int64).reshape(-1, K)

    def _shard_order(self, shard: int) -> EpochOrder:
        """The keyed permutation of one shard's windows (the epoch's keys tweaked by the shard)."""
        tweak = [(shard * 0x9E3779B1 + i * 0x85EBCA6B + 1) & MASK31 for i in range(ROUNDS)]
        return EpochOrder(int(self.counts[shard]), torch.tensor([k ^ t for k, t in zip(self.keys, tweak, strict=True)]))

    def _at(self, positions: torch.Tensor) -> torch.Tensor:
        p = positions.numpy()
        m = np.searchsorted(self.start, p, side="right") - 1
        q = p - self.start[m]
        u = self.level[m] + q // self.width[m]  # the item of its lane
        lane = self.active[m, q % self.width[m]]
        out = np.empty(len(p), dtype=np.int64)
        shard = np.empty(len(p), dtype=np.int64)
        for r, (shards, end) in enumerate(zip(self.lanes, self.lane_end, strict=True)):
            sel = np.flatnonzero(lane == r)
            if len(sel):
                j = np.searchsorted(end, u[sel], side="right")
                shard[sel] = shards[j]
                out[sel] = u[sel] - (end[j] - self.counts[shards[j]])  # the window's place in its shard
        for k in np.unique(shard):  # K or K+1 shards in a chunk of consecutive positions
            sel = np.flatnonzero(shard == k)
            out[sel] = self.first[k] + self._shard_order(int(k))[torch.from_numpy(out[sel])].numpy()
        return torch.from_numpy(out)


def shard_epoch_order(counts, K: int, seed: int, epoch: int) -> TensorOrder | ShardWindowOrder:
    """Up to SMALL_ORDER windows the held order of shard_window_order; above, one computed position by position."""
    if sum(int(c) for c in counts) <= SMALL_ORDER:
        return TensorOrder(shard_window_order(counts, K, seed, epoch))
    return ShardWindowOrder(counts, K, seed, epoch)


class ShardWindowSampler(GlobalBatchSampler):
    """A GlobalBatchSampler whose epoch order reads `shards_at_once` shards at a time, over a dataset that
    numbers its windows shard after shard (`shard_counts()`, as IndexedWindowDataset)."""

    kind = SHARD_WINDOW_KIND

    def __init__(self, dataset, global_batch_size: int | None, *, seed: int, shards_at_once: int = SHARDS_AT_ONCE,
                 rank: int | None = None, world_size: int | None = None, prefetch: bool | None = None,
                 batch_schedule=None):
        if isinstance(shards_at_once, bool) or not isinstance(shards_at_once, int) or shards_at_once < 1:
            raise ConfigError(f"shards_at_once={shards_at_once!r}: the number of shards read at a time must be a "
                              "positive int (default 8)")
        if not hasattr(dataset, "shard_counts"):
            raise ConfigError(f"{type(dataset).__name__} does not say how many windows each shard holds "
                              "(shard_counts()); shard-window sampling reads IndexedWindowDataset")
        self.shards_at_once = shards_at_once
        self.counts = list(dataset.shard_counts())
        super().__init__(dataset, global_batch_size, seed=seed, rank=rank, world_size=world_size, prefetch=prefetch,
                         batch_schedule=batch_schedule)

    def permutation(self, epoch: int) -> TensorOrder | ShardWindowOrder:
        return shard_epoch_order(self.counts, self.shards_at_once, self.seed, epoch)

    def order_state(self) -> dict:
        return {"shards_at_once": self.shards_at_once}

    def check_order_state(self, state: dict) -> None:
        if state.get("shards_at_once") != self.shards_at_once:
            raise StateError(f"sampler state: written with shards_at_once={state.get('shards_at_once')!r}, this "
                             f"sampler reads {self.shards_at_once} shards at a time: resume with the same value")
