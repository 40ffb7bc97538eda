"""Random-window pretraining batches from memory-mapped token shards.

    ds = PretrainTokenStreamDataset("cache/pretrain/fineweb_edu/train", T=1024, device="cuda")
    x, y = ds.get_batch(B=32, generator=g)        # int64 (B, T); y[:, :-1] == x[:, 1:]

- A window is T+1 consecutive tokens inside one shard (never across a shard end): shard k with n_k
  tokens has n_k - T window starts.
- "Random windows within a randomly chosen shard": each row draws one global start uniformly from
  all window starts of all shards, so a shard is chosen with probability proportional to its number
  of window starts and the start is uniform inside it (a small last shard is not oversampled).
- One torch.randint per batch, then ONE gather through the window core (readers/windows_core.py: the
  split mapped back to back, the C kernel's fused gather and cast where it is built, the cold-cache
  prefetch, the frame cache of compressed shards, the local mirror of a URL). Shards are mapped lazily
  in each process; pickling the dataset (DataLoader workers) sends paths, not memory maps.
- On CUDA, x and y are built in pinned memory and copied with non_blocking=True.
- Compressed shards (`shard_*.bin.zst`, niels_gpt/formats/zstd_shard.py): the same draws; batches equal
  the uncompressed cache's bit for bit.
- A URL (`s3://bucket/cache/train`, see niels_gpt/storage) reads the cache through a local mirror: each
  batch's draws are made first, then the shards they reach are fetched (once, checked against meta.json),
  so batches and generator states equal the local cache's.

Cost (2 cores, warm page cache, 1 thread; `bench/bench_cache_readers.py`): see the figure at
`get_batch`.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from niels_gpt.errors import CacheError, ConfigError
from niels_gpt.meta import read_meta, unfinished_build
from niels_gpt.readers.checks import count
from niels_gpt.readers.frames import FRAME_CACHE_BYTES
from niels_gpt.readers.shards import split_shards
from niels_gpt.readers.windows_core import WindowCore
from niels_gpt.resume import cache_fingerprint
from niels_gpt.storage.remote import open_location, split_url
from niels_gpt.urls import is_url


class PretrainTokenStreamDataset:
    def __init__(self, shards_dir: str, *, T: int, device: str, frame_cache_bytes: int = FRAME_CACHE_BYTES):
        """
        shards_dir contains shard_*.bin (uint16).
        must memory-map shards; do not load all tokens into RAM.
        `frame_cache_bytes`: the bound of decompressed frames held for compressed shards (.bin.zst).
        """
        T = count("PretrainTokenStreamDataset", "T", T, what="a window length")
        self.remote = None
        if is_url(shards_dir):
            parent, split = split_url(shards_dir)
            local, self.remote = open_location(parent)
            shards_dir = local / split
        self.shards_dir = Path(shards_dir)
        self.T = T
        self.device = torch.device(device)
        self.split = self.shards_dir.name
        self.cache_dir = self.shards_dir.parent
        if self.remote is None and not self.shards_dir.is_dir():
            raise CacheError(unfinished_build(self.cache_dir) or f"{self.shards_dir}: no such shard directory")
        self.meta = read_meta(str(self.cache_dir))
        if self.meta.get("kind") != "pretrain" or not self.meta.get("built", True):
            raise CacheError(f"{self.cache_dir}: not a built pretraining cache (kind={self.meta.get('kind')!r}, "
                             f"built={self.meta.get('built')!r})")
        shards = split_shards(self.cache_dir, self.meta, self.split, remote=self.remote is not None)
        if not shards:
            raise CacheError(f"{self.shards_dir}: the {self.split} split of this cache is empty "
                             f"(totals: {self.meta['totals']})")
        self.core = WindowCore(self.shards_dir, self.meta, shards, T, 1, remote=self.remote,
                               frame_cache_bytes=frame_cache_bytes)
        self.shard_names, self.dtype = self.core.names, self.core.dtype
        if self.core.n == 0:
            raise ConfigError(f"T+1 = {T + 1} tokens exceeds every shard in {self.shards_dir} "
                              f"(largest has {int(self.core.tokens.max())} tokens): use a smaller T")

    @property
    def num_tokens(self) -> int:
        return int(self.core.tokens.sum())

    @property
    def vocab_size(self) -> int:
        return int(self.meta["vocab_size"])

    @property
    def _flat(self) -> np.ndarray | None:
        """Every window of the one range batches read (None until a batch mapped it)."""
        return self.core.flat

    @property
    def _frames(self):
        """The frame cache of a compressed split (None until its first batch)."""
        return self.core.frames

    def fingerprint(self) -> str:
        """The identity of this data in resume states (niels_gpt.resume.cache_fingerprint)."""
        return cache_fingerprint(self, self.shards_dir, self.meta, self.T)

    def sample_starts(self, B: int, generator: torch.Generator) -> tuple[np.ndarray, np.ndarray]:
        """(shard index, start within shard) for B random windows."""
        return self.core.locate(torch.randint(self.core.n, (B,), generator=generator).numpy())

    def draw_files(self, B: int, generator: torch.Generator) -> list[str]:
        """The shard files (relative to the cache) that get_batch(B, generator) would read, in first-use
        order, drawing exactly as it does: what a prefetcher fetches ahead (loading/prefetch.py)."""
        return self.core.files(self.sample_starts(B, generator)[0])

    def gather(self, shard: np.ndarray, local: np.ndarray) -> np.ndarray:
        """(B, T+1) windows, in the token dtype, row j the T+1 tokens at local[j] of shard shard[j]."""
        return self.core.gather(shard, local)

    def get_batch(self, *, B: int, generator: "torch.Generator") -> tuple["torch.LongTensor", "torch.LongTensor"]:
        """
        returns x,y of shape (B,T) on device, dtype int64
        invariant: y[:, :-1] == x[:, 1:]
        samples random windows within a randomly chosen shard.
        """
        # NOTE: measured by `bench/bench_cache_readers.py` (3 shards of 128 MB, warm page cache, one
        # thread, 2-core EPYC VM). With the C kernel: 32x1024 ~20 us a batch, 8x4096 ~18 us, i.e.
        # 0.75-1.2x the machine's limit (numpy's uint16->int64 astype of the 2*B*T tokens x and y hold)
        # and 40-50x / 18-23x nanoGPT's recipe: draw ~2 us, fused gather+cast ~9-10, x/y tensors ~2.
        # numpy path: ~44 and ~38 us (gather ~17, cast to int64 x and y ~20), 0.35-0.45x the limit.
        if type(B) is not int or B < 1:
            B = count("get_batch", "B", B, what="a batch size")
        return self.core.batch(torch.randint(self.core.n, (B,), generator=generator), self.device)
