"""Random-window pretraining batches from memory-mapped token shards.

    ds = PretrainTokenStreamDataset("cache/pretrain/fineweb_edu/train", T=1024, device="cuda")
    x, y = ds.get_batch(B=32, generator=g)        # int64 (B, T); y[:, :-1] == x[:, 1:]

Each row draws one start uniformly from all window starts of all shards (a window never crosses a shard
end), then ONE gather through the window core (readers/windows_core.py): raw, compressed or remote alike.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from niels_gpt.readers.checks import count
from niels_gpt.readers.frames import FRAME_CACHE_BYTES
from niels_gpt.readers.windows_core import open_split
from niels_gpt.resume import cache_fingerprint
from niels_gpt.storage.remote import open_location, split_url
from niels_gpt.urls import is_url


class PretrainTokenStreamDataset:
    def __init__(self, shards_dir: str, *, T: int, device: str, frame_cache_bytes: int = FRAME_CACHE_BYTES):
        """`shards_dir`: `<cache>/<split>` (or its URL); `frame_cache_bytes`: see readers/frames.py."""
        T = count("PretrainTokenStreamDataset", "T", T, what="a window length")
        local = Path(shards_dir)
        parent, self.split = split_url(shards_dir) if is_url(shards_dir) else (local.parent, local.name)
        self.cache_dir, self.remote = open_location(parent)
        self.shards_dir, self.T, self.device = self.cache_dir / self.split, T, torch.device(device)
        self.meta, self.core = open_split(self.cache_dir, self.split, T, 1, remote=self.remote,
                                          frame_cache_bytes=frame_cache_bytes)
        self.shard_names, self.dtype = self.core.names, self.core.dtype

    @property
    def num_tokens(self) -> int:
        return int(self.core.tokens.sum())

    @property
    def vocab_size(self) -> int:
        return int(self.meta["vocab_size"])

    def fingerprint(self) -> str:
        return cache_fingerprint(self, self.shards_dir, self.meta, self.T)

    def sample_starts(self, B: int, generator: torch.Generator) -> tuple[np.ndarray, np.ndarray]:
        """(shard index, start within shard) for B random windows."""
        return self.core.locate(torch.randint(self.core.n, (B,), generator=generator).numpy())

    def draw_files(self, B: int, generator: torch.Generator) -> list[str]:
        """The shard files (relative to the cache) get_batch(B, generator) would read, in first-use order."""
        return self.core.files(self.sample_starts(B, generator)[0])

    def gather(self, shard: np.ndarray, local: np.ndarray) -> np.ndarray:
        """(B, T+1) windows in the token dtype, row j at local[j] of shard shard[j]."""
        return self.core.gather(shard, local)

    def get_batch(self, *, B: int, generator: "torch.Generator") -> tuple["torch.LongTensor", "torch.LongTensor"]:
        """x, y (B, T) int64 on the device, y[:, :-1] == x[:, 1:], from B random windows.

        Cost: ~20 us a 32x1024 batch with the C kernel (README's Measured, bench/bench_cache_readers.py)."""
        if type(B) is not int or B < 1:
            B = count("get_batch", "B", B, what="a batch size")
        return self.core.batch(torch.randint(self.core.n, (B,), generator=generator), self.device)
