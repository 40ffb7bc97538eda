"""Bin packing of sequence lengths: first-fit-decreasing, best-fit-decreasing, first-fit-shuffle.

`pack_lengths` puts every sequence in exactly one bin of at most `pack_size` tokens and returns a CSR
`BinAssignment` (`bin_offsets[b]:bin_offsets[b+1]` indexes `items`, bin b's sequence ids in placement order).
ffd and first_fit_shuffle are the Megatron-Bridge/NeMo packers' algorithms; bfd packs the same or better. The
peers scan every open bin per sequence (O(n * bins)); these do not:

- ffd / bfd place the sorted lengths one *run of equal length* at a time: a bin that takes one item of length
  s keeps being chosen while it has room for s, so each open bin absorbs `remaining // s` items in one
  vectorised pass (in bin order, or by remaining room for bfd), and the rest open new bins at once.
  O(n log n) plus O(distinct lengths * open bins) numpy work.
- first_fit_shuffle visits the lengths in a seeded `torch.randperm` order and finds the first bin with room
  in a max segment tree over bins (O(log n) each); unopened leaves hold `pack_size`.

Ties break by a fixed rule (stable sort by length descending, then id): the result is a pure function of
(lengths, pack_size, algorithm, seed). Figures: docs/packing.md (`bench/bench_packing.py`).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from niels_gpt.constants import SEED
from niels_gpt.errors import ConfigError
from niels_gpt.seeds import TorchDraws

ALGORITHMS = ("ffd", "bfd", "first_fit_shuffle")
DEFAULT_ALGORITHM = "ffd"
DEFAULT_PACK_SIZE = 4096
DEFAULT_SEED = SEED


@dataclass(frozen=True)
class BinAssignment:
    """Which sequences go to which bin (CSR). `lengths` are the packed lengths (after truncation)."""

    bin_offsets: np.ndarray  # int64[num_bins + 1]
    items: np.ndarray  # int64[n]: sequence ids, bin by bin, in placement order
    lengths: np.ndarray  # int64[n]: packed length of each sequence id
    pack_size: int
    algorithm: str

    @property
    def num_bins(self) -> int:
        return len(self.bin_offsets) - 1

    def bin_items(self, b: int) -> np.ndarray:
        return self.items[self.bin_offsets[b]:self.bin_offsets[b + 1]]

    def bin_lengths(self) -> np.ndarray:
        """int64[num_bins]: tokens held by each bin."""
        csum = np.concatenate([[0], np.cumsum(self.lengths[self.items])])
        return csum[self.bin_offsets[1:]] - csum[self.bin_offsets[:-1]]

    def efficiency(self) -> float:
        """Non-pad fraction: tokens / (num_bins * pack_size); 1.0 for an empty assignment."""
        if self.num_bins == 0:
            return 1.0
        return float(self.lengths.sum()) / (self.num_bins * self.pack_size)


def pack_lengths(lengths, pack_size: int = DEFAULT_PACK_SIZE, algorithm: str = DEFAULT_ALGORITHM,
                 *, seed: int = DEFAULT_SEED) -> BinAssignment:
    """Assign sequences of lengths in 1..pack_size to bins; `seed` only matters for first_fit_shuffle."""
    if algorithm not in ALGORITHMS:
        raise ConfigError(f"unknown packing algorithm {algorithm!r}; choose one of {', '.join(ALGORITHMS)}")
    if not isinstance(pack_size, (int, np.integer)) or pack_size < 1:
        raise ConfigError(f"pack_size must be a positive integer, got {pack_size!r}")
    lengths = np.asarray(lengths, dtype=np.int64)
    if lengths.ndim != 1:
        raise ConfigError(f"lengths must be 1-D, got shape {lengths.shape}")
    if lengths.size and (lengths.min() < 1 or lengths.max() > pack_size):
        bad = int(np.flatnonzero((lengths < 1) | (lengths > pack_size))[0])
        raise ConfigError(
            f"sequence {bad} has length {int(lengths[bad])}, outside 1..{pack_size}: drop empty sequences "
            "and truncate or reject long ones before packing"
        )
    if algorithm == "first_fit_shuffle":
        perm = np.array(TorchDraws(int(seed)).permutation(len(lengths)), dtype=np.int64)  # torch.randperm's
        bin_of = _first_fit(lengths[perm], int(pack_size))
        visit = perm
    else:
        # Stable sort by length descending, ties by sequence id: the fixed tie-breaking rule.
        visit = np.argsort(-lengths, kind="stable")
        bin_of = _decreasing(lengths[visit], int(pack_size), best_fit=algorithm == "bfd")
    # Group by bin, keeping placement order within each bin (stable sort on bin id).
    by_bin = np.argsort(bin_of, kind="stable")
    items = visit[by_bin]
    counts = np.bincount(bin_of, minlength=int(bin_of.max()) + 1 if bin_of.size else 0)
    offsets = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
    return BinAssignment(offsets, items.astype(np.int64), lengths, int(pack_size), algorithm)


def _decreasing(sorted_len: np.ndarray, pack_size: int, *, best_fit: bool) -> np.ndarray:
    """Bin id for each of the (descending) lengths, first fit or best fit, one run of equal lengths at a time."""
    n = len(sorted_len)
    bin_of = np.empty(n, dtype=np.int64)
    rem = np.empty(max(n, 1), dtype=np.int64)  # remaining room of bin b; at most n bins
    nbins = 0
    if n == 0:
        return bin_of
    run_starts = np.concatenate([[0], np.flatnonzero(np.diff(sorted_len)) + 1, [n]])
    for a, b in zip(run_starts[:-1].tolist(), run_starts[1:].tolist(), strict=True):
        s = int(sorted_len[a])
        pos = a  # next item of the run to place
        if nbins:
            open_rem = rem[:nbins]
            cand = np.flatnonzero(open_rem >= s)
            if cand.size:
                pos = _deal_run(cand, open_rem, s, pos, b, bin_of, best_fit=best_fit, pack_size=pack_size)
        left = b - pos
        if left:
            # Open new bins, each holding pack_size // s items of the run (the last one the rest).
            per_bin = pack_size // s
            m = -(-left // per_bin)
            counts = np.full(m, per_bin, dtype=np.int64)
            counts[-1] = left - per_bin * (m - 1)
            bin_of[pos:b] = np.repeat(np.arange(nbins, nbins + m), counts)
            rem[nbins:nbins + m] = pack_size - s * counts
            nbins += m
    return bin_of


def _deal_run(cand, open_rem, s, pos, end, bin_of, *, best_fit: bool, pack_size: int) -> int:
    """Place items pos..end-1 (length s) into candidate bins; update open_rem; return the new pos."""
    k = end - pos
    crem = open_rem[cand]
    caps = crem // s
    if best_fit and caps.sum() > k:
        # Only the bins with the least room are used: find the room value t at which the capacity
        # of bins with room < t stops covering k; bins with room == t take the rest in bin order.
        cap_by_room = np.bincount(crem, weights=caps, minlength=pack_size + 1)[s:]
        t = s + int(np.searchsorted(np.cumsum(cap_by_room), k))
        keep = crem <= t
        cand, crem, caps = cand[keep], crem[keep], caps[keep]
    if best_fit:
        order = np.lexsort((cand, crem))  # room ascending, then bin index
        cand, caps = cand[order], caps[order]
    csum = np.cumsum(caps)
    used = int(np.searchsorted(csum, k))  # bins 0..used are touched (the last one maybe partly)
    if used >= len(cand):
        used = len(cand) - 1
    take = caps[:used + 1].copy()
    placed_before = int(csum[used - 1]) if used else 0
    take[used] = min(int(take[used]), k - placed_before)
    take = take[take > 0]
    nplaced = int(take.sum())
    bins = cand[:len(take)]
    bin_of[pos:pos + nplaced] = np.repeat(bins, take)
    open_rem[bins] -= s * take
    return pos + nplaced


def _first_fit(visit_len: np.ndarray, pack_size: int) -> np.ndarray:
    """Bin id of each length in visiting order, first fit, via a max segment tree over bins."""
    n = len(visit_len)
    size = 1
    while size < n:
        size *= 2
    # Leaves size..2*size-1 hold the room of bins 0..size-1; unopened bins hold pack_size.
    tree = [pack_size] * (2 * size)
    out = [0] * n
    for i, s in enumerate(visit_len.tolist()):
        node = 1
        while node < size:
            node *= 2
            if tree[node] < s:
                node += 1
        out[i] = node - size
        tree[node] -= s
        node //= 2
        while node:
            left = tree[2 * node]
            right = tree[2 * node + 1]
            best = left if left > right else right
            if tree[node] == best:
                break  # NOTE: the maximum above this node is unchanged: stop early
            tree[node] = best
            node //= 2
    return np.asarray(out, dtype=np.int64)
