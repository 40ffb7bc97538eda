"""One split of a pretraining cache as one range of tokens: what both window readers sample from.

Window i (numbered across the split's shards) is T+1 tokens of one shard starting every `stride` tokens (1:
readers/pretrain.py, T: loading/windows.py); shard k with n_k > T tokens holds (n_k - 1 - T) // stride + 1.

    Worked example: shards of 10 and 7 tokens, T=3. stride 1: 7 and 4 windows, cum [0, 7, 11];
    window 8 -> shard 1, tokens [1:5]. stride 3: 3 and 2 windows, cum [0, 3, 5]; window 4 ->
    shard 1, tokens [3:7].

Local shards are mapped back to back (readers/mmap.py), compressed ones decompressed into a frame cache laid
out the same way (readers/frames.py), remote ones fetched, read and let go a batch at a time. A batch is ONE
fused gather and cast into int64 x and y (the C kernel; numpy where it is not built).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from niels_gpt import _native
from niels_gpt.constants import META_NAME
from niels_gpt.errors import CacheError, ConfigError
from niels_gpt.formats.zstd_shard import ZstdShard, frame_tokens_of, is_compressed_meta
from niels_gpt.meta import numpy_dtype, read_meta, unfinished_build
from niels_gpt.readers.frames import FRAME_CACHE_BYTES, FrameCache
from niels_gpt.readers.mmap import open_concatenated, open_tokens, prefetch_windows, window_view
from niels_gpt.readers.shards import split_shards

if TYPE_CHECKING:
    import torch

COLD_GATHER_S = 1e-3  # a gather this slow waited on the disk: prefetch the next batches' windows
WARM_GATHER_S = 2e-4  # a prefetched gather this fast found every page cached: stop prefetching
MAX_OPEN_SHARDS = 64  # local compressed shards held open at once (each a map of its file)
_MAPS = {"range", "flat", "base", "first", "_shift", "_kernel", "frames", "views", "_handles"}  # per process


def open_split(cache_dir: Path, split: str, T: int, stride: int, *, remote=None,
               frame_cache_bytes: int = FRAME_CACHE_BYTES) -> tuple[dict, WindowCore]:
    """(meta.json, the window core) of `split` of the built pretraining cache at `cache_dir` (a remote cache's
    local mirror, with `remote`), refused when the split is empty or holds no window of T+1 tokens."""
    if remote is None and not cache_dir.is_dir():
        raise CacheError(unfinished_build(cache_dir) or f"{cache_dir / split}: no such shard directory")
    if remote is None and not (cache_dir / META_NAME).is_file():  # a cache given for a split, or the reverse
        if (cache_dir / split / META_NAME).is_file():
            raise ConfigError(f"{cache_dir / split}: a cache (it holds {META_NAME}), not one of its splits: pass a split "
                              f"directory, e.g. {cache_dir / split / 'train'}")
        if (cache_dir.parent / META_NAME).is_file():
            raise ConfigError(f"{cache_dir}: a split directory of the cache {cache_dir.parent}: pass the cache, "
                              f"{cache_dir.parent} (with split={cache_dir.name!r})")
    meta = read_meta(str(cache_dir))
    if meta.get("kind") != "pretrain" or not meta.get("built", True):
        raise CacheError(f"{cache_dir}: not a built pretraining cache (kind={meta.get('kind')!r}, "
                         f"built={meta.get('built')!r})")
    shards = split_shards(cache_dir, meta, split, remote=remote is not None)
    if not shards:
        raise CacheError(f"{cache_dir}: {META_NAME} lists no {split} shards: the {split} split is empty "
                         f"(totals: {meta.get('totals')}); build the cache with a {split} split")
    core = WindowCore(cache_dir / split, meta, shards, T, stride, remote=remote,
                      frame_cache_bytes=frame_cache_bytes)
    if core.n == 0:
        raise ConfigError(f"T+1 = {T + 1} tokens exceeds every shard in {cache_dir / split} "
                          f"(largest has {int(core.tokens.max())} tokens): use a smaller T")
    return meta, core


class WindowCore:
    """The windows of T+1 tokens at `stride` of `shards` ([(file name, record)] from `split_shards`) of
    `directory` (`<cache>/<split>`, or a remote cache's local mirror of it)."""

    def __init__(self, directory: Path, meta: dict, shards: list[tuple[str, dict]], T: int, stride: int, *,
                 remote=None, frame_cache_bytes: int = FRAME_CACHE_BYTES):
        self.directory, self.T, self.stride, self.remote = Path(directory), int(T), int(stride), remote
        self.dtype = numpy_dtype(meta["token_dtype"])
        self.frame_tokens = frame_tokens_of(meta, self.directory.parent / META_NAME) if is_compressed_meta(meta) \
            else None
        self.frame_cache_bytes = frame_cache_bytes
        self.names = [name for name, _ in shards]
        self.rels = [f"{self.directory.name}/{name}" for name in self.names]  # as meta.json and a remote name them
        self.paths = [self.directory / name for name in self.names]
        self.bytes = [int(rec["bytes"]) for _, rec in shards]  # mapped only at these sizes
        self.frames_of = [rec.get("frames") for _, rec in shards]
        self.tokens = np.array([rec["tokens"] if "tokens" in rec else rec["bytes"] // self.dtype.itemsize
                                for _, rec in shards], dtype=np.int64)
        self.counts = np.where(self.tokens > T, (self.tokens - 1 - T) // self.stride + 1, 0)
        self.cum = np.concatenate([[0], np.cumsum(self.counts)]).astype(np.int64)
        self.n = int(self.cum[-1])
        self.cold = False
        self._fits: bool | None = None  # remote: the whole split fits the download cache's bound
        self._seen: set[str] = set()  # shards known to be mirrored (remote splits that fit)
        self._forget()

    def _forget(self) -> None:
        """Drop every map (a new process maps the shards itself)."""
        self.range: np.ndarray | None = None  # the split's tokens in one range: mapped back to back, or frames
        self.flat: np.ndarray | None = None  # every window of that range (a strided view)
        self.base = self.first = self._shift = self._kernel = None  # its address, where each shard starts
        self.frames: FrameCache | None = None
        self.views: list | None = None  # one window view per shard, where one range is not available
        self._handles: dict[int, ZstdShard] = {}

    def __getstate__(self):
        return {k: v for k, v in self.__dict__.items() if k not in _MAPS}

    def __setstate__(self, state):
        self.__dict__.update(state)
        self._forget()

    def locate(self, i: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Windows `i` (global numbers) -> (shard, token offset of the window in that shard)."""
        shard = np.searchsorted(self.cum, i, side="right") - 1
        return shard, (i - self.cum[shard]) * self.stride

    def files(self, shard) -> list[str]:
        """The files (relative to the cache) of shards `shard`, in first-use order: what a prefetcher fetches."""
        return [self.rels[k] for k in dict.fromkeys(np.asarray(shard).tolist())]

    def open(self) -> None:
        """Map the local shards (once per process): one range where the platform allows, else one map each."""
        if self.range is not None or self.views is not None:
            return
        try:
            cat = open_concatenated(self.paths, self.dtype, expected_bytes=self.bytes)
        except FileNotFoundError as exc:  # checked on open, gone now: a rebuild swapped the cache in between
            raise CacheError(f"{self.directory}: a shard vanished after the cache was opened ({exc.filename}); "
                             "a rebuild replaced it: open the dataset again") from exc
        if cat is None:
            self.views = [None] * len(self.paths)
        else:
            self._use_range(*cat)

    def _use_range(self, tokens: np.ndarray, first: np.ndarray) -> None:
        """Read windows from `tokens`, where shard k starts at token first[k]."""
        self.range, self.base, self.first = tokens, tokens.ctypes.data, np.asarray(first, dtype=np.int64)
        self.flat = window_view(tokens, self.T + 1)
        # window i of shard k starts at row i*stride + shift[k]; the kernel takes addresses of arrays that
        # live as long as the range (NOTE: taken once: ndarray.ctypes builds an object per call, ~1 us)
        self._shift = np.ascontiguousarray(self.first - self.cum[:-1] * self.stride, dtype=np.int64)
        cum = np.ascontiguousarray(self.cum * self.stride, dtype=np.int64)
        self._kernel = (cum, cum.ctypes.data, len(self._shift), self._shift.ctypes.data)

    def _zstd_shard(self, k: int) -> ZstdShard:
        """Shard k's reader. A remote shard is fetched (again, if it was evicted) and opened for the one
        frame load that asks for it, then let go: no map of an evicted file outlives the batch."""
        if self.remote is not None:
            return self._open_zstd(k, self.remote.fetch(self.rels[k]))
        if k not in self._handles:
            if len(self._handles) >= MAX_OPEN_SHARDS:  # let the oldest go
                del self._handles[next(iter(self._handles))]
            self._handles[k] = self._open_zstd(k, self.paths[k])
        return self._handles[k]

    def _open_zstd(self, k: int, path: Path) -> ZstdShard:
        return ZstdShard(path, self.dtype, tokens=int(self.tokens[k]), frame_tokens=self.frame_tokens,
                         expected_bytes=self.bytes[k], frames=self.frames_of[k])

    def _one_range(self, shard: np.ndarray) -> bool:
        """Whether one range serves the windows of `shard` (mapping it when it can): a compressed split, a
        local one where open_concatenated works, a remote one mirrored whole (see _mirrored_whole)."""
        if self.range is not None:
            return True
        if self.frame_tokens is not None:  # the frame cache's range
            self.frames = FrameCache(self.tokens, self.dtype, self.frame_tokens, self.T, self._zstd_shard,
                                     max_bytes=self.frame_cache_bytes)
            self._use_range(self.frames.flat, self.frames.frame_base[:-1] * self.frame_tokens)
            return True
        if self.remote is not None and not self._mirrored_whole(shard):
            return False
        self.open()
        return self.range is not None

    def _mirrored_whole(self, shard: np.ndarray) -> bool:
        """A remote split that fits the download cache's bound, every shard of it mirrored (or drawn now):
        fetched whole, so it can be mapped like a local one."""
        if self._fits is None:
            marker = self.directory.parent / META_NAME
            self._fits = sum(self.bytes) + (marker.stat().st_size if marker.is_file() else 0) <= self.remote.max_bytes
        if not self._fits:
            return False
        drawable = [r for r, c in zip(self.rels, self.counts, strict=True) if c > 0]
        # NOTE: one stat per shard not yet seen mirrored, not one per shard per batch
        self._seen |= {self.rels[k] for k in np.unique(shard).tolist()}
        self._seen |= {r for r in drawable if r not in self._seen and self.remote.has(r)}
        if not all(r in self._seen for r in drawable):
            return False
        for r in self.rels:  # shards too short for a window are mapped too, never drawn
            self.remote.fetch(r, keep=set(self.rels))
        return True

    def gather(self, shard: np.ndarray, local: np.ndarray) -> np.ndarray:
        """(B, T+1) windows in the token dtype, row j the T+1 tokens at `local[j]` of shard `shard[j]`."""
        shard, local = np.asarray(shard), np.asarray(local)
        if not self._one_range(shard):
            return self._gather_apart(shard, local)
        rows = self.first[shard] + local
        if self.frames is not None:
            self.frames.ensure(rows)
        return self.flat[rows]

    def _gather_apart(self, shard: np.ndarray, local: np.ndarray) -> np.ndarray:
        """`gather` without one range: one local map per shard, or remote shards one by one, each fetched,
        mapped, read and let go before the next: no map outlives the call, so an evicted shard frees its disk.
        Remote files already mirrored are read first, and the batch's files not read yet are kept while one
        downloads."""
        out = np.empty((len(shard), self.T + 1), dtype=self.dtype)
        ks = list(dict.fromkeys(shard.tolist()))
        if self.remote is not None:
            ks.sort(key=lambda k: not self.remote.has(self.rels[k]))
        unread = {self.rels[k] for k in ks}
        for k in ks:
            if self.remote is None:
                if self.views[k] is None:  # every window of local shard k, a view built once per process
                    self.views[k] = window_view(self.shard(k), self.T + 1)
                view = self.views[k]
            else:
                path = self.remote.fetch(self.rels[k], keep=unread)
                view = window_view(open_tokens(path, self.dtype, expected_bytes=self.bytes[k]), self.T + 1)
            rows = np.flatnonzero(shard == k)
            out[rows] = view[local[rows]]
            unread.discard(self.rels[k])
        return out

    def shard(self, k: int) -> np.ndarray:
        """Every token of local raw shard k, mapped."""
        return open_tokens(self.paths[k], self.dtype, expected_bytes=self.bytes[k])

    def batch(self, i: torch.Tensor, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        """x, y (B, T) int64 on `device` of windows `i` (a contiguous int64 CPU tensor, overwritten: it
        becomes the windows' rows of the range)."""
        v = i.numpy()
        if self.range is None:
            shard, local = self.locate(v)
            if not self._one_range(shard):
                return to_device_xy(self._gather_apart(shard, local), device)
        B, T = len(v), self.T
        native = _native.gather if self.dtype.isnative else None
        cum, cum_addr, K, shift_addr = self._kernel
        if self.stride > 1:
            v *= self.stride
        if native is not None and K > 1:
            native.draws_to_rows(i.data_ptr(), B, cum_addr, K, shift_addr)  # in place: v += shift[shard of v]
        elif K > 1:
            v += self._shift[np.searchsorted(cum, v, side="right") - 1]
        if self.frames is not None:
            self.frames.ensure(v)
        elif self.cold:
            prefetch_windows(self.base, self.dtype.itemsize, v, T + 1)
        t0 = time.perf_counter()
        if native is not None:
            x, y, xy = _host_xy(B, T, device)
            native.gather_xy(self.base, self.dtype.itemsize, i.data_ptr(), B, T, x.data_ptr())  # y follows x
        else:
            # NOTE: touching the first token of every window before the gather lets the B cache/TLB
            # misses overlap instead of stalling one memcpy each (32x1024: ~5 us less a batch).
            self.flat[v, 0]
            windows = self.flat[v]
        if self.frames is None:
            waited = time.perf_counter() - t0
            self.cold = waited > (WARM_GATHER_S if self.cold else COLD_GATHER_S)
        return _to_device(x, y, xy, device) if native is not None else to_device_xy(windows, device)


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
    import torch  # NOTE: here (~0.3 us a batch): `inspect` reads windows without importing torch (~1 s)

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
