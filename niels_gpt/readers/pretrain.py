"""Random-window pretraining batches from memory-mapped token shards.

    ds = PretrainTokenStreamDataset("cache/pretrain/fineweb_edu/train", T=1024, device="cuda")
    x, y = ds.get_batch(B=32, generator=g)        # int64 (B, T); y[:, :-1] == x[:, 1:]

- A window is T+1 consecutive tokens inside one shard (never across a shard end): shard k with n_k
  tokens has n_k - T window starts.
- "Random windows within a randomly chosen shard": each row draws one global start uniformly from
  all window starts of all shards, so a shard is chosen with probability proportional to its number
  of window starts and the start is uniform inside it (a small last shard is not oversampled).
- One torch.randint per batch, then ONE gather: the shards are mapped back to back into one address
  range (`open_concatenated`), and the batch is rows of it starting at the drawn offsets. Where the
  optional C kernel is built (niels_gpt/_native/gather.c), it reads each window once and writes int64
  x and y directly; otherwise numpy indexes a zero-copy sliding-window view by the starts (a memcpy
  per row) and casts into x and y (a second pass). Both give byte-identical batches. No Python loop
  per row or per shard (where mmap(MAP_FIXED) is missing: one numpy gather per shard).
- Shards are opened with mmap + MADV_RANDOM (see cache/mmap.py) lazily in each process; pickling the
  dataset (DataLoader workers) sends paths, not memory maps.
- Cold page cache: MADV_RANDOM stops the kernel reading ~128 KiB around every touched page, but the
  B rows of a batch still fault in one after another. When a gather takes longer than COLD_GATHER_S
  (it waited on the disk), the next batches first ask for all their windows at once (MADV_WILLNEED,
  `prefetch_windows`), until a batch finds everything cached again (faster than WARM_GATHER_S).
  A warm cache pays only two clock reads per batch.
- On CUDA, x and y are built in pinned memory and copied with non_blocking=True.
- Compressed shards (`shard_*.bin.zst`, niels_gpt/formats/zstd_shard.py): the same draws, rows of a
  frame cache (readers/frames.py) instead of the mapped shards; only the frames a batch's windows reach
  are decompressed, and batches equal the uncompressed cache's bit for bit.
- A URL (`s3://bucket/cache/train`, see niels_gpt/storage) reads the cache through a local mirror:
  each batch's draws are made first, then the shards they reach are fetched (once, checked against
  meta.json), each mapped, read and let go (`readers.mmap.gather_remote`), so batches and generator
  states equal the local cache's and no map holds the disk of a shard the bound evicted. Where the
  whole split fits the download cache's bound, once every shard is mirrored the generator is rewound
  and the dataset maps them like a local cache (same kernel, same speed).

Cost (2 cores, warm page cache, 1 thread; `bench/bench_cache_readers.py`): see the figure at
`get_batch`.
"""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import torch

from niels_gpt import _native
from niels_gpt.constants import META_NAME
from niels_gpt.errors import CacheError, ConfigError
from niels_gpt.formats.zstd_shard import ZstdShard, frame_tokens_of, is_compressed_meta
from niels_gpt.meta import numpy_dtype, read_meta, unfinished_build
from niels_gpt.readers.checks import count
from niels_gpt.readers.frames import FRAME_CACHE_BYTES, FrameCache
from niels_gpt.readers.mmap import (
    gather_remote,
    open_concatenated,
    open_tokens,
    prefetch_windows,
    window_view,
)
from niels_gpt.readers.shards import split_shards
from niels_gpt.resume import cache_fingerprint
from niels_gpt.storage.remote import open_location, split_url
from niels_gpt.urls import is_url

COLD_GATHER_S = 1e-3  # a gather this slow waited on the disk: prefetch the next batches' windows
WARM_GATHER_S = 2e-4  # a prefetched gather this fast found every page cached: stop prefetching
MAX_OPEN_SHARDS = 64  # compressed shards held open at once (each a map of its file)


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
        self.dtype = numpy_dtype(self.meta["token_dtype"])
        shards = split_shards(self.cache_dir, self.meta, self.split, remote=self.remote is not None)
        listed = dict(shards)
        self.shard_names = [name for name, _ in shards]
        if not self.shard_names:
            raise CacheError(f"{self.shards_dir}: the {self.split} split of this cache is empty "
                             f"(totals: {self.meta['totals']})")
        self.shard_tokens = np.array([listed[n]["tokens"] for n in self.shard_names], dtype=np.int64)
        self.shard_bytes = [int(listed[n]["bytes"]) for n in self.shard_names]  # mapped only at these sizes
        self.shard_frames = [listed[n].get("frames") for n in self.shard_names]
        self.frame_tokens = frame_tokens_of(self.meta, self.cache_dir / META_NAME) if is_compressed_meta(self.meta) \
            else None
        self.frame_cache_bytes = frame_cache_bytes
        starts = np.maximum(self.shard_tokens - T, 0)
        if starts.sum() == 0:
            raise ConfigError(f"T+1 = {T + 1} tokens exceeds every shard in {self.shards_dir} "
                              f"(largest has {int(self.shard_tokens.max())} tokens): use a smaller T")
        self.window_starts = starts
        self.cum_starts = np.concatenate([[0], np.cumsum(starts)])
        self._n_starts = int(self.cum_starts[-1])
        self._views: list[np.ndarray] | None = None
        self._flat: np.ndarray | None = None
        self._fits: bool | None = None  # remote: the whole split fits the download cache's bound
        self._seen: set[str] = set()  # shards known to be mirrored (remote caches whose split fits)
        self._frames: FrameCache | None = None
        self._handles: dict[int, tuple[int, ZstdShard]] = {}
        self._draws: dict[int, tuple[torch.Tensor, np.ndarray]] = {}

    @property
    def num_tokens(self) -> int:
        return int(self.shard_tokens.sum())

    @property
    def vocab_size(self) -> int:
        return int(self.meta["vocab_size"])

    def _open(self) -> list[np.ndarray]:
        """Map the shards (once per process): one concatenated window view, else one per shard."""
        try:
            return self._map()
        except FileNotFoundError as exc:  # checked on open, gone now: a rebuild swapped the cache in between
            raise CacheError(f"{self.shards_dir}: a shard vanished after the cache was opened ({exc.filename}); "
                             "a rebuild replaced it: open the dataset again") from exc

    def _map(self) -> list[np.ndarray]:
        if self._views is None:
            cat = open_concatenated([self.shards_dir / n for n in self.shard_names], self.dtype,
                                    expected_bytes=self.shard_bytes)
            if cat is not None:
                tokens, first = cat
                self._flat = window_view(tokens, self.T + 1)
                self._base = tokens.ctypes.data
                self._cold = False
                self._first = first
                # row of _flat for a global draw g in shard k: first[k] + (g - cum_starts[k])
                self._shift = first - self.cum_starts[:-1]
                self._views = []
                # the kernel takes addresses: int64 arrays that live as long as the mapping
                self._cum64 = np.ascontiguousarray(self.cum_starts, dtype=np.int64)
                self._shift64 = np.ascontiguousarray(self._shift, dtype=np.int64)
                self._rows_args = (self._cum64.ctypes.data, len(self._shift64), self._shift64.ctypes.data)
            else:
                self._flat = None
                self._views = [window_view(open_tokens(self.shards_dir / n, self.dtype, expected_bytes=b), self.T + 1)
                               if s > 0 else None
                               for n, s, b in zip(self.shard_names, self.window_starts, self.shard_bytes, strict=True)]
        return self._views

    def fingerprint(self) -> str:
        """The identity of this data in resume states (niels_gpt.resume.cache_fingerprint)."""
        return cache_fingerprint(self, self.shards_dir, self.meta, self.T)

    def __getstate__(self):
        state = self.__dict__.copy()
        state["_views"] = state["_flat"] = state["_frames"] = None  # each process maps the shards itself
        state["_handles"], state["_draws"] = {}, {}
        return state

    def sample_starts(self, B: int, generator: torch.Generator) -> tuple[np.ndarray, np.ndarray]:
        """(shard index, start within shard) for B random windows."""
        g = torch.randint(self._n_starts, (B,), generator=generator).numpy()
        shard = np.searchsorted(self.cum_starts, g, side="right") - 1
        return shard, g - self.cum_starts[shard]

    def draw_files(self, B: int, generator: torch.Generator) -> list[str]:
        """The shard files (relative to the cache) that get_batch(B, generator) would read, in first-use
        order, drawing exactly as it does: what a prefetcher fetches ahead (loading/prefetch.py)."""
        shard, _ = self.sample_starts(B, generator)
        return [f"{self.split}/{self.shard_names[k]}" for k in dict.fromkeys(shard.tolist())]

    def gather(self, shard: np.ndarray, local: np.ndarray) -> np.ndarray:
        """(B, T+1) windows, in the token dtype, one gather per shard touched."""
        if self.frame_tokens is not None:
            fc = self._frame_cache()
            v = fc.starts(np.asarray(shard), np.asarray(local))
            fc.ensure(v)
            return window_view(fc.flat, self.T + 1)[v]
        views = self._open()
        if self._flat is not None:
            return self._flat[self._first[shard] + local]
        B = len(shard)
        if B and (shard == shard[0]).all():
            return views[int(shard[0])][local]
        out = np.empty((B, self.T + 1), dtype=self.dtype)
        for k in np.unique(shard):
            rows = np.flatnonzero(shard == k)
            out[rows] = views[int(k)][local[rows]]
        return out

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
        if self.frame_tokens is not None:
            return self._compressed_batch(B, generator)
        if self.remote is not None and self._views is None:
            batch = self._remote_batch(B, generator)
            if batch is not None:
                return batch
        self._open()
        if self._flat is None:
            return to_device_xy(self.gather(*self.sample_starts(B, generator)), self.device)
        native = _native.gather
        if native is not None and self.dtype.isnative:
            return self._native_batch(native, B, generator)
        g = torch.randint(self._n_starts, (B,), generator=generator).numpy()
        if len(self._shift) > 1:  # same draws as sample_starts, folded into one row index
            g += self._shift[np.searchsorted(self.cum_starts, g, side="right") - 1]
        if self._cold:
            prefetch_windows(self._base, self.dtype.itemsize, g, self.T + 1)
        t0 = time.perf_counter()
        # NOTE: touching the first token of every window before the gather lets the B cache/TLB
        # misses overlap instead of stalling one memcpy each (32x1024: ~5 us less a batch).
        self._flat[g, 0]
        windows = self._flat[g]
        waited = time.perf_counter() - t0
        self._cold = waited > (WARM_GATHER_S if self._cold else COLD_GATHER_S)
        return to_device_xy(windows, self.device)

    def _remote_batch(self, B: int, generator: "torch.Generator") -> tuple[torch.Tensor, torch.Tensor] | None:
        """The batch read shard by shard from the download cache (each shard fetched, mapped, read and let
        go: `gather_remote`), or None once every shard is mirrored and the whole split fits the cache's
        bound (then the local path runs, from the same generator state, over one map of the split)."""
        state = generator.get_state()
        shard, local = self.sample_starts(B, generator)
        rels = [f"{self.split}/{n}" for n in self.shard_names]
        if self._fits is None:
            marker = self.cache_dir / META_NAME
            self._fits = sum(self.shard_bytes) + (marker.stat().st_size if marker.is_file() else 0) \
                <= self.remote.max_bytes
        if self._fits:
            # NOTE: one stat per shard not yet seen mirrored, not one per shard per batch
            self._seen |= {rels[k] for k in np.unique(shard).tolist()}
            self._seen |= {r for r, s in zip(rels, self.window_starts, strict=True)
                           if s > 0 and r not in self._seen and self.remote.has(r)}
            if all(r in self._seen for r, s in zip(rels, self.window_starts, strict=True) if s > 0):
                for r in rels:  # shards too short for a window are mapped too, never drawn
                    self.remote.fetch(r, keep=set(rels))
                generator.set_state(state)
                return None
        out = gather_remote(self.remote, rels, self.dtype, self.shard_bytes, shard, local, self.T + 1)
        return to_device_xy(out, self.device)

    def _frame_cache(self) -> FrameCache:
        if self._frames is None:
            self._frames = FrameCache(self.shard_tokens, self.dtype, self.frame_tokens, self.T, self._zstd_shard,
                                      max_bytes=self.frame_cache_bytes)
            # draw g in shard k -> its window's offset in the frame cache's range: g + shift[k]
            self._vshift = np.ascontiguousarray(self._frames.frame_base[:-1] * self.frame_tokens - self.cum_starts[:-1],
                                                dtype=np.int64)
            self._cum64 = np.ascontiguousarray(self.cum_starts, dtype=np.int64)
            # NOTE: addresses taken once: ndarray.ctypes builds an object per call (~1 us each)
            self._vrows_args = (self._cum64.ctypes.data, len(self._vshift), self._vshift.ctypes.data)
        return self._frames

    def _zstd_shard(self, k: int) -> ZstdShard:
        """Shard k's reader. A remote shard is fetched (again, if it was evicted) and opened for the one
        frame load that asks for it, then let go: no map of an evicted file outlives the batch."""
        name = self.shard_names[k]
        if self.remote is not None:
            return ZstdShard(self.remote.fetch(f"{self.split}/{name}"), self.dtype, tokens=int(self.shard_tokens[k]),
                             frame_tokens=self.frame_tokens, expected_bytes=self.shard_bytes[k],
                             frames=self.shard_frames[k])
        held = self._handles.get(k)
        if held is None:
            if len(self._handles) >= MAX_OPEN_SHARDS:  # let the oldest go
                del self._handles[next(iter(self._handles))]
            held = self._handles[k] = (None, ZstdShard(self.shards_dir / name, self.dtype,
                                                       tokens=int(self.shard_tokens[k]), frame_tokens=self.frame_tokens,
                                                       expected_bytes=self.shard_bytes[k], frames=self.shard_frames[k]))
        return held[1]

    def _compressed_batch(self, B: int, generator: "torch.Generator") -> tuple[torch.Tensor, torch.Tensor]:
        """get_batch over compressed shards: the same draws, rows of the frame cache's range."""
        fc = self._frame_cache()
        if B not in self._draws:  # NOTE: randint(out=) into a numpy-backed tensor: no .numpy() per batch (~2 us)
            t = torch.empty(B, dtype=torch.int64)
            self._draws[B] = (t, t.numpy())
        t, v = self._draws[B]
        torch.randint(self._n_starts, (B,), generator=generator, out=t)
        native = _native.gather
        if native is not None and self.dtype.isnative:
            rows = t.data_ptr()
            cum, K, shift = self._vrows_args
            if K > 1:
                native.draws_to_rows(rows, B, cum, K, shift)
            fc.ensure(v)
            x, y, xy = _host_xy(B, self.T, self.device)
            native.gather_xy(fc.base, self.dtype.itemsize, rows, B, self.T, x.data_ptr())
            return _to_device(x, y, xy, self.device)
        v += self._vshift[np.searchsorted(self.cum_starts, v, side="right") - 1]
        fc.ensure(v)
        return to_device_xy(window_view(fc.flat, self.T + 1)[v], self.device)

    def _native_batch(self, native, B: int, generator: "torch.Generator") -> tuple[torch.Tensor, torch.Tensor]:
        """get_batch through the C kernel: the same draws and rows as the numpy path, one pass."""
        T = self.T
        g = torch.randint(self._n_starts, (B,), generator=generator)
        rows = g.data_ptr()
        cum, K, shift = self._rows_args
        if K > 1:
            native.draws_to_rows(rows, B, cum, K, shift)  # in place: g += shift[shard of g]
        if self._cold:
            prefetch_windows(self._base, self.dtype.itemsize, g.numpy(), T + 1)
        x, y, xy = _host_xy(B, T, self.device)
        t0 = time.perf_counter()
        native.gather_xy(self._base, self.dtype.itemsize, rows, B, T, x.data_ptr())  # y follows x
        waited = time.perf_counter() - t0
        self._cold = waited > (WARM_GATHER_S if self._cold else COLD_GATHER_S)
        return _to_device(x, y, xy, self.device)


def rows_xy(tokens: np.ndarray, base: int, rows: np.ndarray, T: int,
            dtype: np.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """CPU int64 x, y (B, T) of the windows of T+1 tokens starting at token offsets `rows` (int64) of
    `tokens` (a map from open_concatenated or a frame cache's range; `base`: the address of its token 0):
    the C kernel's one pass where it is built, else numpy's gather then cast. Byte-identical either way."""
    native = _native.gather
    rows = np.ascontiguousarray(rows, dtype=np.int64)
    if native is None or not dtype.isnative:
        return to_device_xy(window_view(tokens, T + 1)[rows], _CPU)
    B = len(rows)
    x, y, _ = _host_xy(B, T, _CPU)
    native.gather_xy(base, dtype.itemsize, rows.ctypes.data, B, T, x.data_ptr())  # y follows x
    return x, y


_CPU = torch.device("cpu")


def to_device_xy(windows: np.ndarray, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """(B, T+1) token windows -> contiguous int64 x = w[:, :-1], y = w[:, 1:] on `device`."""
    B, W = windows.shape
    x, y, xy = _host_xy(B, W - 1, device)
    # NOTE: numpy's copyto beat torch's copy_ here once the call overheads are counted (44 vs 48 us a batch).
    np.copyto(x.numpy(), windows[:, :-1], casting="unsafe")
    np.copyto(y.numpy(), windows[:, 1:], casting="unsafe")
    return _to_device(x, y, xy, device)


def _host_xy(B: int, T: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """Uninitialised int64 (B, T) host tensors x and y, the two halves of one (2, B, T) buffer (y's
    first element right after x's last), and that buffer when it still has to go to `device`."""
    if device.type == "cpu":
        # NOTE: a numpy buffer, not torch.empty: torch's allocator hands back fresh pages for 512 KiB
        # each batch (~10 us of page faults at 32x1024). Two from_numpy views cost ~1.8 us, one
        # from_numpy and xy[0], xy[1] ~4 us.
        buf = np.empty((2, B, T), dtype=np.int64)
        return torch.from_numpy(buf[0]), torch.from_numpy(buf[1]), None
    # pinned when bound for CUDA (torch caches pinned blocks), so the copy can be non_blocking
    xy = torch.empty((2, B, T), dtype=torch.int64, pin_memory=device.type == "cuda")
    return xy[0], xy[1], xy


def _to_device(x: torch.Tensor, y: torch.Tensor, xy: torch.Tensor | None,
               device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    if xy is None:
        return x, y
    xy = xy.to(device, non_blocking=device.type == "cuda")
    return xy[0], xy[1]
