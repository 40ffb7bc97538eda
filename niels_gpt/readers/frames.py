"""The frame cache of compressed shards: decompressed frames laid out where their tokens would be.

One reserved range (MAP_NORESERVE) holds the split's tokens, each shard from a frame boundary, so a window
is a plain slice and a batch one gather. `ready[f]` says the frames a window starting in f reaches are
resident; a batch decompresses the frames it lacks first. At most `max_bytes` stay resident, first in first
out (MADV_DONTNEED); each process (DataLoader worker) holds its own.
"""

from __future__ import annotations

import mmap
from collections import deque
from collections.abc import Callable

import numpy as np

FRAME_CACHE_BYTES = 64 << 20


class FrameCache:
    """Frames of a split's compressed shards (`shard_tokens[k]` tokens in shard k, `opener(k)` -> its
    `ZstdShard`), decompressed on demand into one reserved range, for windows of T+1 tokens."""

    def __init__(self, shard_tokens, dtype, frame_tokens: int, T: int, opener: Callable, *,
                 max_bytes: int = FRAME_CACHE_BYTES):
        self.dtype, self.F, self.T, self.opener = np.dtype(dtype), int(frame_tokens), int(T), opener
        counts = -(-np.asarray(shard_tokens, dtype=np.int64) // self.F)
        self.frame_base = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)  # shard k: frames [base[k], base[k+1])
        self.total_frames = int(self.frame_base[-1])
        self.frame_bytes = self.F * self.dtype.itemsize
        self.capacity = max(1, int(max_bytes) // self.frame_bytes)
        self.span = (self.F - 1 + self.T) // self.F
        self.shift = self.F.bit_length() - 1 if self.F & (self.F - 1) == 0 else None
        self.resident = np.zeros(self.total_frames, dtype=bool)
        self.ready = np.zeros(self.total_frames, dtype=bool)
        self.count = 0
        self.loaded = 0  # frames decompressed so far (a measure of how often the cache missed)
        self._fifo: deque[int] = deque()
        nbytes = max(self.total_frames * self.frame_bytes, mmap.PAGESIZE)
        flags = mmap.MAP_PRIVATE | getattr(mmap, "MAP_ANONYMOUS", 0x20) | getattr(mmap, "MAP_NORESERVE", 0)
        self._mm = mmap.mmap(-1, nbytes, flags=flags, prot=mmap.PROT_READ | mmap.PROT_WRITE)
        self.flat = np.frombuffer(self._mm, dtype=self.dtype)
        self._release = self.frame_bytes % mmap.PAGESIZE == 0 and hasattr(mmap, "MADV_DONTNEED")

    def ensure(self, v: np.ndarray) -> None:
        """Make the frames of the windows starting at `v` (int64 offsets in the range) resident."""
        if self.count == self.total_frames:
            return
        first = v >> self.shift if self.shift is not None else v // self.F
        if self.ready[first].all():
            return
        self._load(first, (v + self.T) // self.F)

    def _load(self, first: np.ndarray, last: np.ndarray) -> None:
        # NOTE: a batch needing more frames than the bound holds keeps them all until the next batch
        needed = np.unique(np.concatenate([np.minimum(first + j, last) for j in range(self.span + 1)]))
        missing = needed[~self.resident[needed]]
        shards = np.searchsorted(self.frame_base, missing, side="right") - 1
        for k in np.unique(shards).tolist():
            handle = self.opener(k)
            base = int(self.frame_base[k])
            for f in missing[shards == k].tolist():
                data = handle.frame(f - base)
                lo = f * self.F
                self.flat[lo:lo + len(data)] = data
                self.resident[f] = True
                self._fifo.append(f)
        self.count += len(missing)
        self.loaded += len(missing)
        evicted = self._evict(set(needed.tolist())) if self.count > self.capacity else []
        self._refresh(np.concatenate([missing, np.asarray(evicted, dtype=np.int64)]))

    def _evict(self, keep: set[int]) -> list[int]:
        out = []
        rotations = 0
        while self.count > self.capacity and rotations <= len(self._fifo):
            f = self._fifo.popleft()
            if f in keep:
                self._fifo.append(f)
                rotations += 1
                continue
            self.resident[f] = False
            if self._release:
                self._mm.madvise(mmap.MADV_DONTNEED, f * self.frame_bytes, self.frame_bytes)
            self.count -= 1
            out.append(f)
        return out

    def _refresh(self, changed: np.ndarray) -> None:
        """Recompute `ready` for every frame whose windows can reach a frame that came or went."""
        if not len(changed):
            return
        aff = np.unique((changed[:, None] - np.arange(self.span + 1)).ravel())
        aff = aff[aff >= 0]
        shard = np.searchsorted(self.frame_base, aff, side="right") - 1
        end = np.minimum(aff + self.span, self.frame_base[shard + 1] - 1)
        ok = self.resident[aff].copy()
        for j in range(1, self.span + 1):
            ok &= self.resident[np.minimum(aff + j, end)]
        self.ready[aff] = ok
