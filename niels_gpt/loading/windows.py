"""Map-style windows over a pretraining cache split: sample i -> T+1 tokens at a fixed place.

Each shard is cut into windows of T+1 tokens with stride T (every token but a shard's first is a target once
per epoch), read through the random-window reader's core (readers/windows_core.py: its worked example's stride
3 is this dataset at T=3); index -> (shard, offset) is a binary search in the cumulative window counts.
"""

from __future__ import annotations

import bisect
import operator
import os
from collections.abc import Sequence

import numpy as np
import torch

from niels_gpt.readers.checks import count
from niels_gpt.readers.windows_core import open_split
from niels_gpt.resume import fingerprint
from niels_gpt.storage.remote import open_location

_CPU = torch.device("cpu")


class WindowBatch(Sequence):
    """One batch of windows gathered at once: x, y (B, T) int64; item i is ds[i]."""

    def __init__(self, x: torch.Tensor, y: torch.Tensor):
        self.x, self.y = x, y

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i):
        return {"input_ids": self.x[i], "labels": self.y[i]}


def collate_windows(data):
    """default_collate, but a WindowBatch is already the batch: {"input_ids": x, "labels": y}, no copy."""
    if isinstance(data, WindowBatch):
        return {"input_ids": data.x, "labels": data.y}
    return torch.utils.data.default_collate(data)


class IndexedWindowDataset(torch.utils.data.Dataset):
    """`ds[i] -> {"input_ids": int64[T], "labels": int64[T]}` from `<cache_dir>/<split>/shard_*.bin`."""

    def __init__(self, cache_dir: str | os.PathLike, T: int, *, split: str = "train"):
        T = count("IndexedWindowDataset", "T", T, what="a window length")
        self.cache_dir, self.remote = open_location(cache_dir)
        self.T, self.split = int(T), split
        meta, self.core = open_split(self.cache_dir, split, self.T, self.T, remote=self.remote)
        self.paths, self.dtype = self.core.paths, self.core.dtype
        self.cumulative = self.core.cum.tolist()
        self._fingerprint = fingerprint("indexed_windows", self.T, split, meta["token_dtype"],
                                        {n: meta["files"][f"{split}/{n}"].get("sha256") for n in self.core.names})

    def fingerprint(self) -> str:
        """Identifies (files by sha256, T, split): a resume state carries it."""
        return self._fingerprint

    def __len__(self) -> int:
        return self.cumulative[-1]

    def locate(self, index: int) -> tuple[int, int]:
        """index -> (shard number, token offset of the window in that shard)."""
        if not 0 <= index < len(self):
            raise IndexError(f"window {index} out of range [0, {len(self)})")
        shard = bisect.bisect_right(self.cumulative, index) - 1
        return shard, (index - self.cumulative[shard]) * self.T

    def shard_counts(self) -> list[int]:
        """Windows in each shard, in index order."""
        return self.core.counts.tolist()

    def shard_files(self, indices) -> list[str]:
        """The files (relative to the cache) holding the windows `indices`, in first-use order."""
        return self.core.files(self.core.locate(np.asarray(indices, dtype=np.int64))[0])

    def __getitem__(self, index: int) -> dict:
        if isinstance(index, bool) or not hasattr(index, "__index__"):  # an int, numpy or 0-d torch one; not 1.5, "1"
            raise TypeError(f"IndexedWindowDataset indices are integers, got {index!r} ({type(index).__name__})")
        shard, local = self.locate(operator.index(index))
        window = torch.from_numpy(self.core.gather(np.array([shard]), np.array([local]))[0].astype(np.int64))
        return {"input_ids": window[:-1], "labels": window[1:]}

    def __getitems__(self, indices) -> WindowBatch:
        """[ds[i] for i in indices] in one gather; `collate_windows` makes it the batch without a copy."""
        i = np.array(indices)  # a copy: the core overwrites it with rows
        if len(i) and (i.dtype.kind not in "iu" or i.min() < 0 or i.max() >= len(self)):
            for j in indices:
                self[j]  # raises what ds[j] raises for the first bad one
        i = torch.from_numpy(i.astype(np.int64, copy=False))
        return WindowBatch(*self.core.batch(i, _CPU))
